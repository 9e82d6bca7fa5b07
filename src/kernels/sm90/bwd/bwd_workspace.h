// The backward's workspace: one stream-ordered allocation per call (bwd_api.cu; cudaMallocAsync on the caller's
// stream, freed with cudaFreeAsync after the postprocess is enqueued, so no synchronization, and the device's
// default memory pool caches it between calls). Plain C++: the layout is tested on the CPU
// (tests/cpu/test_bwd_workspace.cpp).
//
// Parts, in this order, each 256-byte aligned; `rows` is b * h * sq, or h * total_q with packed queries:
//   dq_accum       fp32 (rows, dq_accum_cols)   zeroed by the preprocess kernel; d wide, or 32-column blocks in
//                                               fragment order (bwd_params.h)
//   dsum           fp32 (rows)                  D_i = sum_d dO_i * O_i
//   lse_log2       fp32 (rows)                  LSE * log2(e)
//   semaphores     int (semaphores)             zeroed by a memset; deterministic mode only (column slices x b x h x
//                                               m_blocks)
//   work_counter   int                          zeroed by the preprocess kernel; only where persistent CTAs run
//   dsink_partial  fp32 (dsink_partials)        per-slice sums of the sink's gradient; only when it is requested
//   dk_partial     fp32 (partial_rows, d)       a split GQA group's dK partials (group_parts x key rows x kv
//   dv_partial     fp32 (partial_rows, dv)      heads); only where the group is split
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace flash4::sm90::bwd {

// What the workspace must hold; counts of elements (0: the part is absent).
struct BwdWorkspaceNeeds {
  int64_t rows = 0;           // LSE / D / dQ-accumulator rows
  int dq_accum_cols = 0;      // floats per dQ-accumulator row
  int64_t semaphores = 0;     // ints
  bool work_counter = false;  // one int (its part is 256 bytes)
  int64_t dsink_partials = 0; // floats
  int64_t partial_rows = 0;   // rows of each of dk_partial and dv_partial
  int head_dim = 0, head_dim_v = 0;
};

// Byte offsets of the parts from the allocation's start, and the allocation's size (at least 256 bytes, so that
// an empty problem still gets a valid block).
struct BwdWorkspaceLayout {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, semaphores = 0, work_counter = 0, dsink_partial = 0, dk_partial = 0,
         dv_partial = 0;
  size_t semaphore_bytes = 0;  // what the memset zeroes
  size_t bytes = 0;
};

// Slices of the sink gradient's first step (bwd_prepost.cuh, bwd_dsink_partial_kernel): each head's row slots
// (batch * seqlen_q dense, total_q packed) in slices of about 4 rows per thread, about 4 CTAs per SM in all.
inline int dsink_slices(int64_t slots_per_head, int heads) {
  const int64_t wanted = (slots_per_head + 1023) / 1024;
  const int64_t most = std::max<int64_t>(1, 528 / std::max(heads, 1));
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, most));
}

constexpr size_t align256(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

constexpr BwdWorkspaceLayout bwd_workspace_layout(const BwdWorkspaceNeeds& n) {
  const auto floats = [](int64_t count) { return align256(static_cast<size_t>(count) * sizeof(float)); };
  BwdWorkspaceLayout l;
  l.dq_accum = 0;
  l.dsum = l.dq_accum + floats(n.rows * n.dq_accum_cols);
  l.lse_log2 = l.dsum + floats(n.rows);
  l.semaphores = l.lse_log2 + floats(n.rows);
  l.semaphore_bytes = align256(static_cast<size_t>(n.semaphores) * sizeof(int));
  l.work_counter = l.semaphores + l.semaphore_bytes;
  l.dsink_partial = l.work_counter + (n.work_counter ? 256 : 0);
  l.dk_partial = l.dsink_partial + floats(n.dsink_partials);
  l.dv_partial = l.dk_partial + floats(n.partial_rows * n.head_dim);
  const size_t end = l.dv_partial + floats(n.partial_rows * n.head_dim_v);
  l.bytes = end > 256 ? end : 256;
  return l;
}

}  // namespace flash4::sm90::bwd
