// Naive FP8 attention (see naive_fp8_attention.h).
#include "check/naive_fp8_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "check/naive_attention.h"
#include "common/float_convert.h"
#include "common/parallel_for.h"
#include "reference/array_index.h"

namespace flash4::check {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double dot(const double* a, const double* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += a[x] * b[x];
  return s;
}

}  // namespace

ForwardResult naive_fp8_forward(const detail::Problem& p, DType out_dtype, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<int64_t>& rows) {
  const reference::ArrayIndex at{p};
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  ForwardResult res;
  res.out.assign(static_cast<size_t>(at.q_rows() * p.heads * dv), 0.0);
  res.lse.assign(static_cast<size_t>(at.lse_size()), rows.empty() ? kNegInf : 0.0);
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads, hk = h / p.group();
    const int64_t sq = at.info(b).seqlen_q, qb = at.q_base(b), kb = at.k_base(b);
    const double sink = p.learnable_sink ? double{p.learnable_sink[h]} : kNegInf;
    std::vector<int64_t> all;
    if (rows.empty())
      for (int64_t i = 0; i < sq; ++i) all.push_back(i);
    std::vector<double> s;
    for (int64_t i : rows.empty() ? all : rows) {
      if (i >= sq) continue;
      const detail::KeyRange r = p.sequence_mask(b).keys_of_row(i);
      const int64_t n = std::max<int64_t>(0, r.hi - r.lo + 1);
      s.resize(static_cast<size_t>(n));
      double m = sink;
      for (int64_t j = 0; j < n; ++j) {
        // fp32 scores, as in naive_attention.cpp: the accumulator every implementation holds them in.
        double score = static_cast<float>(dot(q.data() + at.q_row(qb, i, h), k.data() + at.k_row(kb, r.lo + j, hk), d));
        score = static_cast<float>(score * p.softmax_scale);
        if (p.softcap > 0.0f) score = p.softcap * std::tanh(score / p.softcap);
        s[j] = score;
        m = std::max(m, score);
      }
      double l = p.learnable_sink ? std::exp(sink - m) : 0.0;
      double* o = res.out.data() + at.out_row(qb, i, h);
      for (int64_t j = 0; j < n; ++j) {
        const double numerator = std::exp(s[j] - m);
        l += numerator;
        const double p_fp8 = round_to_e4m3(static_cast<float>(numerator));  // the FP8 operand of P~ V
        const double* vj = v.data() + at.v_row(kb, r.lo + j, hk);
        for (int64_t x = 0; x < dv; ++x) o[x] += p_fp8 * vj[x];
      }
      for (int64_t x = 0; x < dv; ++x) o[x] = l > 0.0 ? round_to_dtype(o[x] / l, out_dtype) : 0.0;
      res.lse[at.lse_at(b, h, i)] = l > 0.0 ? static_cast<float>(m + std::log(l)) : kNegInf;
    }
  });
  return res;
}

}  // namespace flash4::check
