// `flash4 run`: random inputs, warm-up, timed runs, report, optional check. Returns the process exit code.
#pragma once

#include "options.h"

namespace flash4_cli {

int run_attention(const RunOptions& options);

}  // namespace flash4_cli
