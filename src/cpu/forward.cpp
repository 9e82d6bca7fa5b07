// CPU FlashAttention forward: the GPU algorithm on fp32 tiles. One task per (batch, head, 64-row Q tile); the
// task streams K/V tiles through an online softmax with FA4's conditional rescaling. Dense and packed batches
// share the code: entry b's tokens are found through p.layout().info(b) (cpu/packed_rows.h). FP8 q, k, v are
// dequantized as their tiles are loaded (value * descale of the entry and kv head), then computed alike.
#include <algorithm>
#include <limits>
#include <vector>

#include "api/backends.h"
#include "cpu/exp2_row.h"
#include "cpu/multiversion.h"
#include "cpu/online_softmax.h"
#include "cpu/packed_rows.h"
#include "common/parallel_for.h"
#include "cpu/score_transform.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace flash4::detail {
namespace {

using namespace flash4::cpu;

struct ForwardTiles {
  std::vector<float> q, kt, v, s, o;  // (M, d), (d, N), (N, dv), (M, N), (M, dv)
  ForwardTiles(int64_t d, int64_t dv)
      : q(kBlockM * d), kt(d * kBlockN), v(kBlockN * dv), s(kBlockM * kBlockN), o(kBlockM * dv) {}
};

// Normalizes row r's O by its softmax denominator, the sink's term included, and returns the row's LSE. O and l
// are relative to 2^m_ref; the sink adds 2^(sink * log2e) to the denominator and nothing to O.
float finish_row(const OnlineSoftmaxRow& state, const float* sink, int64_t h, float* o, int64_t d) {
  float scale = state.l > 0.0f ? 1.0f / state.l : 0.0f;  // fully masked row: out 0
  float lse = state.lse();
  if (sink != nullptr) {
    const float s = sink[h] * kLog2e;
    if (state.l == 0.0f) {
      lse = sink[h];  // only the sink: out 0, lse = sink
    } else {
      const float m = std::max(state.m_ref, s);
      const float l = state.l * std::exp2(state.m_ref - m) + std::exp2(s - m);
      scale = std::exp2(state.m_ref - m) / l;
      lse = (m + std::log2(l)) * kLn2;
    }
  }
  for (int64_t x = 0; x < d; ++x) o[x] *= scale;
  return lse;
}

// x[0, n) *= the descale of (entry b, kv head hk): FP8 inputs become the real values (one fp32 rounding per
// element). Nothing to do without descale factors.
void scale_tile(float* x, int64_t n, const Descale& descale, int64_t b, int64_t hk) {
  if (descale.data == nullptr) return;
  const float f = descale.at(b, hk);
  for (int64_t i = 0; i < n; ++i) x[i] *= f;
}

// Rows [q0, q0 + kBlockM) of entry b, head h (args' views batched, see packed_rows.h).
FLASH4_CPU_MULTIVERSION void forward_tile(const ForwardArgs& args, const Problem& p, int64_t b, int64_t h,
                                          int64_t q0, ForwardTiles& t) {
  const detail::SequenceInfo seq = p.layout().info(b);
  if (q0 >= seq.seqlen_q) return;  // past this entry's queries (tasks cover the longest entry)
  const int64_t d = p.head_dim, dv = p.head_dim_v, hk = h / p.group(), e = entry_index(p, b);
  const int64_t rows = std::min<int64_t>(kBlockM, seq.seqlen_q - q0);
  const detail::ScoreTransform transform = p.score_transform();
  const detail::SequenceMask mask = p.sequence_mask(b);
  // kAuto means exact here: the CPU also serves fp32, where the polynomial's 8.8e-5 relative error would show.
  const bool polynomial = args.tuning.exp2 == Exp2Mode::kPolynomial;
  const bool conditional = args.tuning.conditional_rescale;

  OnlineSoftmaxRow state[kBlockM];
  std::fill(t.o.begin(), t.o.end(), 0.0f);
  load_rows(args.q, e, seq.q_offset + q0, rows, h, t.q.data());
  scale_tile(t.q.data(), rows * d, p.q_descale, b, hk);  // FP8: dequantize (no-op without descales)

  // Only the K tiles some row of this Q tile can see (causal / window skip the rest).
  const detail::IndexRange key_tiles = mask.key_tiles(q0, q0 + rows - 1, kBlockN);
  for (int64_t k0 = key_tiles.lo * kBlockN; k0 <= key_tiles.hi * kBlockN; k0 += kBlockN) {
    const int64_t n = std::min<int64_t>(kBlockN, seq.seqlen_k - k0);
    load_rows_transposed(args.k, e, seq.k_offset + k0, n, hk, t.kt.data(), n);
    load_rows(args.v, e, seq.k_offset + k0, n, hk, t.v.data());
    scale_tile(t.kt.data(), d * n, p.k_descale, b, hk);
    scale_tile(t.v.data(), n * dv, p.v_descale, b, hk);
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
        float* o = t.o.data() + r * dv;
        for (int64_t x = 0; x < dv; ++x) o[x] *= factor;
      }
      std::fill(row, row + span.begin, 0.0f);
      std::fill(row + span.end, row + n, 0.0f);
      exp2_row(row + span.begin, state[r].m_ref, row + span.begin, span.end - span.begin, polynomial);
      float sum = 0.0f;
      for (int64_t j = span.begin; j < span.end; ++j) sum += row[j];
      state[r].l += sum;
    }
    matmul_add(t.s.data(), t.v.data(), t.o.data(), rows, dv, n);  // O += P V
  }

  for (int64_t r = 0; r < rows; ++r) {
    const float lse = finish_row(state[r], p.learnable_sink, h, t.o.data() + r * dv, dv);
    if (args.lse.data) *lse_ptr(args.lse, e, h, seq.q_offset + q0 + r) = lse;
  }
  store_rows(t.o.data(), args.out, e, seq.q_offset + q0, rows, h);
}

}  // namespace

void cpu_forward(const ForwardArgs& user_args, const Problem& p) {
  if (cpu_decode_route(user_args, p)) return cpu_decode_forward(user_args, p);
  ForwardArgs args = user_args;
  args.q = batched_tokens(args.q);
  args.k = batched_tokens(args.k);
  args.v = batched_tokens(args.v);
  args.out = batched_tokens(args.out);
  args.lse = batched_lse(args.lse);
  // Rows no entry uses get out 0 and lse -inf (the header's contract), written first since tasks skip them.
  if (p.varlen() || p.seqused_q != nullptr) {
    const std::vector<char> covered = covered_rows(p, false);
    zero_uncovered(args.out, covered, row_grid(p, false));
    fill_uncovered_lse(args.lse, covered, row_grid(p, false));
  }
  const int64_t q_tiles = (longest_entry(p, false) + kBlockM - 1) / kBlockM;
  const int64_t tasks = p.batch * p.heads * q_tiles;
  parallel_for(tasks, [&](int64_t task) {
    ForwardTiles tiles(p.head_dim, p.head_dim_v);
    const int64_t qt = task % q_tiles, bh = task / q_tiles;
    forward_tile(args, p, bh / p.heads, bh % p.heads, qt * kBlockM, tiles);
  });
}

}  // namespace flash4::detail
