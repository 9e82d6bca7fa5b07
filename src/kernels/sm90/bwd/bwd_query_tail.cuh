// Query rows past an entry's end in its last Q tile, for the wgmma backward kernels' packed instantiations.
//
// TMA loads whole kBlockM-row tiles of the packed q and dout, so the last tile of a sequence also holds rows
// that belong to the next sequence or to no sequence (past seqused_q, after the last segment): any bits there,
// NaN included, in a buffer the caller never wrote. Their LSE is +inf and their D 0 (the producer), so P = dS = 0
// for them, but dV += P^T dO and dK += dS^T Q multiply those zeros by the rows themselves, and 0 * NaN is NaN.
// The consumers therefore zero the rows from `valid_rows` on in the stage's Q and dO tiles before the tile's
// first matmul. Both consumer warpgroups read the whole tiles, so the 256 consumer threads share the stores and
// meet at a named barrier; the rows are whole 128-byte chunk rows, so the 128B swizzle does not matter.
#pragma once

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/named_barrier.cuh"

namespace flash4::sm90::bwd {

// q: [chunks][rows][64] and dout: [chunks_v][rows][64] elements of one ring stage (shared memory, 128B swizzle);
// consumer_thread: 0 .. 255 over both consumer warpgroups; barrier: a named barrier of those 256 threads that
// the caller uses in the same order in both warpgroups (every thread of both must call this together).
template <class Element, int kChunks, int kChunksV, int kRows>
__device__ __forceinline__ void clear_query_tail(Element (&q)[kChunks][kRows][64], Element (&dout)[kChunksV][kRows][64],
                                                 int valid_rows, int consumer_thread, uint32_t barrier) {
  const int unit = consumer_thread % 8;  // 16-byte unit of a 128-byte chunk row; 32 rows a pass
  for (int row = max(valid_rows, 0) + consumer_thread / 8; row < kRows; row += 32) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) reinterpret_cast<uint4*>(&q[c][row][0])[unit] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int c = 0; c < kChunksV; ++c)
      reinterpret_cast<uint4*>(&dout[c][row][0])[unit] = make_uint4(0u, 0u, 0u, 0u);
  }
  fence_async_shared();  // generic-proxy stores -> wgmma (async proxy) reads
  named_barrier_sync(barrier, 2 * 128);
}

}  // namespace flash4::sm90::bwd
