// `flash4 run` (see run.h).
#include "run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "device_memory.h"
#include "flops.h"
#include "memory_budget.h"
#include "flash4/api.h"
#include "reference/reference.h"

namespace flash4_cli {
namespace {

using flash4::Device;
using flash4::DType;
using flash4::TensorView;

// out's dtype: q's, or bf16 for an FP8 run.
DType output_dtype(DType input) { return input == DType::kFloat8E4M3 ? DType::kBFloat16 : input; }

// Warm-up runs longer than this get per-iteration progress on stderr.
constexpr double kProgressAfterMs = 1000.0;

// One tensor of the run: the host copy and, for CUDA, the device copy that flash4 sees. Described first (null
// data) so that the arguments are validated and the memory estimated before anything is allocated.
struct Tensor {
  std::vector<unsigned char> host;
  DeviceBuffer device;
  TensorView view;  // points at `device` on CUDA, at `host` on the CPU; null until allocate()

  Tensor(DType dtype, Device where, int rank, const int64_t* shape)
      : view(rank == 4 ? flash4::make_view(nullptr, dtype, where, shape[0], shape[1], shape[2], shape[3])
                       : flash4::make_view(nullptr, dtype, where, shape[0], shape[1], shape[2])) {}
  bool on_device() const { return view.device.kind == flash4::DeviceKind::kCuda; }
  void allocate() {
    host.resize(static_cast<size_t>(view.numel() * flash4::dtype_size(view.dtype)));
    if (on_device()) device = DeviceBuffer(host.size());
    view.data = on_device() ? device.data() : static_cast<void*>(host.data());
  }
  void upload() {
    if (on_device()) copy_to_device(device.data(), host.data(), host.size());
  }
  TensorView host_view() {
    TensorView h = view;
    h.data = host.data();
    h.device = Device::cpu();
    return h;
  }
  std::vector<double> download() {
    if (on_device()) copy_to_host(host.data(), device.data(), host.size());
    return flash4::reference::to_double(host_view());
  }
};

// Chunked so the fp64 staging buffer stays small next to the tensors of a large run.
void fill_normal(Tensor& t, std::mt19937_64& rng) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::normal_distribution<float> normal;
  const int64_t n = t.view.numel(), element = flash4::dtype_size(t.view.dtype);
  std::vector<double> values;
  for (int64_t start = 0; start < n; start += kChunk) {
    values.resize(static_cast<size_t>(std::min(kChunk, n - start)));
    for (double& x : values) x = normal(rng);
    const flash4::TensorView chunk = flash4::make_view(t.host.data() + start * element, t.view.dtype, Device::cpu(),
                                                       1, 1, 1, static_cast<int64_t>(values.size()));
    flash4::reference::from_double(values, chunk);  // rounds to the dtype, nearest even
  }
  t.upload();
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::string describe(const RunOptions& o, Device device) {
  const std::string dtype = o.dtype == DType::kFloat8E4M3 ? "fp8 (out bf16)" : flash4::dtype_name(o.dtype);
  std::string s = std::string("flash4 ") + flash4::version() + "  " + (o.backward ? "backward" : "forward") + "  " +
                  flash4::device_name(device) + "  " + dtype +
                  "  batch " + std::to_string(o.batch) + "  seqlen_q " + std::to_string(o.seqlen_q) + "  seqlen_k " +
                  std::to_string(o.seqlen_k) + "  heads " + std::to_string(o.heads) + "/" +
                  std::to_string(o.heads_kv) + "  head_dim " + std::to_string(o.head_dim);
  if (o.causal) s += "  causal";
  if (o.window_left != -1 || o.window_right != -1)
    s += "  window " + std::to_string(o.window_left) + "," + std::to_string(o.window_right);
  if (o.softcap != 0.0f) {
    char cap[32];
    std::snprintf(cap, sizeof(cap), "  softcap %g", o.softcap);
    s += cap;
  }
  if (!o.backward) {
    if (o.exp2 == flash4::Exp2Mode::kExact) s += "  exp2 exact";
    if (o.exp2 == flash4::Exp2Mode::kPolynomial) s += "  exp2 poly";
    if (!o.conditional_rescale) s += "  always-rescale";
  }
  return s;
}

}  // namespace

int run_attention(const RunOptions& o) {
  const bool cuda_ok = flash4::cuda_available(0);
  if (o.device == "cuda" && !cuda_ok) {
    std::fprintf(stderr, "flash4: error: --device cuda, but no supported CUDA GPU (sm_90) is usable%s\n",
                 "; try --device cpu");
    return 2;
  }
  const Device device = (o.device == "cuda" || (o.device == "auto" && cuda_ok)) ? Device::cuda(0) : Device::cpu();

  const int64_t q_shape[4] = {o.batch, o.seqlen_q, o.heads, o.head_dim};
  const int64_t kv_shape[4] = {o.batch, o.seqlen_k, o.heads_kv, o.head_dim};
  const int64_t lse_shape[3] = {o.batch, o.heads, o.seqlen_q};
  const int64_t none[4] = {0, 0, 0, 0};
  Tensor q(o.dtype, device, 4, q_shape), k(o.dtype, device, 4, kv_shape), v(o.dtype, device, 4, kv_shape);
  Tensor out(output_dtype(o.dtype), device, 4, q_shape), lse(DType::kFloat32, device, 3, lse_shape);
  Tensor dout(o.dtype, device, 4, o.backward ? q_shape : none);
  Tensor dq(o.dtype, device, 4, o.backward ? q_shape : none), dk(o.dtype, device, 4, o.backward ? kv_shape : none),
      dv(o.dtype, device, 4, o.backward ? kv_shape : none);

  flash4::ForwardArgs fwd;
  fwd.causal = o.causal;
  fwd.window_left = o.window_left;
  fwd.window_right = o.window_right;
  fwd.softcap = o.softcap;
  fwd.tuning.exp2 = o.exp2;
  fwd.tuning.conditional_rescale = o.conditional_rescale;
  flash4::BackwardArgs bwd;
  bwd.causal = o.causal;
  bwd.window_left = o.window_left;
  bwd.window_right = o.window_right;
  bwd.softcap = o.softcap;
  // The views in the arguments, again after allocation gave them their data.
  const auto set_views = [&] {
    fwd.q = q.view;
    fwd.k = k.view;
    fwd.v = v.view;
    fwd.out = out.view;
    fwd.lse = lse.view;
    if (!o.backward) return;
    bwd.dout = dout.view;
    bwd.q = q.view;
    bwd.k = k.view;
    bwd.v = v.view;
    bwd.out = out.view;
    bwd.lse = lse.view;
    bwd.dq = dq.view;
    bwd.dk = dk.view;
    bwd.dv = dv.view;
  };
  set_views();

  // Validation errors surface here (can_implement throws on bad arguments), before any memory is allocated.
  using flash4::Validation;
  flash4::Support support = flash4::can_implement(fwd, Validation::kWithoutBuffers);  // the backward needs out, lse
  if (support.ok && o.backward) support = flash4::can_implement(bwd, Validation::kWithoutBuffers);
  if (!support.ok) {
    std::fprintf(stderr, "flash4: not supported on %s: %s\n", flash4::device_name(device).c_str(),
                 support.reason.c_str());
    return 2;
  }
  if (o.check && o.backward) {
    if (const std::string refusal = backward_check_refusal(bwd); !refusal.empty()) {
      std::fprintf(stderr, "flash4: error: %s; drop --check or use smaller sizes\n", refusal.c_str());
      return 2;
    }
  }
  const bool on_cuda = device.kind == flash4::DeviceKind::kCuda;
  const MemoryNeed need = estimate_memory(o, on_cuda);
  const double host_available = host_memory_available();
  if (host_available >= 0 && need.host_bytes > host_available) {
    std::fprintf(stderr,
                 "flash4: error: this run needs about %s of host memory%s but %s are available; use smaller sizes\n",
                 format_bytes(need.host_bytes).c_str(), o.check ? " (with --check's fp64 copies)" : "",
                 format_bytes(host_available).c_str());
    return 2;
  }
  if (on_cuda) {
    const double device_free = static_cast<double>(device_memory_free());
    if (need.device_bytes > device_free) {
      std::fprintf(stderr,
                   "flash4: error: this run needs about %s of memory on %s but %s are free; use smaller sizes\n",
                   format_bytes(need.device_bytes).c_str(), flash4::device_name(device).c_str(),
                   format_bytes(device_free).c_str());
      return 2;
    }
  }
  for (Tensor* t : {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}) t->allocate();
  set_views();
  std::printf("%s\n", describe(o, device).c_str());
  std::fflush(stdout);

  std::mt19937_64 rng(o.seed);
  for (Tensor* t : {&q, &k, &v, &dout}) fill_normal(*t, rng);
  if (o.backward) flash4::forward(fwd);  // out and lse feed the backward

  const std::function<void()> step = [&] { o.backward ? flash4::backward(bwd) : flash4::forward(fwd); };
  auto timed = [&]() -> double {
    if (device.kind == flash4::DeviceKind::kCuda) return time_on_device(step);
    const auto start = std::chrono::steady_clock::now();
    step();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };

  const double warmup_ms = timed();
  const bool progress = warmup_ms > kProgressAfterMs;
  const bool tty = isatty(STDERR_FILENO);
  std::vector<double> ms;
  for (int i = 0; i < o.iters; ++i) {
    if (progress) std::fprintf(stderr, tty ? "\riter %d/%d" : "iter %d/%d\n", i + 1, o.iters);
    ms.push_back(timed());
  }
  if (progress && tty) std::fprintf(stderr, "\r\033[K");

  const double med = median(ms);
  const double flops = attention_flops(fwd, o.backward);
  std::printf("time     median %.3f ms  (min %.3f, max %.3f; %d iters after 1 warm-up)\n", med,
              *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()), o.iters);
  std::printf("speed    %.4g TFLOP/s  (%.4g GFLOP/s, %.4g GFLOP per run%s)\n", flops / med * 1e-9,
              flops / med * 1e-6, flops * 1e-9, o.window_left >= 0 || o.window_right >= 0 ? ", window pairs only" : "");
  std::fflush(stdout);
  if (!o.check) return 0;

  HostResults r;
  r.q = q.download();
  r.k = k.download();
  r.v = v.download();
  r.out = out.download();
  r.lse = lse.download();
  bool pass;
  if (o.backward) {
    r.dout = dout.download();
    r.dq = dq.download();
    r.dk = dk.download();
    r.dv = dv.download();
    pass = check_backward(bwd, r);
  } else {
    pass = check_forward(fwd, r);
  }
  std::printf("result   %s\n", pass ? "PASS" : "FAIL");  // a check that could not run was refused before the run
  return pass ? 0 : 1;
}

}  // namespace flash4_cli
