// Parameters of the wgmma backward kernels: BwdParams plus the TMA tensor maps (built by bwd_api.cu).
#pragma once

#include <cuda.h>

#include "kernels/sm90/bwd/bwd_params.h"

namespace flash4::sm90 {

// The wgmma kernel's parameters: the above plus the TMA maps (built by bwd_api.cu; tiles in bwd_wgmma_config.h).
namespace bwd {
struct BwdWgmmaParams {
  CUtensorMap tma_q;   // (b, sq, h, d),   box 64 cols x kBlockM rows
  CUtensorMap tma_k;   // (b, sk, hkv, d), box 64 cols x kBlockN rows
  CUtensorMap tma_v;   // (b, sk, hkv, d), box 64 cols x kBlockN rows
  CUtensorMap tma_do;  // (b, sq, h, d),   box 64 cols x kBlockM rows
  CUtensorMap tma_dq;  // fp32 dQ accumulator (b, h, sq, d), box 32 cols x 64 rows (reduce-add target)
  BwdParams p;
};
}  // namespace bwd

}  // namespace flash4::sm90
