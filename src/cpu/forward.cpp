// CPU FlashAttention forward: the GPU algorithm on fp32 tiles. One task per (batch, head, 64-row Q tile); the
// task streams K/V tiles through an online softmax with FA4's conditional rescaling.
#include <algorithm>
#include <limits>
#include <vector>

#include "api/backends.h"
#include "cpu/exp2_row.h"
#include "cpu/multiversion.h"
#include "cpu/online_softmax.h"
#include "common/parallel_for.h"
#include "cpu/score_transform.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace flash4::detail {
namespace {

using namespace flash4::cpu;

struct ForwardTiles {
  std::vector<float> q, kt, v, s, o;  // (M, d), (d, N), (N, d), (M, N), (M, d)
  explicit ForwardTiles(int64_t d)
      : q(kBlockM * d), kt(d * kBlockN), v(kBlockN * d), s(kBlockM * kBlockN), o(kBlockM * d) {}
};

FLASH4_CPU_MULTIVERSION void forward_tile(const ForwardArgs& args, const Problem& p, int64_t b, int64_t h, int64_t q0, ForwardTiles& t) {
  const int64_t d = p.head_dim, hk = h / p.group();
  const int64_t rows = std::min<int64_t>(kBlockM, p.seqlen_q - q0);
  const detail::ScoreTransform transform = p.score_transform();
  const detail::SequenceMask mask = p.sequence_mask(b);
  // kAuto means exact here: the CPU also serves fp32, where the polynomial's 8.8e-5 relative error would show.
  const bool polynomial = args.tuning.exp2 == Exp2Mode::kPolynomial;
  const bool conditional = args.tuning.conditional_rescale;

  OnlineSoftmaxRow state[kBlockM];
  std::fill(t.o.begin(), t.o.end(), 0.0f);
  load_rows(args.q, b, q0, rows, h, t.q.data());

  // Only the K tiles some row of this Q tile can see (causal / window skip the rest).
  const detail::IndexRange key_tiles = mask.key_tiles(q0, q0 + rows - 1, kBlockN);
  for (int64_t k0 = key_tiles.lo * kBlockN; k0 <= key_tiles.hi * kBlockN; k0 += kBlockN) {
    const int64_t n = std::min<int64_t>(kBlockN, p.seqlen_k - k0);
    load_rows_transposed(args.k, b, k0, n, hk, t.kt.data(), n);
    load_rows(args.v, b, k0, n, hk, t.v.data());
    matmul_set(t.q.data(), t.kt.data(), t.s.data(), rows, n, d);  // S = Q K^T

    for (int64_t r = 0; r < rows; ++r) {
      float* row = t.s.data() + r * n;  // scores in, probabilities out
      const TileSpan span = tile_span(mask, q0 + r, k0, n);
      if (span.empty()) {
        std::fill(row, row + n, 0.0f);
        continue;
      }
      apply_score_transform(transform, row + span.begin, span.end - span.begin);
      const float m_tile = *std::max_element(row + span.begin, row + span.end);
      const float factor = state[r].update(m_tile, conditional);
      if (factor != 1.0f) {
        float* o = t.o.data() + r * d;
        for (int64_t x = 0; x < d; ++x) o[x] *= factor;
      }
      std::fill(row, row + span.begin, 0.0f);
      std::fill(row + span.end, row + n, 0.0f);
      exp2_row(row + span.begin, state[r].m_ref, row + span.begin, span.end - span.begin, polynomial);
      float sum = 0.0f;
      for (int64_t j = span.begin; j < span.end; ++j) sum += row[j];
      state[r].l += sum;
    }
    matmul_add(t.s.data(), t.v.data(), t.o.data(), rows, d, n);  // O += P V
  }

  for (int64_t r = 0; r < rows; ++r) {
    const float inv_l = state[r].l > 0.0f ? 1.0f / state[r].l : 0.0f;  // fully masked row: out 0
    float* o = t.o.data() + r * d;
    for (int64_t x = 0; x < d; ++x) o[x] *= inv_l;
    if (args.lse.data) *lse_ptr(args.lse, b, h, q0 + r) = state[r].lse();
  }
  store_rows(t.o.data(), args.out, b, q0, rows, h);
}

}  // namespace

void cpu_forward(const ForwardArgs& args, const Problem& p) {
  const int64_t q_tiles = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t tasks = p.batch * p.heads * q_tiles;
  parallel_for(tasks, [&](int64_t task) {
    ForwardTiles tiles(p.head_dim);
    const int64_t qt = task % q_tiles, bh = task / q_tiles;
    forward_tile(args, p, bh / p.heads, bh % p.heads, qt * kBlockM, tiles);
  });
}

}  // namespace flash4::detail
