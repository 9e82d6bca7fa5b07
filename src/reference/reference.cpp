// Naive fp64 attention (see reference.h). Written for obviousness, not speed: one score row at a time.
#include "reference/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <thread>

#include "common/float_convert.h"
#include "common/parallel_for.h"
#include "reference/array_index.h"

namespace flash4::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double dot(const double* a, const double* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += a[x] * b[x];
  return s;
}

// Softmax probabilities of one query row over keys [lo, lo + n); also returns the d(score)/d(q.k) factor per
// key (scale, times 1 - tanh^2 under softcap) and the row's log-sum-exp, the sink's term included. No keys and no
// sink: lse = -inf, no entries.
struct ScoreRow {
  int64_t lo = 0;
  std::vector<double> prob, dscore;
  double lse = kNegInf;
};

ScoreRow score_row(const detail::Problem& p, const ArrayIndex& at, const double* q, const double* k, int64_t b,
                   int64_t h, int64_t i) {
  ScoreRow row;
  const double sink = p.learnable_sink ? double{p.learnable_sink[h]} : kNegInf;
  const detail::KeyRange r = p.sequence_mask(b).keys_of_row(i);
  if (r.lo > r.hi) {
    row.lse = sink;
    return row;
  }
  const int64_t hk = h / p.group(), qb = at.q_base(b), kb = at.k_base(b);
  const int64_t n = r.hi - r.lo + 1;
  row.lo = r.lo;
  row.prob.resize(n);
  row.dscore.resize(n);
  const double scale = p.softmax_scale, cap = p.softcap;
  double m = sink;
  for (int64_t j = 0; j < n; ++j) {
    double s = dot(q + at.q_row(qb, i, h), k + at.k_row(kb, r.lo + j, hk), p.head_dim) * scale;
    row.dscore[j] = scale;
    if (cap > 0.0) {
      const double t = std::tanh(s / cap);
      s = cap * t;
      row.dscore[j] = scale * (1.0 - t * t);
    }
    row.prob[j] = s;
    m = std::max(m, s);
  }
  double sum = p.learnable_sink ? std::exp(sink - m) : 0.0;
  for (double& s : row.prob) sum += (s = std::exp(s - m));
  for (double& s : row.prob) s /= sum;
  row.lse = m + std::log(sum);
  return row;
}

}  // namespace

void forward(const detail::Problem& p, const double* q, const double* k, const double* v, double* out, double* lse,
             const std::vector<int64_t>& rows) {
  const ArrayIndex at{p};
  const int64_t dv = p.head_dim_v;
  if (rows.empty()) {  // rows that take part in no entry: out 0, lse -inf
    std::fill(out, out + at.q_rows() * p.heads * dv, 0.0);
    if (lse) std::fill(lse, lse + at.lse_size(), kNegInf);
  }
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads, hk = h / p.group();
    const int64_t sq = at.info(b).seqlen_q, qb = at.q_base(b), kb = at.k_base(b);
    std::vector<int64_t> all;
    if (rows.empty())
      for (int64_t i = 0; i < sq; ++i) all.push_back(i);
    for (int64_t i : rows.empty() ? all : rows) {
      if (i >= sq) continue;
      const ScoreRow row = score_row(p, at, q, k, b, h, i);
      double* o = out + at.out_row(qb, i, h);
      std::fill(o, o + dv, 0.0);
      for (size_t j = 0; j < row.prob.size(); ++j) {
        const double* vj = v + at.v_row(kb, row.lo + static_cast<int64_t>(j), hk);
        for (int64_t x = 0; x < dv; ++x) o[x] += row.prob[j] * vj[x];
      }
      if (lse) lse[at.lse_at(b, h, i)] = row.lse;
    }
  });
}

void backward(const detail::Problem& p, const double* q, const double* k, const double* v, const double* dout,
              double* dq, double* dk, double* dv, double* dsink) {
  const ArrayIndex at{p};
  const int64_t d = p.head_dim, d_v = p.head_dim_v;
  std::fill(dq, dq + at.q_rows() * p.heads * d, 0.0);
  std::fill(dk, dk + at.k_rows() * p.heads_kv * d, 0.0);
  std::fill(dv, dv + at.k_rows() * p.heads_kv * d_v, 0.0);
  // dsink per (entry, head), summed over the entries afterwards: tasks never share a write.
  std::vector<double> sink_partial(static_cast<size_t>(p.batch * p.heads), 0.0);
  // One task per (batch, kv head) owns dk/dv of that head and dq of its query heads: no shared writes (packed
  // entries own disjoint rows).
  parallel_for(p.batch * p.heads_kv, [&](int64_t bhk) {
    const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
    const int64_t sq = at.info(b).seqlen_q, qb = at.q_base(b), kb = at.k_base(b);
    std::vector<double> o(d_v), dp;
    for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        const ScoreRow row = score_row(p, at, q, k, b, h, i);
        const int64_t n = static_cast<int64_t>(row.prob.size());
        const double* qi = q + at.q_row(qb, i, h);
        const double* doi = dout + at.out_row(qb, i, h);
        std::fill(o.begin(), o.end(), 0.0);
        dp.assign(n, 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double* vj = v + at.v_row(kb, row.lo + j, hk);
          for (int64_t x = 0; x < d_v; ++x) o[x] += row.prob[j] * vj[x];
          dp[j] = dot(doi, vj, d_v);
        }
        const double delta = dot(doi, o.data(), d_v);  // D = rowsum(dO * O)
        // d loss / d sink = -P_sink * D with P_sink = exp(sink - lse) (the sink carries no value).
        if (p.learnable_sink) sink_partial[b * p.heads + h] -= std::exp(p.learnable_sink[h] - row.lse) * delta;
        double* dqi = dq + at.q_row(qb, i, h);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kj = at.k_row(kb, row.lo + j, hk), vj = at.v_row(kb, row.lo + j, hk);
          const double ds = row.prob[j] * (dp[j] - delta) * row.dscore[j];  // d loss / d (q.k)
          for (int64_t x = 0; x < d; ++x) {
            dqi[x] += ds * k[kj + x];
            dk[kj + x] += ds * qi[x];
          }
          for (int64_t x = 0; x < d_v; ++x) dv[vj + x] += row.prob[j] * doi[x];
        }
      }
    }
  });
  if (dsink) {
    std::fill(dsink, dsink + p.heads, 0.0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) dsink[h] += sink_partial[b * p.heads + h];
  }
}

namespace {

// Calls fn(element offset in the view, index in the contiguous copy) for every element of a rank-1..4 view.
template <typename Fn>
void for_each_element(const TensorView& t, Fn&& fn) {
  if (t.rank < 1 || t.rank > 4) throw std::invalid_argument("reference: tensor view must have rank 1 to 4");
  int64_t shape[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 0};
  const int pad = 4 - t.rank;  // treat rank 3 as (1, d0, d1, d2), and so on
  for (int i = 0; i < t.rank; ++i) {
    shape[i + pad] = t.shape[i];
    stride[i + pad] = t.stride[i];
  }
  int64_t flat = 0;
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t e = 0; e < shape[3]; ++e)
          fn(a * stride[0] + b * stride[1] + c * stride[2] + e * stride[3], flat++);
}

}  // namespace

std::vector<double> to_double(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kInt32: {
      const int32_t* src = static_cast<const int32_t*>(t.data);
      for_each_element(t, [&](int64_t off, int64_t i) { out[i] = src[off]; });
      break;
    }
    case DType::kFloat32: {
      const float* src = static_cast<const float*>(t.data);
      for_each_element(t, [&](int64_t off, int64_t i) { out[i] = src[off]; });
      break;
    }
    case DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data);
      for_each_element(t, [&](int64_t off, int64_t i) { out[i] = half_bits_to_float(src[off]); });
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data);
      for_each_element(t, [&](int64_t off, int64_t i) { out[i] = bf16_bits_to_float(src[off]); });
      break;
    }
    case DType::kFloat8E4M3: {  // the stored FP8 values; descale factors are the caller's to apply
      const uint8_t* src = static_cast<const uint8_t*>(t.data);
      for_each_element(t, [&](int64_t off, int64_t i) { out[i] = e4m3_bits_to_float(src[off]); });
      break;
    }
  }
  return out;
}

// fp64 -> fp32 -> 16-bit rounds twice; it differs from a direct rounding only when the fp32 value lands exactly on
// a 16-bit tie, which for test data is negligible.
void from_double(const std::vector<double>& src, const TensorView& dst) {
  if (static_cast<int64_t>(src.size()) != dst.numel()) throw std::invalid_argument("reference: size mismatch");
  switch (dst.dtype) {
    case DType::kInt32: {
      int32_t* out = static_cast<int32_t*>(dst.data);
      for_each_element(dst, [&](int64_t off, int64_t i) { out[off] = static_cast<int32_t>(std::lround(src[i])); });
      break;
    }
    case DType::kFloat32: {
      float* out = static_cast<float*>(dst.data);
      for_each_element(dst, [&](int64_t off, int64_t i) { out[off] = static_cast<float>(src[i]); });
      break;
    }
    case DType::kFloat16: {
      uint16_t* out = static_cast<uint16_t*>(dst.data);
      for_each_element(dst, [&](int64_t off, int64_t i) { out[off] = float_to_half_bits(static_cast<float>(src[i])); });
      break;
    }
    case DType::kBFloat16: {
      uint16_t* out = static_cast<uint16_t*>(dst.data);
      for_each_element(dst, [&](int64_t off, int64_t i) { out[off] = float_to_bf16_bits(static_cast<float>(src[i])); });
      break;
    }
    case DType::kFloat8E4M3: {
      uint8_t* out = static_cast<uint8_t*>(dst.data);
      for_each_element(dst, [&](int64_t off, int64_t i) { out[off] = float_to_e4m3_bits(static_cast<float>(src[i])); });
      break;
    }
  }
}

}  // namespace flash4::reference
