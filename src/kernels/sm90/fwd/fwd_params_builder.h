// Builds the forward kernel's parameters (tensor maps, sizes, scales) from validated arguments. Used by
// dispatch and by the ablation benchmark, which launches kernel variants the library does not compile.
#pragma once

#include "api/backends.h"
#include "kernels/sm90/fwd/fwd_config.h"
#include "kernels/sm90/fwd/fwd_params.h"

namespace flash4::detail {

// The launch configuration of a problem: chosen here once, then given to make_fwd_params and the launcher.
sm90::FwdLaunchConfig choose_fwd_launch(const Problem& p);
// The sizes the forward kernels count in 32-bit ints, for tiles of block_m query rows: ok, or the reason.
Support fwd_int32_limits(const Problem& p, int64_t block_m);
// Parameters for tiles of tile.block_m query rows and tile.block_n keys (the TMA boxes and the number of m-blocks
// depend on them).
sm90::FwdParams make_fwd_params(const ForwardArgs& args, const Problem& p, const sm90::FwdTileConfig& tile);
// Whether TMA can address a tensor: 16-byte aligned base address and byte strides (all but the contiguous last)
// that are multiples of 16.
bool tma_compatible(const TensorView& t);
// The same as make_fwd_params without the tensor maps (the FP8 forward maps its e4m3 tensors itself: fwd_fp8.cu).
sm90::FwdParams fwd_params_without_maps(const ForwardArgs& args, const Problem& p, const sm90::FwdTileConfig& tile);

}  // namespace flash4::detail
