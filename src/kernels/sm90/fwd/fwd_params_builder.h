// Builds the forward kernel's parameters (tensor maps, sizes, scales) from validated arguments. Used by
// dispatch and by the ablation benchmark, which launches kernel variants the library does not compile.
#pragma once

#include "api/backends.h"
#include "kernels/sm90/fwd/fwd_params.h"

namespace flash4::detail {

// Tiles of block_m query rows and block_n keys (the TMA boxes and the number of m-blocks depend on them).
sm90::FwdParams make_fwd_params(const ForwardArgs& args, const Problem& p, int block_m, int block_n);
// With the tile table's sizes for this problem (what the library launches).
sm90::FwdParams make_fwd_params(const ForwardArgs& args, const Problem& p);

}  // namespace flash4::detail
