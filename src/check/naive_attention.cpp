// Same-dtype naive attention (see naive_attention.h).
#include "check/naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/float_convert.h"
#include "common/parallel_for.h"

namespace flash4::check {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

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

// One query row: keys [lo, lo + prob.size()), P rounded to the dtype, softcap derivative factor per key.
struct Row {
  int64_t lo = 0;
  std::vector<double> prob, dscore;
  double lse = kNegInf;
};

Row softmax_row(const detail::Problem& p, DType dtype, const double* qi, const double* k, int64_t b, int64_t hk,
                int64_t i) {
  Row row;
  const detail::KeyRange r = detail::key_range(p, i);
  if (r.lo > r.hi) return row;
  row.lo = r.lo;
  const int64_t n = r.hi - r.lo + 1, d = p.head_dim;
  row.prob.resize(n);
  row.dscore.assign(n, 1.0);
  double m = kNegInf;
  for (int64_t j = 0; j < n; ++j) {
    // The score matrix as every implementation holds it: an fp32 accumulator (see naive_attention.h).
    double s = static_cast<float>(dot(qi, k + ((b * p.seqlen_k + r.lo + j) * p.heads_kv + hk) * d, d));
    s = static_cast<float>(s * p.softmax_scale);
    if (p.softcap > 0.0f) {
      const double t = std::tanh(s / p.softcap);
      s = p.softcap * t;
      row.dscore[j] = 1.0 - t * t;
    }
    row.prob[j] = s;
    m = std::max(m, s);
  }
  double sum = 0.0;
  for (double& s : row.prob) sum += (s = std::exp(s - m));
  for (double& s : row.prob) s = round_to_dtype(s / sum, dtype);
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
  const int64_t d = p.head_dim;
  ForwardResult res;
  res.out.assign(static_cast<size_t>(p.batch * p.seqlen_q * p.heads * d), 0.0);
  res.lse.assign(static_cast<size_t>(p.batch * p.heads * p.seqlen_q), 0.0);
  std::vector<int64_t> which = rows;
  if (which.empty())
    for (int64_t i = 0; i < p.seqlen_q; ++i) which.push_back(i);
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads, hk = h / p.group();
    for (int64_t i : which) {
      const int64_t qo = ((b * p.seqlen_q + i) * p.heads + h) * d;
      const Row row = softmax_row(p, dtype, q.data() + qo, k.data(), b, hk, i);
      for (size_t j = 0; j < row.prob.size(); ++j) {
        const double* vj = v.data() + ((b * p.seqlen_k + row.lo + static_cast<int64_t>(j)) * p.heads_kv + hk) * d;
        for (int64_t x = 0; x < d; ++x) res.out[qo + x] += row.prob[j] * vj[x];
      }
      for (int64_t x = 0; x < d; ++x) res.out[qo + x] = round_to_dtype(res.out[qo + x], dtype);
      res.lse[(b * p.heads + h) * p.seqlen_q + i] = static_cast<float>(row.lse);
    }
  });
  return res;
}

Gradients naive_backward(const detail::Problem& p, DType dtype, const std::vector<double>& q_in,
                         const std::vector<double>& k_in, const std::vector<double>& v_in,
                         const std::vector<double>& dout_in) {
  const std::vector<double> q = rounded(q_in, dtype), k = rounded(k_in, dtype), v = rounded(v_in, dtype);
  const std::vector<double> dout = rounded(dout_in, dtype);
  const int64_t d = p.head_dim;
  Gradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  // One task per (batch, kv head): it owns dk/dv of that head and dq of the query heads that share it.
  parallel_for(p.batch * p.heads_kv, [&](int64_t bhk) {
    const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
    for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t qo = ((b * p.seqlen_q + i) * p.heads + h) * d;
        const Row row = softmax_row(p, dtype, q.data() + qo, k.data(), b, hk, i);
        const int64_t n = static_cast<int64_t>(row.prob.size());
        std::vector<double> dp(n);
        double delta = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double* vj = v.data() + ((b * p.seqlen_k + row.lo + j) * p.heads_kv + hk) * d;
          dp[j] = round_to_dtype(dot(dout.data() + qo, vj, d), dtype);
          delta += row.prob[j] * dp[j];
        }
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ko = ((b * p.seqlen_k + row.lo + j) * p.heads_kv + hk) * d;
          const double ds = round_to_dtype(row.prob[j] * (dp[j] - delta) * row.dscore[j], dtype);
          for (int64_t x = 0; x < d; ++x) {
            g.dq[qo + x] += ds * k[ko + x];
            g.dk[ko + x] += ds * q[qo + x];
            g.dv[ko + x] += row.prob[j] * dout[qo + x];
          }
        }
      }
    }
  });
  for (double& x : g.dq) x = round_to_dtype(x * p.softmax_scale, dtype);
  for (double& x : g.dk) x = round_to_dtype(x * p.softmax_scale, dtype);
  for (double& x : g.dv) x = round_to_dtype(x, dtype);
  return g;
}

}  // namespace flash4::check
