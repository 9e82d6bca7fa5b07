// Same-dtype naive attention (see naive_attention.h).
#include "check/naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/float_convert.h"
#include "common/parallel_for.h"
#include "reference/array_index.h"

namespace flash4::check {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
using reference::ArrayIndex;

std::vector<double> rounded(const std::vector<double>& x, DType dtype) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = round_to_dtype(x[i], dtype);
  return out;
}

double dot(const double* a, const double* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += a[x] * b[x];
  return s;
}

// One query row: keys [lo, lo + prob.size()), P rounded to the dtype, softcap derivative factor per key, and
// the sink's probability (rounded like P: a plain implementation appends the sink as one more score column).
struct Row {
  int64_t lo = 0;
  std::vector<double> prob, dscore;
  double sink_prob = 0.0;
  double lse = kNegInf;
};

Row softmax_row(const detail::Problem& p, DType dtype, const ArrayIndex& at, const double* qi, const double* k,
                int64_t b, int64_t h, int64_t i) {
  Row row;
  const double sink = p.learnable_sink ? double{p.learnable_sink[h]} : kNegInf;
  const detail::KeyRange r = p.sequence_mask(b).keys_of_row(i);
  if (r.lo > r.hi) {
    row.lse = sink;
    row.sink_prob = p.learnable_sink ? 1.0 : 0.0;
    return row;
  }
  row.lo = r.lo;
  const int64_t n = r.hi - r.lo + 1, d = p.head_dim, hk = h / p.group(), kb = at.k_base(b);
  row.prob.resize(n);
  row.dscore.assign(n, 1.0);
  double m = sink;
  for (int64_t j = 0; j < n; ++j) {
    // The score matrix as every implementation holds it: an fp32 accumulator (see naive_attention.h).
    double s = static_cast<float>(dot(qi, k + at.k_row(kb, r.lo + j, hk), d));
    s = static_cast<float>(s * p.softmax_scale);
    if (p.softcap > 0.0f) {
      const double t = std::tanh(s / p.softcap);
      s = p.softcap * t;
      row.dscore[j] = 1.0 - t * t;
    }
    row.prob[j] = s;
    m = std::max(m, s);
  }
  double sum = p.learnable_sink ? std::exp(sink - m) : 0.0;
  for (double& s : row.prob) sum += (s = std::exp(s - m));
  for (double& s : row.prob) s = round_to_dtype(s / sum, dtype);
  if (p.learnable_sink) row.sink_prob = round_to_dtype(std::exp(sink - m) / sum, dtype);
  row.lse = m + std::log(sum);
  return row;
}

}  // namespace

double round_to_dtype(double x, DType dtype) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case DType::kFloat16:
      return round_to_half(f);
    case DType::kBFloat16:
      return round_to_bf16(f);
    case DType::kFloat8E4M3:
      return round_to_e4m3(f);
    case DType::kFloat32:
    case DType::kInt32:  // not an attention dtype; no rounding beyond fp32
      break;
  }
  return f;
}

ForwardResult naive_forward(const detail::Problem& p, DType dtype, const std::vector<double>& q_in,
                            const std::vector<double>& k_in, const std::vector<double>& v_in,
                            const std::vector<int64_t>& rows) {
  const std::vector<double> q = rounded(q_in, dtype), k = rounded(k_in, dtype), v = rounded(v_in, dtype);
  const ArrayIndex at{p};
  const int64_t dv = p.head_dim_v;
  ForwardResult res;
  res.out.assign(static_cast<size_t>(at.q_rows() * p.heads * dv), 0.0);
  // Rows in no entry: -inf as the API defines (0 where rows are sampled: the unlisted rows are 0 in the result).
  res.lse.assign(static_cast<size_t>(at.lse_size()), rows.empty() ? kNegInf : 0.0);
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads, hk = h / p.group();
    const int64_t sq = at.info(b).seqlen_q, qb = at.q_base(b), kb = at.k_base(b);
    std::vector<int64_t> all;
    if (rows.empty())
      for (int64_t i = 0; i < sq; ++i) all.push_back(i);
    for (int64_t i : rows.empty() ? all : rows) {
      if (i >= sq) continue;
      const int64_t qo = at.q_row(qb, i, h), oo = at.out_row(qb, i, h);
      const Row row = softmax_row(p, dtype, at, q.data() + qo, k.data(), b, h, i);
      for (size_t j = 0; j < row.prob.size(); ++j) {
        const double* vj = v.data() + at.v_row(kb, row.lo + static_cast<int64_t>(j), hk);
        for (int64_t x = 0; x < dv; ++x) res.out[oo + x] += row.prob[j] * vj[x];
      }
      for (int64_t x = 0; x < dv; ++x) res.out[oo + x] = round_to_dtype(res.out[oo + x], dtype);
      res.lse[at.lse_at(b, h, i)] = static_cast<float>(row.lse);
    }
  });
  return res;
}

Gradients naive_backward(const detail::Problem& p, DType dtype, const std::vector<double>& q_in,
                         const std::vector<double>& k_in, const std::vector<double>& v_in,
                         const std::vector<double>& out_in, const std::vector<double>& dout_in) {
  const std::vector<double> q = rounded(q_in, dtype), k = rounded(k_in, dtype), v = rounded(v_in, dtype);
  const std::vector<double> out = rounded(out_in, dtype), dout = rounded(dout_in, dtype);
  const ArrayIndex at{p};
  const int64_t d = p.head_dim, d_v = p.head_dim_v;
  Gradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  std::vector<double> sink_partial(static_cast<size_t>(p.batch * p.heads), 0.0);
  std::vector<double> sink_bound(static_cast<size_t>(p.batch * p.heads), 0.0);  // before the unit roundoff
  // One task per (batch, kv head): it owns dk/dv of that head and dq of the query heads that share it.
  parallel_for(p.batch * p.heads_kv, [&](int64_t bhk) {
    const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
    const int64_t sq = at.info(b).seqlen_q, qb = at.q_base(b), kb = at.k_base(b);
    for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t qo = at.q_row(qb, i, h), oo = at.out_row(qb, i, h);
        const Row row = softmax_row(p, dtype, at, q.data() + qo, k.data(), b, h, i);
        const int64_t n = static_cast<int64_t>(row.prob.size());
        std::vector<double> dp(n);
        for (int64_t j = 0; j < n; ++j) {
          const double* vj = v.data() + at.v_row(kb, row.lo + j, hk);
          dp[j] = round_to_dtype(dot(dout.data() + oo, vj, d_v), dtype);
        }
        // D = rowsum(dO * O) from the stored O the implementation was given: where dP - D cancels (rows that
        // see few keys) O's rounding dominates dS, and it must be the same draw of that rounding as the impl's.
        const double* o_row = out.data() + oo;
        const double delta = dot(dout.data() + oo, o_row, d_v);
        // The sink column's dS = P_sink * (0 - D): it carries no value, so its dP is 0.
        if (p.learnable_sink) {
          sink_partial[b * p.heads + h] += round_to_dtype(-row.sink_prob * delta, dtype);
          double abs_dot = 0.0;
          for (int64_t x = 0; x < d_v; ++x) abs_dot += std::abs(dout[oo + x] * o_row[x]);
          sink_bound[b * p.heads + h] += row.sink_prob * abs_dot;
        }
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ko = at.k_row(kb, row.lo + j, hk), vo = at.v_row(kb, row.lo + j, hk);
          const double ds = round_to_dtype(row.prob[j] * (dp[j] - delta) * row.dscore[j], dtype);
          for (int64_t x = 0; x < d; ++x) {
            g.dq[qo + x] += ds * k[ko + x];
            g.dk[ko + x] += ds * q[qo + x];
          }
          for (int64_t x = 0; x < d_v; ++x) g.dv[vo + x] += row.prob[j] * dout[oo + x];
        }
      }
    }
  });
  for (double& x : g.dq) x = round_to_dtype(x * p.softmax_scale, dtype);
  for (double& x : g.dk) x = round_to_dtype(x * p.softmax_scale, dtype);
  for (double& x : g.dv) x = round_to_dtype(x, dtype);
  if (p.learnable_sink) {
    g.dsink.assign(static_cast<size_t>(p.heads), 0.0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) g.dsink[h] += sink_partial[b * p.heads + h];
    for (double& x : g.dsink) x = static_cast<float>(x);  // dsink is fp32 in every API
    const double u = dtype == DType::kBFloat16 ? 0x1p-8 : dtype == DType::kFloat16 ? 0x1p-11
                   : dtype == DType::kFloat8E4M3 ? 0x1p-4 : 0x1p-24;  // unit roundoff of O's dtype
    for (int64_t h = 0; h < p.heads; ++h) {
      double bound = 0.0;
      for (int64_t b = 0; b < p.batch; ++b) bound += sink_bound[b * p.heads + h];
      g.dsink_rounding_bound = std::max(g.dsink_rounding_bound, u * bound);
    }
  }
  return g;
}

}  // namespace flash4::check
