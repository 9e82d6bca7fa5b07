// Memory estimate and the host's available memory for `flash4 run` (see memory_budget.h).
#include "memory_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

namespace flash4_cli {
namespace {

constexpr double kFp64 = 8.0, kFp32 = 4.0;
// fill_normal's fp64 staging chunk and the CPU path's per-thread tiles: small, counted once.
constexpr double kFixedHostBytes = 64.0 * (1 << 20);

// Current size of this process from /proc/self/statm: (virtual, data) in bytes; zeros when unreadable.
std::pair<double, double> process_size() {
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0, shared = 0, text = 0, lib = 0, data = 0;
  if (!(statm >> size >> resident >> shared >> text >> lib >> data)) return {0.0, 0.0};
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  return {size * page, data * page};
}

// What the soft limit `resource` leaves beyond `used`; a negative value when there is no limit.
double left_under_limit(int resource, double used) {
  rlimit limit{};
  if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1.0;
  return std::max(0.0, static_cast<double>(limit.rlim_cur) - used);
}

}  // namespace

MemoryNeed estimate_memory(const RunOptions& o, bool on_cuda) {
  const double b = static_cast<double>(o.batch), h = static_cast<double>(o.heads), d = static_cast<double>(o.head_dim);
  const double q = b * static_cast<double>(o.seqlen_q) * h * d;  // elements of q (and out, dout, dq)
  const double kv = b * static_cast<double>(o.seqlen_k) * static_cast<double>(o.heads_kv) * d;  // of k (v, dk, dv)
  const double rows = b * h * static_cast<double>(o.seqlen_q);  // lse elements
  // 4-D tensors, lse aside: q, k, v, out; the backward's dout, dq, dk, dv too.
  const double elements = o.backward ? 4 * q + 4 * kv : 2 * q + 2 * kv;
  // FP8 writes a bf16 out (one byte more per q element), and the GPU copies v transposed.
  const bool fp8 = o.dtype == flash4::DType::kFloat8E4M3;
  const double tensors = elements * flash4::dtype_size(o.dtype) + (fp8 ? q : 0.0) + rows * kFp32;

  MemoryNeed need;
  need.host_bytes = tensors + kFixedHostBytes;
  if (!on_cuda && o.backward) need.host_bytes += 2 * rows * kFp32;  // the CPU backward's per-row statistics
  if (o.check) {
    // Every tensor downloaded as fp64, then the reference's and the naive baseline's results (an upper bound:
    // sampled and reduced checks compute fewer).
    const double results = o.backward ? q + 2 * kv : q + rows;
    need.host_bytes += (elements + rows) * kFp64 + 2 * results * kFp64;
    // The naive baseline's inputs rounded to the dtype, in fp64: q, k, v (and out, dout for the backward).
    need.host_bytes += (o.backward ? 3 * q + 2 * kv : q + 2 * kv) * kFp64;
  }
  if (on_cuda) {
    need.device_bytes = tensors + (fp8 ? kv : 0.0);
    if (o.backward) need.device_bytes += q * kFp32 + 2 * rows * kFp32;  // fp32 dQ accumulator, D and LSE*log2(e)
  }
  return need;
}

double host_memory_available() {
  double available = -1.0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      available = kib * 1024.0;
      break;
    }
  }
  if (available < 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = static_cast<double>(pages) * static_cast<double>(page);
  }
  const auto [virtual_size, data_size] = process_size();
  for (const double left : {left_under_limit(RLIMIT_AS, virtual_size), left_under_limit(RLIMIT_DATA, data_size)}) {
    if (left >= 0) available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char text[48];
  std::snprintf(text, sizeof(text), "%.3g %s", bytes, units[u]);
  return text;
}

}  // namespace flash4_cli
