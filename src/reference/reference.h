// Naive fp64 attention: materializes each score row, no tiling, no tricks. The judge for tests and for
// `flash4 run --check`; never used on a user's hot path.
//
// All arrays are contiguous fp64 in the public layouts: q/dq (b, sq, h, d), out/dout (b, sq, h, dv), k/dk (b, sk,
// hkv, d), v/dv (b, sk, hkv, dv) with d = head_dim and dv = head_dim_v, lse (b, h, sq); for a packed problem the
// leading (b, s) is (total) and lse is (h, total_q) (array_index.h; the
// problem's cu_seqlens / seqused must then be host pointers). Semantics (mask per entry, softcap, GQA, the
// learnable sink, fully-masked rows, rows in no entry) are those of src/common/problem.h and flash4/api.h.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.h"
#include "flash4/types.h"

namespace flash4::reference {

// Forward for the query rows listed in `rows` (all rows when empty), for every batch and head. Rows not listed
// are left untouched in out/lse, so large shapes can be checked on a sample. With all rows, rows in no entry get
// out 0 and lse -inf.
void forward(const detail::Problem& p, const double* q, const double* k, const double* v, double* out,
             double* lse, const std::vector<int64_t>& rows = {});

// Backward: dq, dk, dv (and dsink (heads) when not null and p has a sink) from dout (out and lse are recomputed
// internally in fp64). Rows in no entry get zero gradients.
void backward(const detail::Problem& p, const double* q, const double* k, const double* v, const double* dout,
              double* dq, double* dk, double* dv, double* dsink = nullptr);

// Copy a host tensor view of any dtype into a contiguous fp64 vector (and back, rounding to the view's dtype).
std::vector<double> to_double(const TensorView& t);
void from_double(const std::vector<double>& src, const TensorView& dst);

}  // namespace flash4::reference
