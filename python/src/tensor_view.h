// Conversion of DLPack arrays (numpy, torch, cupy, ... through nanobind's nb::ndarray) to flash4::TensorView.
// The view borrows the array's memory; the ndarray must outlive every use of the view.
#pragma once

#include <nanobind/ndarray.h>

#include "flash4/types.h"

namespace flash4::python {

// Rank of the attention tensors (batch, seqlen, heads, head_dim) and of the LSE (batch, heads, seqlen_q).
constexpr int kAttentionRank = 4;
constexpr int kLseRank = 3;
// Packed (variable-length) batches: attention tensors (total, heads, head_dim), LSE (heads, total_q), and the
// rank-1 index and per-head tensors (cu_seqlens, seqused, learnable_sink, dsink).
constexpr int kPackedAttentionRank = 3;
constexpr int kPackedLseRank = 2;
constexpr int kVectorRank = 1;
// FP8 descale factors q/k/v_descale: (batch, heads_kv).
constexpr int kDescaleRank = 2;

// Raises TypeError for an element type flash4 does not take (float32, float16, bfloat16, float8_e4m3fn, int32), ValueError
// for a device other than the CPU or CUDA, or a rank other than `rank`. Shapes and strides are copied as
// they are (strides in elements); everything else is validated by the library itself.
TensorView to_view(const nanobind::ndarray<nanobind::ro>& a, const char* name, int rank);
TensorView to_view(const nanobind::ndarray<>& a, const char* name, int rank);
// An FP8 descale factor (batch, heads_kv); its rank-2 layout is named in the error, not the packed LSE's.
TensorView to_descale_view(const nanobind::ndarray<nanobind::ro>& a, const char* name);
// Any other rank-2 input with its own layout for the error (rotary tables; `index`: an int32 block table).
TensorView to_matrix_view(const nanobind::ndarray<nanobind::ro>& a, const char* name, const char* layout,
                          bool index = false);

}  // namespace flash4::python
