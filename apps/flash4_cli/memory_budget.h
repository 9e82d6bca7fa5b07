// How much memory a `flash4 run` needs and how much the machine has: a run that would not fit is refused with
// both figures before anything is allocated (an oversized vector would otherwise end in std::bad_alloc or the
// kernel's OOM killer).
#pragma once

#include <string>

#include "options.h"

namespace flash4_cli {

struct MemoryNeed {
  double host_bytes = 0.0;    // the tensors' host copies, plus the fp64 copies and results of --check
  double device_bytes = 0.0;  // CUDA: the tensors plus the backward's workspace; 0 on the CPU
};

// Estimate for options `o` (sizes already validated) run on CUDA (on_cuda) or the CPU.
MemoryNeed estimate_memory(const RunOptions& o, bool on_cuda);

// Host memory this process can still allocate: MemAvailable of /proc/meminfo, lowered to what RLIMIT_AS and
// RLIMIT_DATA leave (ulimit -v, -d); a negative value when it cannot be told.
double host_memory_available();

// "12.5 GiB" (binary units, 3 significant digits).
std::string format_bytes(double bytes);

}  // namespace flash4_cli
