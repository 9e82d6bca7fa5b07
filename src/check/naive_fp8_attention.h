// The "naive FP8 attention" baseline of the FP8 forward's tolerance (docs/numerics.md, "FP8 forward").
//
// A plain FP8 implementation multiplies FP8 operands with fp32 accumulation: S = Q K^T from the FP8 products
// (held in fp32, scaled, softcapped), the softmax numerator P~ = exp(S - m) rounded to E4M3 to be the FP8
// operand of P~ V, the denominator l = sum P~ (plus the sink's term) summed before that rounding, O = (P~_fp8 V) / l
// rounded to the output dtype and the LSE to fp32. Rounding the unnormalized P~ (not the normalized P, whose
// small values would be E4M3 subnormals) is what FP8 kernels do. Inputs are the dequantized values (FP8 value *
// descale), which are exact in fp64: nothing is rounded on the way in.
//
// Two arithmetic models (Fp8Arithmetic):
// - fp32: exact products, fp32 sums, m = the row's max (so the row's largest P~ is 1, exact in E4M3). The CPU
//   path is more accurate than this (it does not round P~), so this is its baseline.
// - hopper_tensor_cores: what any FP8 flash kernel on Hopper meets. wgmma's FP8 accumulator is not fp32: each
//   k-step of 32 products and the running sum are aligned to the largest exponent among them and keep 13
//   fraction bits below it (truncated), and the step's sum keeps 13 fraction bits below its own leading one, in
//   S = Q K^T and in O += P~ V alike. And P~ is taken against the online softmax's reference max over 128-key
//   tiles (the last tile first, as the kernel walks them), which with FA4's conditional rescaling moves only when
//   a tile's max exceeds it by more than 2^8: the row's largest P~ is then rounded like any other. The scores
//   match the H200's (docs/numerics.md, "FP8 forward"); the softmax's reference max only follows the kernel's in
//   distribution (the kernel's moves per warp of rows), so out's errors match in size, not bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "check/attention_results.h"
#include "common/problem.h"
#include "flash4/types.h"

namespace flash4::check {

struct Fp8Arithmetic {
  int mma_block = 0;           // products per aligned accumulation step; 0: exact products, fp32 sums
  int mma_fraction_bits = 23;  // bits each addend keeps below the step's largest exponent
  int tile_keys = 0;           // > 0: online softmax over key tiles of this size with the conditional rescale
  float rescale_threshold_log2 = 8.0f;

  static constexpr Fp8Arithmetic fp32() { return {}; }
  static constexpr Fp8Arithmetic hopper_tensor_cores() { return {32, 13, 128, 8.0f}; }
};

// q, k, v: contiguous fp64 in the public layouts (reference/array_index.h), already dequantized. out_dtype: the
// output's (bf16 or fp16). `rows` as in reference::forward (empty = all); rows not listed are 0.
ForwardResult naive_fp8_forward(const detail::Problem& p, DType out_dtype, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<int64_t>& rows = {},
                                Fp8Arithmetic arithmetic = Fp8Arithmetic::fp32());

}  // namespace flash4::check
