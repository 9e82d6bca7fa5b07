// What the libFuzzer targets share (fuzz/README.md): one arena that every generated tensor view points into
// (aliasing often), generators of sizes, scalars, windows, views and index tensors with every field open to
// corruption, and run_checked, which calls an entry point on views inside the arena and checks that it threw a
// flash4::Error naming the entry point and wrote nothing, or wrote nothing outside its outputs.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "flash4/api.h"

namespace flash4::fuzz {

inline constexpr size_t kArenaBytes = size_t{1} << 15;
alignas(64) inline unsigned char g_arena[kArenaBytes];
alignas(64) inline unsigned char g_before[kArenaBytes];
alignas(64) inline unsigned char g_pattern[kArenaBytes];  // the arena's contents at the start of every input
// Problems with more multiply-adds than this are validated but not run, to keep executions fast.
inline constexpr double kMaxRunWork = 1 << 20;

[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

inline int64_t pick_size(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return std::numeric_limits<int64_t>::max();
    case 1: return std::numeric_limits<int64_t>::min();
    case 2: return -1;
    case 3: return in.ConsumeIntegral<int64_t>();
    case 4: return int64_t{1} << in.ConsumeIntegralInRange<int>(30, 62);
    default: return in.ConsumeIntegralInRange<int64_t>(0, 9);
  }
}

inline float pick_scalar(FuzzedDataProvider& in) {
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

inline int pick_window(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return std::numeric_limits<int>::max();
    case 1: return std::numeric_limits<int>::min();
    case 2: return in.ConsumeIntegral<int>();
    case 3: return -2;
    default: return in.ConsumeIntegralInRange<int>(-1, 6);
  }
}

// One tensor view: mostly a contiguous view of sane sizes, with every field open to corruption.
inline flash4::TensorView pick_view(FuzzedDataProvider& in, int rank, const std::array<int64_t, 4>& like) {
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
  for (int i = rank; i < 4; ++i) t.shape[i] = 0;
  // Contiguous strides (saturating), sometimes padded or corrupted.
  int64_t stride = 1;
  const int dims = rank;
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

// A rank-1 view of `n` elements of `dtype` (an index tensor or the sink), corrupted like pick_view's.
inline flash4::TensorView pick_vector(FuzzedDataProvider& in, int64_t n, flash4::DType dtype) {
  flash4::TensorView t = pick_view(in, 1, {n, 0, 0, 0});
  if (in.ConsumeIntegralInRange<int>(0, 15) != 0) t.dtype = dtype;
  return t;
}

// Writes int32 contents into an index view that lies in the arena: segment offsets from fuzzed lengths (valid
// and monotonic) or, sometimes, corrupt values (decreasing, negative, huge). `offsets`: cu_seqlens (n = batch + 1,
// starting at 0) or seqused (n = batch lengths). Returns the largest segment length written.
inline int64_t fill_index(FuzzedDataProvider& in, const flash4::TensorView& t, bool offsets, int64_t max_len) {
  const auto base = reinterpret_cast<uintptr_t>(t.data), arena = reinterpret_cast<uintptr_t>(g_arena);
  if (t.rank != 1 || t.shape[0] <= 0 || t.shape[0] > 64 || t.stride[0] != 1 || base < arena || base % 4 != 0 ||
      base + 4 * static_cast<uint64_t>(t.shape[0]) > arena + kArenaBytes)
    return 0;
  auto* v = reinterpret_cast<int32_t*>(t.data);
  const bool corrupt = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  int64_t at = 0, longest = 0;
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    const int64_t len = in.ConsumeIntegralInRange<int64_t>(0, max_len);
    if (corrupt) {
      v[i] = in.ConsumeBool() ? in.ConsumeIntegral<int32_t>() : in.ConsumeIntegralInRange<int32_t>(-3, 12);
    } else if (offsets) {
      v[i] = static_cast<int32_t>(at);
      at += len;
    } else {
      v[i] = static_cast<int32_t>(len);
    }
    longest = std::max(longest, len);
  }
  return longest;
}

// Byte range of a CPU view that lies inside the arena, or false (then the call is only validated, never run).
inline bool arena_range(const flash4::TensorView& t, size_t& begin, size_t& end) {
  if (t.rank < 1 || t.rank > 4) return false;
  if (static_cast<int>(t.dtype) < 0 || static_cast<int>(t.dtype) > 3) return false;  // fp32, fp16, bf16, int32
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

inline void check_error(const flash4::Error& e, const char* entry) {
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

// The arena's contents at the start of every input: a fixed byte pattern (NaNs among its floats).
inline void reset_arena() {
  static const bool pattern_ready = [] {
    for (size_t x = 0; x < kArenaBytes; ++x) g_pattern[x] = static_cast<unsigned char>(x * 37 + 11);
    return true;
  }();
  (void)pattern_ready;
  std::memcpy(g_arena, g_pattern, kArenaBytes);
}

// Writes int32 values into a contiguous view of any rank that lies in the arena: each in [lo, hi], or, for
// a corrupt input, any value. Views outside the arena or not contiguous are left as they are.
inline void fill_values(FuzzedDataProvider& in, const flash4::TensorView& t, int32_t lo, int32_t hi) {
  const auto base = reinterpret_cast<uintptr_t>(t.data), arena = reinterpret_cast<uintptr_t>(g_arena);
  if (t.rank < 1 || t.rank > 4 || base < arena || base % 4 != 0) return;
  int64_t n = 1, stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] < 0 || t.shape[i] > 64 || t.stride[i] != stride) return;
    n *= t.shape[i];
    stride *= t.shape[i];
  }
  if (base + 4 * static_cast<uint64_t>(n) > arena + kArenaBytes) return;
  auto* v = reinterpret_cast<int32_t*>(t.data);
  const bool corrupt = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  for (int64_t i = 0; i < n; ++i)
    v[i] = corrupt ? in.ConsumeIntegral<int32_t>() : in.ConsumeIntegralInRange<int32_t>(lo, hi < lo ? lo : hi);
}

}  // namespace flash4::fuzz
