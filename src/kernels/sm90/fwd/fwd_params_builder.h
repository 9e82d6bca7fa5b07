// Builds the forward kernel's parameters (tensor maps, sizes, scales) from validated arguments. Used by
// dispatch and by the ablation benchmark, which launches kernel variants the library does not compile.
#pragma once

#include "api/backends.h"
#include "kernels/sm90/fwd/fwd_params.h"

namespace flash4::detail {

sm90::FwdParams make_fwd_params(const ForwardArgs& args, const Problem& p);

}  // namespace flash4::detail
