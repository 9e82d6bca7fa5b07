// CPU FlashAttention backward. P is recomputed from the forward's LSE, so nothing of size seqlen_q x seqlen_k
// is stored. Two passes that each own their outputs, hence no atomics and a fixed summation order
// (deterministic by construction; the `deterministic` flag needs no extra work here):
//   1. per (batch, kv head, K tile): dV = sum P^T dO and dK = sum dS^T Q over every query head of the group
//      (GQA sums) and every Q tile;
//   2. per (batch, head, Q tile): dQ = sum dS K over the K tiles.
// The scores and dS are computed twice (once per pass): 7 tile products per tile pair instead of 5, the price
// of not sharing a dQ accumulator between threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "api/backends.h"
#include "cpu/multiversion.h"
#include "common/parallel_for.h"
#include "cpu/score_transform.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace flash4::detail {
namespace {

using namespace flash4::cpu;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-row inputs of the backward, indexed (batch, head, row) contiguously.
struct RowStats {
  std::vector<float> lse_log2;  // LSE * log2e, so P = exp2(t - lse_log2)
  std::vector<float> delta;     // D = rowsum(dO * O)
};

struct BackwardTiles {
  std::vector<float> q, dout, kt, vt, k, p, ds, acc_a, acc_b;
  explicit BackwardTiles(int64_t d)
      : q(kBlockM * d), dout(kBlockM * d), kt(d * kBlockN), vt(d * kBlockN), k(kBlockN * d),
        p(kBlockM * kBlockN), ds(kBlockM * kBlockN), acc_a(std::max(kBlockM, kBlockN) * d),
        acc_b(std::max(kBlockM, kBlockN) * d) {}
};

RowStats row_stats(const BackwardArgs& args, const Problem& p) {
  RowStats st;
  const int64_t n = p.batch * p.heads * p.seqlen_q, d = p.head_dim;
  st.lse_log2.resize(n);
  st.delta.resize(n);
  const int64_t q_tiles = (p.seqlen_q + kBlockM - 1) / kBlockM;
  parallel_for(p.batch * p.heads * q_tiles, [&](int64_t task) {
    const int64_t q0 = task % q_tiles * kBlockM, bh = task / q_tiles, b = bh / p.heads, h = bh % p.heads;
    const int64_t rows = std::min<int64_t>(kBlockM, p.seqlen_q - q0);
    std::vector<float> o(rows * d), dout(rows * d);
    load_rows(args.out, b, q0, rows, h, o.data());
    load_rows(args.dout, b, q0, rows, h, dout.data());
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t x = 0; x < d; ++x) sum += o[r * d + x] * dout[r * d + x];
      const int64_t at = bh * p.seqlen_q + q0 + r;
      st.delta[at] = sum;
      st.lse_log2[at] = *lse_ptr(args.lse, b, h, q0 + r) * kLog2e;
    }
  });
  return st;
}

// For Q rows [q0, q0 + rows) of head (b, h) against keys [k0, k0 + n) whose tiles (q, dout, kt, vt) are
// loaded: t.p = P and t.ds = dS = P * (dP - D) * d(softcap)/ds, both zero where masked.
void probabilities_and_ds(const Problem& p, const RowStats& st, int64_t bh, int64_t q0, int64_t rows, int64_t k0,
                          int64_t n, BackwardTiles& t) {
  const detail::ScoreTransform transform = p.score_transform();
  const detail::SequenceMask mask = p.sequence_mask(bh / p.heads);
  const int64_t d = p.head_dim;
  matmul_set(t.q.data(), t.kt.data(), t.p.data(), rows, n, d);      // S = Q K^T
  matmul_set(t.dout.data(), t.vt.data(), t.ds.data(), rows, n, d);  // dP = dO V^T
  for (int64_t r = 0; r < rows; ++r) {
    float* pr = t.p.data() + r * n;
    float* dsr = t.ds.data() + r * n;
    const int64_t at = bh * p.seqlen_q + q0 + r;
    const float lse_log2 = st.lse_log2[at], delta = st.delta[at];
    TileSpan span = tile_span(mask, q0 + r, k0, n);
    if (lse_log2 == kNegInf) span = {0, 0};  // fully masked row: no probability anywhere
    for (int64_t j = 0; j < n; ++j) {
      if (j < span.begin || j >= span.end) {
        pr[j] = 0.0f;
        dsr[j] = 0.0f;
        continue;
      }
      float score = pr[j], dscore = 1.0f;
      if (transform.has_softcap()) {
        const float th = std::tanh(score * transform.tanh_scale);
        score = transform.log2_scale * th;
        dscore = 1.0f - th * th;
      } else {
        score *= transform.log2_scale;
      }
      const float prob = std::exp2(score - lse_log2);
      pr[j] = prob;
      dsr[j] = prob * (dsr[j] - delta) * dscore;
    }
  }
}

// Pass 1: dK and dV of K/V rows [k0, k0 + n) of kv head (b, hk).
FLASH4_CPU_MULTIVERSION void dkdv_tile(const BackwardArgs& args, const Problem& p, const RowStats& st, int64_t b, int64_t hk, int64_t k0,
               BackwardTiles& t) {
  const int64_t d = p.head_dim, n = std::min<int64_t>(kBlockN, p.seqlen_k - k0);
  float* dk = t.acc_a.data();
  float* dv = t.acc_b.data();
  std::fill(dk, dk + n * d, 0.0f);
  std::fill(dv, dv + n * d, 0.0f);
  load_rows_transposed(args.k, b, k0, n, hk, t.kt.data(), n);
  load_rows_transposed(args.v, b, k0, n, hk, t.vt.data(), n);
  const detail::SequenceMask mask = p.sequence_mask(b);
  for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
    for (int64_t q0 = 0; q0 < p.seqlen_q; q0 += kBlockM) {
      const int64_t rows = std::min<int64_t>(kBlockM, p.seqlen_q - q0);
      if (!mask.block_visible(q0, q0 + rows - 1, k0, k0 + n - 1)) continue;  // no row here sees these keys
      load_rows(args.q, b, q0, rows, h, t.q.data());
      load_rows(args.dout, b, q0, rows, h, t.dout.data());
      probabilities_and_ds(p, st, b * p.heads + h, q0, rows, k0, n, t);
      matmul_add_at(t.p.data(), t.dout.data(), dv, n, d, rows);  // dV += P^T dO
      matmul_add_at(t.ds.data(), t.q.data(), dk, n, d, rows);    // dK += dS^T Q
    }
  }
  for (int64_t x = 0; x < n * d; ++x) dk[x] *= p.softmax_scale;
  store_rows(dk, args.dk, b, k0, n, hk);
  store_rows(dv, args.dv, b, k0, n, hk);
}

// Pass 2: dQ of Q rows [q0, q0 + kBlockM) of head (b, h).
FLASH4_CPU_MULTIVERSION void dq_tile(const BackwardArgs& args, const Problem& p, const RowStats& st, int64_t b, int64_t h, int64_t q0,
             BackwardTiles& t) {
  const int64_t d = p.head_dim, hk = h / p.group(), rows = std::min<int64_t>(kBlockM, p.seqlen_q - q0);
  float* dq = t.acc_a.data();
  std::fill(dq, dq + rows * d, 0.0f);
  load_rows(args.q, b, q0, rows, h, t.q.data());
  load_rows(args.dout, b, q0, rows, h, t.dout.data());
  const detail::SequenceMask mask = p.sequence_mask(b);
  const detail::IndexRange key_tiles = mask.key_tiles(q0, q0 + rows - 1, kBlockN);
  for (int64_t k0 = key_tiles.lo * kBlockN; k0 <= key_tiles.hi * kBlockN; k0 += kBlockN) {
    const int64_t n = std::min<int64_t>(kBlockN, p.seqlen_k - k0);
    load_rows_transposed(args.k, b, k0, n, hk, t.kt.data(), n);
    load_rows_transposed(args.v, b, k0, n, hk, t.vt.data(), n);
    load_rows(args.k, b, k0, n, hk, t.k.data());
    probabilities_and_ds(p, st, b * p.heads + h, q0, rows, k0, n, t);
    matmul_add(t.ds.data(), t.k.data(), dq, rows, d, n);  // dQ += dS K
  }
  for (int64_t x = 0; x < rows * d; ++x) dq[x] *= p.softmax_scale;
  store_rows(dq, args.dq, b, q0, rows, h);
}

}  // namespace

void cpu_backward(const BackwardArgs& args, const Problem& p) {
  const RowStats st = row_stats(args, p);
  const int64_t k_tiles = (p.seqlen_k + kBlockN - 1) / kBlockN;
  parallel_for(p.batch * p.heads_kv * k_tiles, [&](int64_t task) {
    BackwardTiles tiles(p.head_dim);
    const int64_t bhk = task / k_tiles;
    dkdv_tile(args, p, st, bhk / p.heads_kv, bhk % p.heads_kv, task % k_tiles * kBlockN, tiles);
  });
  const int64_t q_tiles = (p.seqlen_q + kBlockM - 1) / kBlockM;
  parallel_for(p.batch * p.heads * q_tiles, [&](int64_t task) {
    BackwardTiles tiles(p.head_dim);
    const int64_t bh = task / q_tiles;
    dq_tile(args, p, st, bh / p.heads, bh % p.heads, task % q_tiles * kBlockM, tiles);
  });
}

}  // namespace flash4::detail
