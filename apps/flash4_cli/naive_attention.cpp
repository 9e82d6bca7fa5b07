// Same-dtype naive attention (see naive_attention.h).
#include "naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "common/float_convert.h"

namespace flash4_cli {
namespace {

using flash4::DType;
using flash4::detail::Problem;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kBFloat16: return flash4::round_to_bf16(x);
    case DType::kFloat16: return flash4::round_to_half(x);
    case DType::kFloat32: return x;
  }
  return x;
}

// Runs fn(i) for i in [0, n) on all cores.
template <typename Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) fn(i);
    });
  for (auto& th : pool) th.join();
}

float dot(const double* a, const double* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return acc;
}

// Strided element access of the public layouts for one (batch, head).
struct Layout {
  const Problem& p;
  int64_t q_row(int64_t b, int64_t i, int64_t h) const { return ((b * p.seqlen_q + i) * p.heads + h) * p.head_dim; }
  int64_t k_row(int64_t b, int64_t j, int64_t h) const {
    return ((b * p.seqlen_k + j) * p.heads_kv + h / p.group()) * p.head_dim;
  }
  int64_t lse_at(int64_t b, int64_t h, int64_t i) const { return (b * p.heads + h) * p.seqlen_q + i; }
};

// Scores of query row i as the dtype holds them: rounded after the matmul, the scaling and the softcap.
// Also returns tanh(x / cap) per key for the softcap derivative. Masked keys get -inf.
void score_row(const Problem& p, DType dtype, const double* q, const double* k, const Layout& at, int64_t b,
               int64_t h, int64_t i, std::vector<float>& s, std::vector<float>& tanh_s) {
  const flash4::detail::KeyRange keys = flash4::detail::key_range(p, i);
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (j < keys.lo || j > keys.hi) {
      s[j] = kNegInf;
      continue;
    }
    float x = round_to(dtype, dot(q + at.q_row(b, i, h), k + at.k_row(b, j, h), p.head_dim));
    x = round_to(dtype, x * p.softmax_scale);
    if (p.softcap > 0.0f) {
      tanh_s[j] = round_to(dtype, std::tanh(x / p.softcap));
      x = round_to(dtype, p.softcap * tanh_s[j]);
    }
    s[j] = x;
  }
}

// Softmax of one score row in fp32, P rounded to the dtype. Returns the row's LSE (-inf when fully masked).
float softmax_row(DType dtype, const std::vector<float>& s, std::vector<float>& prob) {
  const float m = s.empty() ? kNegInf : *std::max_element(s.begin(), s.end());
  if (m == kNegInf) {
    std::fill(prob.begin(), prob.end(), 0.0f);
    return kNegInf;
  }
  float sum = 0.0f;
  for (size_t j = 0; j < s.size(); ++j) sum += std::exp(s[j] - m);
  for (size_t j = 0; j < s.size(); ++j) prob[j] = round_to(dtype, std::exp(s[j] - m) / sum);
  return m + std::log(sum);
}

}  // namespace

void naive_forward(const Problem& p, DType dtype, const double* q, const double* k, const double* v, double* out,
                   double* lse, const std::vector<int64_t>& rows) {
  std::vector<int64_t> all;
  if (rows.empty())
    for (int64_t i = 0; i < p.seqlen_q; ++i) all.push_back(i);
  const std::vector<int64_t>& which = rows.empty() ? all : rows;
  const Layout at{p};
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    std::vector<float> s(p.seqlen_k), tanh_s(p.seqlen_k), prob(p.seqlen_k), acc(p.head_dim);
    for (int64_t i : which) {
      score_row(p, dtype, q, k, at, b, h, i, s, tanh_s);
      lse[at.lse_at(b, h, i)] = softmax_row(dtype, s, prob);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < p.seqlen_k; ++j) {
        const double* vj = v + at.k_row(b, j, h);
        for (int64_t c = 0; c < p.head_dim; ++c) acc[c] += prob[j] * static_cast<float>(vj[c]);
      }
      double* o = out + at.q_row(b, i, h);
      for (int64_t c = 0; c < p.head_dim; ++c) o[c] = round_to(dtype, acc[c]);
    }
  });
}

void naive_backward(const Problem& p, DType dtype, const double* q, const double* k, const double* v,
                    const double* dout, double* dq, double* dk, double* dv) {
  const Layout at{p};
  const int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim;
  // dK and dV of one K/V head sum over its group of query heads in fp32, then round once.
  std::vector<float> dk_acc(p.batch * sk * p.heads_kv * d, 0.0f), dv_acc(dk_acc.size(), 0.0f);
  parallel_for(p.batch * p.heads_kv, [&](int64_t bhk) {
    const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
    std::vector<float> s(sk), tanh_s(sk, 0.0f), prob(sk), dprob(sk), dq_acc(d);
    for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        score_row(p, dtype, q, k, at, b, h, i, s, tanh_s);
        softmax_row(dtype, s, prob);
        const double* doi = dout + at.q_row(b, i, h);
        const double* qi = q + at.q_row(b, i, h);
        // dP = dO V^T (rounded); softmax backward in fp32: dS = P (dP - rowsum(P dP)), rounded.
        float delta = 0.0f;
        for (int64_t j = 0; j < sk; ++j) {
          dprob[j] = prob[j] == 0.0f ? 0.0f : round_to(dtype, dot(doi, v + at.k_row(b, j, h), d));
          delta += prob[j] * dprob[j];
        }
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
        for (int64_t j = 0; j < sk; ++j) {
          if (prob[j] == 0.0f) continue;
          float ds = round_to(dtype, prob[j] * (dprob[j] - delta));
          if (p.softcap > 0.0f) ds = round_to(dtype, ds * (1.0f - tanh_s[j] * tanh_s[j]));
          ds = round_to(dtype, ds * p.softmax_scale);
          const int64_t kj = at.k_row(b, j, h);
          for (int64_t c = 0; c < d; ++c) {
            dq_acc[c] += ds * static_cast<float>(k[kj + c]);
            dk_acc[kj + c] += ds * static_cast<float>(qi[c]);
            dv_acc[kj + c] += prob[j] * static_cast<float>(doi[c]);
          }
        }
        double* dqi = dq + at.q_row(b, i, h);
        for (int64_t c = 0; c < d; ++c) dqi[c] = round_to(dtype, dq_acc[c]);
      }
    }
  });
  for (size_t x = 0; x < dk_acc.size(); ++x) {
    dk[x] = round_to(dtype, dk_acc[x]);
    dv[x] = round_to(dtype, dv_acc[x]);
  }
}

}  // namespace flash4_cli
