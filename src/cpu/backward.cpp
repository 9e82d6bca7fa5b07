// CPU FlashAttention backward. P is recomputed from the forward's LSE, so nothing of size seqlen_q x seqlen_k
// is stored. Two passes that each own their outputs, hence no atomics and a fixed summation order
// (deterministic by construction; the `deterministic` flag needs no extra work here):
//   1. per (batch, kv head, K tile): dV = sum P^T dO and dK = sum dS^T Q over every query head of the group
//      (GQA sums) and every Q tile;
//   2. per (batch, head, Q tile): dQ = sum dS K over the K tiles.
// The scores and dS are computed twice (once per pass): 7 tile products per tile pair instead of 5, the price
// of not sharing a dQ accumulator between threads. When the (batch, kv head) pairs alone keep the threads busy,
// one task per pair runs both passes at once instead (dkdv_dq_head): 5 products, the same additions in the same
// order, so the same bits. Dense and packed batches share the code (cpu/packed_rows.h).
// With a learnable sink, P = exp(S - LSE) is unchanged (LSE includes the sink) and
// dsink[h] = -sum_i exp(sink[h] - LSE_i) * D_i over every used row i of head h, summed in a fixed order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "api/backends.h"
#include "cpu/exp2_row.h"
#include "cpu/multiversion.h"
#include "cpu/packed_rows.h"
#include "common/parallel_for.h"
#include "cpu/score_transform.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace flash4::detail {
namespace {

using namespace flash4::cpu;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-row inputs of the backward, indexed (entry, head, row) of the batched views contiguously (see at()).
struct RowStats {
  std::vector<float> lse_log2;  // LSE * log2e, so P = exp2(t - lse_log2)
  std::vector<float> delta;     // D = rowsum(dO * O)
  int64_t rows = 0;             // rows per (entry, head)
  int64_t at(const Problem& p, int64_t b, int64_t h, int64_t row) const {
    return (entry_index(p, b) * p.heads + h) * rows + row;
  }
};

// d = head_dim (q, k, dq, dk), dv = head_dim_v (v, dout, dv).
struct BackwardTiles {
  std::vector<float> q, dout, kt, vt, k, p, ds, acc_a, acc_b;
  BackwardTiles(int64_t d, int64_t dv)
      : q(kBlockM * d), dout(kBlockM * dv), kt(d * kBlockN), vt(dv * kBlockN), k(kBlockN * d),
        p(kBlockM * kBlockN), ds(kBlockM * kBlockN), acc_a(std::max(kBlockM, kBlockN) * d),
        acc_b(std::max(kBlockM, kBlockN) * dv) {}
};

// D and LSE of every used row; with a sink and `dsink` requested also dsink (per task partial sums, added in
// task order so the result does not depend on the thread schedule).
RowStats row_stats(const BackwardArgs& args, const Problem& p, std::vector<double>* dsink) {
  RowStats st;
  const RowGrid grid = row_grid(p, false);
  const int64_t n = grid.size() * p.heads, d = p.head_dim_v;  // D sums over out's head_dim
  st.rows = grid.rows;
  st.lse_log2.assign(n, kNegInf);
  st.delta.assign(n, 0.0f);
  const int64_t q_tiles = (longest_entry(p, false) + kBlockM - 1) / kBlockM, tasks = p.batch * p.heads * q_tiles;
  std::vector<double> sink_partial(dsink ? tasks : 0, 0.0);
  const detail::SequenceLayout layout = p.layout();
  parallel_for(tasks, [&](int64_t task) {
    const int64_t q0 = task % q_tiles * kBlockM, bh = task / q_tiles, b = bh / p.heads, h = bh % p.heads;
    const detail::SequenceInfo seq = layout.info(b);
    if (q0 >= seq.seqlen_q) return;
    const int64_t rows = std::min<int64_t>(kBlockM, seq.seqlen_q - q0), e = entry_index(p, b);
    std::vector<float> o(rows * d), dout(rows * d);
    load_rows(args.out, e, seq.q_offset + q0, rows, h, o.data());
    load_rows(args.dout, e, seq.q_offset + q0, rows, h, dout.data());
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t x = 0; x < d; ++x) sum += o[r * d + x] * dout[r * d + x];
      const int64_t row = seq.q_offset + q0 + r, at = st.at(p, b, h, row);
      const float lse = *lse_ptr(args.lse, e, h, row);
      st.delta[at] = sum;
      st.lse_log2[at] = lse * kLog2e;
      if (dsink) sink_partial[task] -= std::exp(double{p.learnable_sink[h]} - lse) * sum;
    }
  });
  if (dsink) {
    dsink->assign(p.heads, 0.0);
    for (int64_t task = 0; task < tasks; ++task) (*dsink)[task / q_tiles % p.heads] += sink_partial[task];
  }
  return st;
}

// For Q rows [q0, q0 + rows) of head (b, h) against keys [k0, k0 + n) whose tiles (q, dout, kt, vt) are
// loaded: t.p = P and t.ds = dS = P * (dP - D) * d(softcap)/ds, both zero where masked.
FLASH4_CPU_MULTIVERSION void probabilities_and_ds(const Problem& p, const RowStats& st, int64_t b, int64_t h,
                                                  int64_t q0, int64_t rows, int64_t k0, int64_t n,
                                                  BackwardTiles& t) {
  const detail::ScoreTransform transform = p.score_transform();
  const detail::SequenceMask mask = p.sequence_mask(b);
  const int64_t stat0 = st.at(p, b, h, p.layout().info(b).q_offset + q0);
  matmul_set(t.q.data(), t.kt.data(), t.p.data(), rows, n, p.head_dim);         // S = Q K^T
  matmul_set(t.dout.data(), t.vt.data(), t.ds.data(), rows, n, p.head_dim_v);  // dP = dO V^T
  for (int64_t r = 0; r < rows; ++r) {
    float* pr = t.p.data() + r * n;
    float* dsr = t.ds.data() + r * n;
    const int64_t at = stat0 + r;
    const float lse_log2 = st.lse_log2[at], delta = st.delta[at];
    TileSpan span = tile_span(mask, q0 + r, k0, n);
    if (lse_log2 == kNegInf || span.empty()) span = {0, 0};  // no probability anywhere in this row of the tile
    std::fill(pr, pr + span.begin, 0.0f);
    std::fill(dsr, dsr + span.begin, 0.0f);
    std::fill(pr + span.end, pr + n, 0.0f);
    std::fill(dsr + span.end, dsr + n, 0.0f);
    if (transform.has_softcap()) {
      for (int64_t j = span.begin; j < span.end; ++j) {
        const float th = tanh_from_exp2(pr[j] * transform.tanh_scale);
        const float prob = exp2_accurate(transform.log2_scale * th - lse_log2);
        pr[j] = prob;
        dsr[j] = prob * (dsr[j] - delta) * (1.0f - th * th);
      }
    } else {  // without branches, so that it vectorizes
      for (int64_t j = span.begin; j < span.end; ++j) {
        const float prob = exp2_accurate(pr[j] * transform.log2_scale - lse_log2);
        pr[j] = prob;
        dsr[j] = prob * (dsr[j] - delta);
      }
    }
  }
}

// Pass 1: dK and dV of K/V rows [k0, k0 + n) of kv head (b, hk). With `dq_group` (fp32, the group's heads x the
// entry's queries x head_dim; null in pass 1) also dQ += dS K there, for the single pass (dkdv_dq_head).
FLASH4_CPU_MULTIVERSION void dkdv_tile(const BackwardArgs& args, const Problem& p, const RowStats& st, int64_t b,
                                       int64_t hk, int64_t k0, BackwardTiles& t, float* dq_group = nullptr) {
  const detail::SequenceInfo seq = p.layout().info(b);
  if (k0 >= seq.seqlen_k) return;  // past this entry's keys
  const int64_t d = p.head_dim, d_v = p.head_dim_v, n = std::min<int64_t>(kBlockN, seq.seqlen_k - k0);
  const int64_t e = entry_index(p, b);
  float* dk = t.acc_a.data();
  float* dv = t.acc_b.data();
  std::fill(dk, dk + n * d, 0.0f);
  std::fill(dv, dv + n * d_v, 0.0f);
  load_rows_transposed(args.k, e, seq.k_offset + k0, n, hk, t.kt.data(), n);
  load_rows_transposed(args.v, e, seq.k_offset + k0, n, hk, t.vt.data(), n);
  if (dq_group != nullptr) load_rows(args.k, e, seq.k_offset + k0, n, hk, t.k.data());
  const detail::SequenceMask mask = p.sequence_mask(b);
  for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
    for (int64_t q0 = 0; q0 < seq.seqlen_q; q0 += kBlockM) {
      const int64_t rows = std::min<int64_t>(kBlockM, seq.seqlen_q - q0);
      if (!mask.block_visible(q0, q0 + rows - 1, k0, k0 + n - 1)) continue;  // no row here sees these keys
      load_rows(args.q, e, seq.q_offset + q0, rows, h, t.q.data());
      load_rows(args.dout, e, seq.q_offset + q0, rows, h, t.dout.data());
      probabilities_and_ds(p, st, b, h, q0, rows, k0, n, t);
      matmul_add_at(t.p.data(), t.dout.data(), dv, n, d_v, rows);  // dV += P^T dO
      matmul_add_at(t.ds.data(), t.q.data(), dk, n, d, rows);    // dK += dS^T Q
      if (dq_group != nullptr) {                                   // dQ += dS K
        float* dq = dq_group + ((h - hk * p.group()) * seq.seqlen_q + q0) * d;
        matmul_add(t.ds.data(), t.k.data(), dq, rows, d, n);
      }
    }
  }
  for (int64_t x = 0; x < n * d; ++x) dk[x] *= p.softmax_scale;
  store_rows(dk, args.dk, e, seq.k_offset + k0, n, hk);
  store_rows(dv, args.dv, e, seq.k_offset + k0, n, hk);
}

// Pass 2: dQ of Q rows [q0, q0 + kBlockM) of head (b, h).
FLASH4_CPU_MULTIVERSION void dq_tile(const BackwardArgs& args, const Problem& p, const RowStats& st, int64_t b,
                                     int64_t h, int64_t q0, BackwardTiles& t) {
  const detail::SequenceInfo seq = p.layout().info(b);
  if (q0 >= seq.seqlen_q) return;  // past this entry's queries
  const int64_t d = p.head_dim, hk = h / p.group(), rows = std::min<int64_t>(kBlockM, seq.seqlen_q - q0);
  const int64_t e = entry_index(p, b);
  float* dq = t.acc_a.data();
  std::fill(dq, dq + rows * d, 0.0f);
  load_rows(args.q, e, seq.q_offset + q0, rows, h, t.q.data());
  load_rows(args.dout, e, seq.q_offset + q0, rows, h, t.dout.data());
  const detail::SequenceMask mask = p.sequence_mask(b);
  const detail::IndexRange key_tiles = mask.key_tiles(q0, q0 + rows - 1, kBlockN);
  for (int64_t k0 = key_tiles.lo * kBlockN; k0 <= key_tiles.hi * kBlockN; k0 += kBlockN) {
    const int64_t n = std::min<int64_t>(kBlockN, seq.seqlen_k - k0);
    load_rows_transposed(args.k, e, seq.k_offset + k0, n, hk, t.kt.data(), n);
    load_rows_transposed(args.v, e, seq.k_offset + k0, n, hk, t.vt.data(), n);
    load_rows(args.k, e, seq.k_offset + k0, n, hk, t.k.data());
    probabilities_and_ds(p, st, b, h, q0, rows, k0, n, t);
    matmul_add(t.ds.data(), t.k.data(), dq, rows, d, n);  // dQ += dS K
  }
  for (int64_t x = 0; x < rows * d; ++x) dq[x] *= p.softmax_scale;
  store_rows(dq, args.dq, e, seq.q_offset + q0, rows, h);
}

// Both passes for kv head (b, hk) in one task: its K tiles in order through dkdv_tile, which also adds dS K into
// fp32 dQ accumulators of the whole group (`dq`, task-local) in the key-tile order dq_tile adds them; the scores
// and dS once instead of twice.
FLASH4_CPU_MULTIVERSION void dkdv_dq_head(const BackwardArgs& args, const Problem& p, const RowStats& st, int64_t b,
                                          int64_t hk, BackwardTiles& t, std::vector<float>& dq) {
  const detail::SequenceInfo seq = p.layout().info(b);
  const int64_t d = p.head_dim, e = entry_index(p, b), group = p.group();
  dq.assign(static_cast<size_t>(group * seq.seqlen_q * d), 0.0f);
  for (int64_t k0 = 0; k0 < seq.seqlen_k; k0 += kBlockN) dkdv_tile(args, p, st, b, hk, k0, t, dq.data());
  for (float& x : dq) x *= p.softmax_scale;
  for (int64_t g = 0; g < group; ++g)
    store_rows(dq.data() + g * seq.seqlen_q * d, args.dq, e, seq.q_offset, seq.seqlen_q, hk * group + g);
}

// Whether the single-pass backward (dkdv_dq_head) runs: its (batch, kv head) tasks must keep every thread busy
// (two or more each, so that unequal packed sequences even out), and the dQ accumulators of the tasks running
// at once must stay small (64 MB each, 256 MB in all), so that many cores and long sequences do not make the
// backward allocate gigabytes the two passes do without.
bool single_pass(const Problem& p) {
  const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  const int64_t accumulator_bytes = p.group() * longest_entry(p, false) * p.head_dim * 4;
  return p.batch * p.heads_kv >= 2 * threads && accumulator_bytes <= (int64_t{64} << 20) &&
         accumulator_bytes * threads <= (int64_t{256} << 20);
}

}  // namespace

void cpu_backward(const BackwardArgs& user_args, const Problem& p, CpuBackwardPasses passes) {
  BackwardArgs args = user_args;
  for (TensorView* t : {&args.dout, &args.q, &args.k, &args.v, &args.out, &args.dq, &args.dk, &args.dv})
    *t = batched_tokens(*t);
  args.lse = batched_lse(args.lse);
  const bool want_dsink = p.learnable_sink != nullptr && args.dsink.data != nullptr;
  std::vector<double> dsink;
  const RowStats st = row_stats(args, p, want_dsink ? &dsink : nullptr);
  if (want_dsink)
    for (int64_t h = 0; h < p.heads; ++h) static_cast<float*>(args.dsink.data)[h] = static_cast<float>(dsink[h]);
  // Rows no entry uses get zero gradients (the header's contract), written first since tasks skip them. A
  // gradient without elements (no heads) has no rows to zero, however long its sequences: no row map is built.
  if ((p.varlen() || p.seqused_q != nullptr) && args.dq.numel() > 0)
    zero_uncovered(args.dq, covered_rows(p, false), row_grid(p, false));
  if ((p.varlen() || p.seqused_k != nullptr) && args.dk.numel() + args.dv.numel() > 0) {
    const std::vector<char> covered = covered_rows(p, true);
    zero_uncovered(args.dk, covered, row_grid(p, true));
    zero_uncovered(args.dv, covered, row_grid(p, true));
  }
  if (passes == CpuBackwardPasses::kSingle || (passes == CpuBackwardPasses::kAuto && single_pass(p))) {
    parallel_for(p.batch * p.heads_kv, [&](int64_t task) {
      BackwardTiles tiles(p.head_dim, p.head_dim_v);
      std::vector<float> dq;
      dkdv_dq_head(args, p, st, task / p.heads_kv, task % p.heads_kv, tiles, dq);
    });
    return;
  }
  const int64_t k_tiles = (longest_entry(p, true) + kBlockN - 1) / kBlockN;
  parallel_for(p.batch * p.heads_kv * k_tiles, [&](int64_t task) {
    BackwardTiles tiles(p.head_dim, p.head_dim_v);
    const int64_t bhk = task / k_tiles;
    dkdv_tile(args, p, st, bhk / p.heads_kv, bhk % p.heads_kv, task % k_tiles * kBlockN, tiles);
  });
  const int64_t q_tiles = (longest_entry(p, false) + kBlockM - 1) / kBlockM;
  parallel_for(p.batch * p.heads * q_tiles, [&](int64_t task) {
    BackwardTiles tiles(p.head_dim, p.head_dim_v);
    const int64_t bh = task / q_tiles;
    dq_tile(args, p, st, bh / p.heads, bh % p.heads, task % q_tiles * kBlockM, tiles);
  });
}

}  // namespace flash4::detail
