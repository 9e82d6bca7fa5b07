// Whether tensors the library writes share memory with what it reads or with each other (checker.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "api/checker.h"

namespace flash4::detail {
namespace {

// Byte range [begin, end) that a tensor's elements span; empty for an empty tensor.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
};

ByteRange byte_range(const TensorView& t) {
  // An absent optional tensor is not validated (its rank may be anything): it spans nothing.
  if (t.data == nullptr || t.rank < 0 || t.rank > 4 || t.numel() == 0) return {};
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];  // no overflow: checked above
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + static_cast<uintptr_t>((last + 1) * dtype_size(t.dtype))};
}

bool ranges_intersect(const ByteRange& a, const ByteRange& b) {
  return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

// Whether sum_d c_d * stride[d] == target for some integers lo[d] <= c_d <= hi[d], over the dimensions
// order[k..rank) (strides decreasing). The remaining dimensions reach at most `reach[k]` either way, which bounds
// the candidates of each c_d: at most two where each stride exceeds the span of the smaller ones (a tensor whose
// elements are distinct). `budget` bounds the search for other layouts; running out answers "maybe" (true).
bool offset_reachable(int64_t target, int k, int rank, const int* order, const int64_t* stride, const int64_t* lo,
                      const int64_t* hi, const int64_t* reach, int64_t& budget) {
  if (k == rank) return target == 0;
  if (--budget < 0) return true;
  const int d = order[k];
  const int64_t s = stride[d];
  if (s == 0) return offset_reachable(target, k + 1, rank, order, stride, lo, hi, reach, budget);
  // c with |target - c s| <= reach[k + 1]: c in [(target - reach) / s, (target + reach) / s], rounded inwards.
  const auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const int64_t first = std::max(lo[d], -floor_div(-(target - reach[k + 1]), s));
  const int64_t last = std::min(hi[d], floor_div(target + reach[k + 1], s));
  for (int64_t c = first; c <= last; ++c)
    if (offset_reachable(target - c * s, k + 1, rank, order, stride, lo, hi, reach, budget)) return true;
  return false;
}

// Whether two tensors of one dtype and the same strides share an element (or part of one): element i of `a`
// and element j of `b` coincide when sum_d (i_d - j_d) stride_d equals b's start minus a's, in elements.
bool elements_overlap(const TensorView& a, const TensorView& b) {
  if (!ranges_intersect(byte_range(a), byte_range(b))) return false;
  const int64_t size = dtype_size(a.dtype);
  const int64_t delta_bytes = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data) -
                                                   reinterpret_cast<uintptr_t>(a.data));
  if (b.dtype != a.dtype || b.rank != a.rank || delta_bytes % size != 0) return true;  // partial elements
  int order[4], rank = a.rank;
  int64_t stride[4], lo[4], hi[4], reach[5] = {0, 0, 0, 0, 0};
  for (int d = 0; d < rank; ++d) {
    // A dimension of size 1 on one side contributes only the other side's index, with that side's stride.
    if (a.stride[d] == b.stride[d] || b.shape[d] <= 1) stride[d] = a.stride[d];
    else if (a.shape[d] <= 1) stride[d] = b.stride[d];
    else return true;  // different strides: not decided here, so treated as sharing
    order[d] = d;
    lo[d] = -(b.shape[d] - 1);  // c_d = i_d - j_d
    hi[d] = a.shape[d] - 1;
  }
  for (int i = 1; i < rank; ++i)  // strides decreasing (insertion sort: at most four dimensions)
    for (int j = i; j > 0 && stride[order[j]] > stride[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
  for (int k = rank - 1; k >= 0; --k) {
    const int d = order[k];
    reach[k] = reach[k + 1] + std::max(-lo[d], hi[d]) * stride[d];  // no overflow: extents fit int64
  }
  int64_t budget = 1 << 16;
  return offset_reachable(delta_bytes / size, 0, rank, order, stride, lo, hi, reach, budget);
}

}  // namespace

// Conservative: two tensors whose byte ranges intersect are treated as aliasing, even if strided views
// interleave without sharing elements (e.g. a packed dqkv buffer).
void check_no_overlap(const Checker& c, const TensorView& out, const char* out_name, const TensorView& other,
                      const char* other_name) {
  if (!c.buffers()) return;
  FLASH4_REQUIRE(
      c, !ranges_intersect(byte_range(out), byte_range(other)),
      std::string(out_name) + " overlaps " + other_name + " in memory; outputs must not alias inputs or other outputs");
}

void check_no_shared_elements(const Checker& c, const TensorView& a, const char* a_name, const TensorView& b,
                              const char* b_name) {
  if (!c.buffers()) return;
  FLASH4_REQUIRE(c, !elements_overlap(a, b),
                 std::string(a_name) + " and " + b_name + " share elements in memory; both are written, so they " +
                     "must be distinct (interleaved views of one buffer are fine)");
}

void check_distinct_elements(const Checker& c, const TensorView& out, const char* name) {
  if (out.numel() == 0) return;  // no elements: any strides
  for (int i = 0; i < out.rank && i < 4; ++i) {
    FLASH4_REQUIRE(c, out.shape[i] <= 1 || out.stride[i] != 0,
                   std::string(name) + ".stride[" + std::to_string(i) + "] = 0 with " + name + ".shape[" +
                       std::to_string(i) + "] = " + std::to_string(out.shape[i]) +
                       ": the library writes " + name + ", so its elements must not share memory (a broadcast "
                       "view, e.g. from expand, cannot be an output)");
  }
}

}  // namespace flash4::detail
