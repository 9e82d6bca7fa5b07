// The attention kernel's host launch for one (dtype, head dim); included by the generated translation units.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/smem_opt_in.h"
#include "kernels/sm90/decode/decode_kernel.cuh"
#include "kernels/sm90/decode/decode_launch.h"

namespace flash4::sm90::decode {

template <class Element, int kHeadDim, int kWarpsM>
void launch_shape(const DecodeParams& p, cudaStream_t stream) {
  using Tile = DecodeTile<kHeadDim, kWarpsM>;
  detail::opt_in_shared_memory<&decode_kernel<Element, kHeadDim, kWarpsM>>(Tile::kSmemBytes, Tile::kCtasPerSm > 1);
  const dim3 grid(static_cast<unsigned>(p.splits * p.row_tiles), static_cast<unsigned>(p.kv.attention.heads_kv),
                  static_cast<unsigned>(p.kv.attention.batch));
  decode_kernel<Element, kHeadDim, kWarpsM><<<grid, kThreads, Tile::kSmemBytes, stream>>>(p);
  FLASH4_CUDA_CHECK_LAUNCH();
}

template <class Element, int kHeadDim>
void launch_decode(const DecodeParams& p, bool wide, cudaStream_t stream) {
  if (wide) return launch_shape<Element, kHeadDim, 4>(p, stream);
  launch_shape<Element, kHeadDim, 1>(p, stream);
}

}  // namespace flash4::sm90::decode
