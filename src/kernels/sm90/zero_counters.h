// Zero int counters for kernels that leave them zero when they finish: the decode kernel's arrival counters of its
// last-CTA split merge (one per (sequence, KV head, row tile), decode_split_merge.cuh) and the forward's tile
// counter (its last claim sets it back, fwd_producer.cuh). Zeroing a workspace on the stream (cudaMemsetAsync)
// would put a memset before every such launch (about 0.7 us at 1 x 8k decode) and cost the host an allocation
// and a memset call, so counters come from a per-device pool, zeroed once, whose slices stay zero between
// launches. Launches on one stream run one after the other, so a decode and a forward launch may share a slice.
// Slices: calls outside graph capture use their stream's slice (counter_slices.h: one per stream, kEagerSlices
// streams), so launches share a slice only when they run one after the other on one stream; each capture into a
// CUDA graph takes a slice of its own for good (its replays may run beside any later call; two instances of one
// captured graph replayed at the same time would share it), kCapturedSlices of them. When no slice fits (more
// counters than a slice holds, more streams or captures than slices, or a capture before the first eager call
// allocated the pool) the caller zeroes counters in its workspace instead.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flash4::sm90 {

inline constexpr int kCountersPerSlice = 1024;  // >= the decode work items of any automatic split (< 80 % of 2 x SMs)
inline constexpr int kEagerSlices = 256;
inline constexpr int kCapturedSlices = 256;

// `count` zero counters for a launch on `stream` on the current device, or nullptr (the caller then zeroes counters
// of its own). The launch must leave them zero.
int* pooled_zero_counters(int64_t count, cudaStream_t stream);

}  // namespace flash4::sm90
