// The sum of a split GQA group's dK or dV partials (BwdParams::group_parts > 1, bwd_item_plan.h: bwd_group_parts):
// every key row that a batch entry's work items wrote, its parts added in part order (so the result does not
// depend on timing) and written once in the output's dtype and strides. Memory-bound; templated on the element
// type only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/sequence.h"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_prepost.cuh"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

// Grid (row blocks of the longest entry, heads_kv, batch entries), kPrepostThreads threads: each thread sums 8
// columns of one key row (two 16-byte loads per part) and stores them as 16 bytes. `width`: dK's head_dim or
// dV's head_dim_v (a multiple of 8); `partial`: p.dk_partial or p.dv_partial; `out`, `stride`: dk or dv.
template <class Element>
__global__ void __launch_bounds__(kPrepostThreads)
    bwd_group_reduce_kernel(const __grid_constant__ BwdParams p, const float* partial, void* out, BshdStrides stride,
                            int width) {
  const int units = width / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kPrepostThreads + threadIdx.x;
  const int64_t j = idx / units;
  const int col = static_cast<int>(idx - j * units) * 8;
  const int hkv = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  // The entry's keys as the main kernel saw them (clamped offsets and lengths: no row outside the tensors).
  const detail::SequenceInfo si = p.seq.info(b);
  if (j >= si.seqlen_k) return;
  const int64_t kb = p.seq.cu_seqlens_k != nullptr ? 0 : b, row = si.k_offset + j;
  const BshdStrides ps = partial_strides(p, width);
  const float* src = partial + kb * ps.batch + row * ps.seq + hkv * ps.head + col;
  const int64_t part_elements = partial_part_elements(p, width);
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int part = 0; part < p.group_parts; ++part, src += part_elements) {
    const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
    acc[0] += lo.x, acc[1] += lo.y, acc[2] += lo.z, acc[3] += lo.w;
    acc[4] += hi.x, acc[5] += hi.y, acc[6] += hi.z, acc[7] += hi.w;
  }
  Element* dst = static_cast<Element*>(out) + kb * stride.batch + row * stride.seq + hkv * stride.head + col;
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<Element>(acc[0], acc[1]), pack2<Element>(acc[2], acc[3]),
                                              pack2<Element>(acc[4], acc[5]), pack2<Element>(acc[6], acc[7]));
}

}  // namespace flash4::sm90::bwd
