// Owning host tensors of any flash4 dtype, contiguous or deliberately strided, for building test inputs.
// GPU tests allocate device memory themselves and copy to/from a HostTensor of the same layout.
#pragma once

#include <cstdint>
#include <vector>

#include "common/test_rng.h"
#include "flash4/types.h"

namespace flash4::test {

enum class Layout {
  kContiguous,  // row-major in the logical shape
  kStrided,     // 4-D only: memory order (batch, heads, seqlen, head_dim + 8 padding): no dimension but the
                // last is packed, and seqlen/heads are swapped, so stride bugs show up
  kUnitDimStride1,  // contiguous, but every dimension of extent 1 has stride 1: legal (the dimension is never
                    // stepped) and not describable by a TMA tensor map (strides must be multiples of 16 bytes)
  kBroadcast,  // 4-D inputs only: the rows of one batch and one head, seen by every batch and head through stride
               // 0 (torch's expand of a (1, seqlen, 1, head_dim) tensor)
};

class HostTensor {
 public:
  // 4-D (batch, seqlen, heads, head_dim) attention tensor.
  HostTensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
             Layout layout = Layout::kContiguous);
  // 3-D fp32 LSE tensor (batch, heads, seqlen), contiguous.
  static HostTensor lse(int64_t batch, int64_t heads, int64_t seqlen);
  // 1-D contiguous tensor of n elements (int32 offsets, fp32 per-head values).
  static HostTensor vector(DType dtype, int64_t n);

  // Views the same storage without the leading dimension, which must have extent 1: a packed attention tensor
  // is built as (1, total, heads, head_dim) and used as (total, heads, head_dim), a packed LSE as (heads, total).
  void drop_leading_dim();

  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  int64_t numel() const { return view_.numel(); }
  void* data() { return storage_.data(); }
  size_t storage_bytes() const { return storage_.size() * sizeof(uint32_t); }

  // Logical elements as fp64 (contiguous in the logical shape), and back with rounding to the dtype.
  std::vector<double> to_double() const;
  void assign(const std::vector<double>& values);
  // The first numel() 16-bit elements of the storage (a contiguous bf16 / fp16 tensor), for bit-for-bit checks.
  std::vector<uint16_t> bits16() const;

  // Fills with stddev * N(0, 1) rounded to the dtype.
  void fill_normal(Rng& rng, double stddev = 1.0);
  void fill(double value);
  // Sets every storage byte (padding included) to a NaN pattern so unwritten outputs are caught.
  void poison();

 private:
  HostTensor() = default;
  std::vector<uint32_t> storage_;  // 4-byte units keep fp32 data aligned
  TensorView view_{};
};

}  // namespace flash4::test
