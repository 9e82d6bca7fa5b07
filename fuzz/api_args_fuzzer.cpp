// libFuzzer target for the API's argument validation (fuzz/README.md). Each input describes a ForwardArgs or
// BackwardArgs: shapes, strides, dtypes and devices (invalid enum values too), data pointers into one arena
// (aliasing often), null or wild, and scalars including NaN, infinities and huge values. Properties:
//   - can_implement and forward/backward either accept or throw flash4::Error(kInvalidArgument) whose message
//     starts with the entry point's name; any other exception, a crash or a sanitizer report is a finding;
//   - a call that throws leaves the arena untouched (nothing written to the outputs);
//   - a call that runs (CPU tensors inside the arena) writes nothing outside its outputs' byte ranges.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "flash4/api.h"

namespace {

constexpr size_t kArenaBytes = size_t{1} << 15;
alignas(64) unsigned char g_arena[kArenaBytes];
alignas(64) unsigned char g_before[kArenaBytes];
alignas(64) unsigned char g_pattern[kArenaBytes];  // the arena's contents at the start of every input
// Problems with more multiply-adds than this are validated but not run, to keep executions fast.
constexpr double kMaxRunWork = 1 << 20;

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

int64_t pick_size(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return std::numeric_limits<int64_t>::max();
    case 1: return std::numeric_limits<int64_t>::min();
    case 2: return -1;
    case 3: return in.ConsumeIntegral<int64_t>();
    case 4: return int64_t{1} << in.ConsumeIntegralInRange<int>(30, 62);
    default: return in.ConsumeIntegralInRange<int64_t>(0, 9);
  }
}

float pick_scalar(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return std::numeric_limits<float>::infinity();
    case 2: return -std::numeric_limits<float>::infinity();
    case 3: return std::numeric_limits<float>::max();
    case 4: return std::numeric_limits<float>::denorm_min();
    case 5: return -1.0f;
    case 6: return in.ConsumeFloatingPoint<float>();
    case 7: return in.ConsumeFloatingPointInRange<float>(0.01f, 50.0f);
    default: return 0.0f;
  }
}

int pick_window(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return std::numeric_limits<int>::max();
    case 1: return std::numeric_limits<int>::min();
    case 2: return in.ConsumeIntegral<int>();
    case 3: return -2;
    default: return in.ConsumeIntegralInRange<int>(-1, 6);
  }
}

// One tensor view: mostly a contiguous view of sane sizes, with every field open to corruption.
flash4::TensorView pick_view(FuzzedDataProvider& in, int rank, const std::array<int64_t, 4>& like) {
  flash4::TensorView t;
  t.rank = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegralInRange<int>(-1, 5) : rank;
  const bool any_dtype = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  t.dtype = static_cast<flash4::DType>(any_dtype ? in.ConsumeIntegralInRange<int>(-1, 4)
                                                 : in.ConsumeIntegralInRange<int>(0, 2));
  const int kind = in.ConsumeIntegralInRange<int>(0, 31);
  t.device.kind =
      static_cast<flash4::DeviceKind>(kind == 0 ? 1 : kind == 1 ? in.ConsumeIntegralInRange<int>(-1, 3) : 0);
  t.device.index = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegralInRange<int>(-2, 2) : 0;
  for (int i = 0; i < 4; ++i) t.shape[i] = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_size(in) : like[i];
  if (rank == 3) t.shape[3] = 0;
  // Contiguous strides (saturating), sometimes padded or corrupted.
  int64_t stride = 1;
  const int dims = rank == 3 ? 3 : 4;
  for (int i = dims - 1; i >= 0; --i) {
    t.stride[i] = stride;
    int64_t grow = 0;  // the dimension's size, padded sometimes
    if (__builtin_add_overflow(t.shape[i], i < dims - 1 ? in.ConsumeIntegralInRange<int64_t>(0, 2) : 0, &grow))
      grow = std::numeric_limits<int64_t>::max();
    if (__builtin_mul_overflow(stride, grow < 0 ? 0 : grow, &stride)) stride = std::numeric_limits<int64_t>::max();
  }
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) t.stride[in.ConsumeIntegralInRange<int>(0, 3)] = pick_size(in);
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: t.data = nullptr; break;
    case 1: t.data = reinterpret_cast<void*>(in.ConsumeIntegral<uintptr_t>() | 1); break;  // wild, odd
    default: t.data = g_arena + in.ConsumeIntegralInRange<size_t>(0, 15) * (kArenaBytes / 16) +
                      in.ConsumeIntegralInRange<size_t>(0, 3) * 2;  // 16 slots: aliasing is common
  }
  return t;
}

// Byte range of a CPU view that lies inside the arena, or false (then the call is only validated, never run).
bool arena_range(const flash4::TensorView& t, size_t& begin, size_t& end) {
  if (t.rank != 3 && t.rank != 4) return false;
  if (static_cast<int>(t.dtype) < 0 || static_cast<int>(t.dtype) > 2) return false;
  __int128 last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0 || t.stride[i] < 0) return false;
    if (t.shape[i] == 0) {
      begin = end = 0;
      return true;
    }
    if (t.stride[i] == 0) continue;  // any size fits: every index is the same element
    if (t.shape[i] > (int64_t{1} << 40) || t.stride[i] > (int64_t{1} << 40)) return false;  // beyond the arena
    last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data), arena = reinterpret_cast<uintptr_t>(g_arena);
  if (base < arena || base >= arena + kArenaBytes) return false;
  const __int128 bytes = (last + 1) * flash4::dtype_size(t.dtype);
  if (bytes > static_cast<__int128>(kArenaBytes - (base - arena))) return false;
  begin = base - arena;
  end = begin + static_cast<size_t>(bytes);
  return true;
}

// Multiply-adds of a run, from the views themselves (a zero stride lets a huge shape fit in the arena).
double work(const flash4::TensorView& q, const flash4::TensorView& k) {
  double w = 1.0;
  for (const int64_t x : {q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[1]}) w *= static_cast<double>(x);
  return w < 0 ? 0 : w;
}

void check_error(const flash4::Error& e, const char* entry) {
  const std::string message = e.what();
  if (e.status() != flash4::Status::kInvalidArgument && e.status() != flash4::Status::kNotSupported)
    finding("unexpected status", message);
  if (message.rfind(entry, 0) != 0) finding("message does not name the entry point", message);
}

// Runs `call` when every tensor is a CPU view inside the arena and the work is small; checks what it wrote.
template <typename Call>
void run_checked(const std::vector<const flash4::TensorView*>& all,
                 const std::vector<const flash4::TensorView*>& outputs, double work, const char* entry, Call call) {
  std::vector<std::pair<size_t, size_t>> out_ranges;
  for (const flash4::TensorView* t : all) {
    size_t b = 0, e = 0;
    if (t->device.kind != flash4::DeviceKind::kCpu || !arena_range(*t, b, e)) return;
  }
  if (!(work <= kMaxRunWork)) return;
  for (const flash4::TensorView* t : outputs) {
    size_t b = 0, e = 0;
    arena_range(*t, b, e);
    out_ranges.emplace_back(b, e);
  }
  std::memcpy(g_before, g_arena, kArenaBytes);
  try {
    call();
  } catch (const flash4::Error& e) {
    check_error(e, entry);
    if (std::memcmp(g_before, g_arena, kArenaBytes) != 0) finding("memory written by a call that threw", e.what());
    return;
  }
  // Unchanged outside the outputs: memcmp over the gaps between the sorted output ranges (a byte loop here would
  // dominate the run time, every comparison being traced for coverage).
  std::sort(out_ranges.begin(), out_ranges.end());
  size_t at = 0;
  for (const auto& [b, e] : out_ranges) {
    if (b > at && std::memcmp(g_arena + at, g_before + at, b - at) != 0)
      finding("write outside the outputs", std::string(entry) + " in arena bytes [" + std::to_string(at) + ", " +
                                               std::to_string(b) + ")");
    at = std::max(at, e);
  }
  if (at < kArenaBytes && std::memcmp(g_arena + at, g_before + at, kArenaBytes - at) != 0)
    finding("write outside the outputs", std::string(entry) + " after arena byte " + std::to_string(at));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static const bool pattern_ready = [] {
    for (size_t x = 0; x < kArenaBytes; ++x) g_pattern[x] = static_cast<unsigned char>(x * 37 + 11);  // NaNs too
    return true;
  }();
  (void)pattern_ready;
  std::memcpy(g_arena, g_pattern, kArenaBytes);

  // (batch, seqlen_q, heads, head_dim): small sizes, head_dim a multiple of 8 (up to 40).
  const std::array<int64_t, 4> q_shape = {
      in.ConsumeIntegralInRange<int64_t>(0, 2), in.ConsumeIntegralInRange<int64_t>(0, 9),
      in.ConsumeIntegralInRange<int64_t>(0, 4), 8 * in.ConsumeIntegralInRange<int64_t>(0, 5)};
  std::array<int64_t, 4> kv_shape = q_shape;
  kv_shape[1] = in.ConsumeIntegralInRange<int64_t>(0, 9);
  kv_shape[2] = in.ConsumeBool() ? q_shape[2] : in.ConsumeIntegralInRange<int64_t>(0, 4);
  const std::array<int64_t, 4> lse_shape = {q_shape[0], q_shape[2], q_shape[1], 0};
  const auto scope = in.ConsumeBool() ? flash4::Validation::kFull : flash4::Validation::kWithoutBuffers;

  if (in.ConsumeBool()) {
    flash4::ForwardArgs a;
    a.q = pick_view(in, 4, q_shape);
    a.k = pick_view(in, 4, kv_shape);
    a.v = pick_view(in, 4, kv_shape);
    a.out = pick_view(in, 4, q_shape);
    if (in.ConsumeBool()) a.lse = pick_view(in, 3, lse_shape);
    a.softmax_scale = pick_scalar(in);
    a.softcap = pick_scalar(in);
    a.causal = in.ConsumeBool();
    a.window_left = pick_window(in);
    a.window_right = pick_window(in);
    a.tuning.exp2 = static_cast<flash4::Exp2Mode>(in.ConsumeIntegralInRange<int>(0, 2));
    a.tuning.conditional_rescale = in.ConsumeBool();
    try {
      (void)flash4::can_implement(a, scope);
    } catch (const flash4::Error& e) {
      check_error(e, "flash4::forward: ");
    }
    const bool has_lse = a.lse.data != nullptr;
    std::vector<const flash4::TensorView*> all = {&a.q, &a.k, &a.v, &a.out}, outputs = {&a.out};
    if (has_lse) {
      all.push_back(&a.lse);
      outputs.push_back(&a.lse);
    }
    run_checked(all, outputs, work(a.q, a.k), "flash4::forward: ", [&] { flash4::forward(a); });
  } else {
    flash4::BackwardArgs a;
    a.dout = pick_view(in, 4, q_shape);
    a.q = pick_view(in, 4, q_shape);
    a.k = pick_view(in, 4, kv_shape);
    a.v = pick_view(in, 4, kv_shape);
    a.out = pick_view(in, 4, q_shape);
    a.lse = pick_view(in, 3, lse_shape);
    a.dq = pick_view(in, 4, q_shape);
    a.dk = pick_view(in, 4, kv_shape);
    a.dv = pick_view(in, 4, kv_shape);
    a.softmax_scale = pick_scalar(in);
    a.softcap = pick_scalar(in);
    a.causal = in.ConsumeBool();
    a.window_left = pick_window(in);
    a.window_right = pick_window(in);
    a.deterministic = in.ConsumeBool();
    try {
      (void)flash4::can_implement(a, scope);
    } catch (const flash4::Error& e) {
      check_error(e, "flash4::backward: ");
    }
    run_checked({&a.dout, &a.q, &a.k, &a.v, &a.out, &a.lse, &a.dq, &a.dk, &a.dv}, {&a.dq, &a.dk, &a.dv},
                2.5 * work(a.q, a.k), "flash4::backward: ", [&] { flash4::backward(a); });
  }
  return 0;
}
