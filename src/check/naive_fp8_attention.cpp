// Naive FP8 attention (see naive_fp8_attention.h).
#include "check/naive_fp8_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "check/naive_attention.h"
#include "common/float_convert.h"
#include "common/parallel_for.h"
#include "common/score_transform.h"
#include "reference/array_index.h"

namespace flash4::check {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A value truncated toward zero to `bits` fraction bits below the exponent of `largest`.
double truncated(double x, double largest, int bits) {
  int e = 0;
  std::frexp(largest, &e);  // largest in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, e - 1 - bits);
  return std::trunc(x / quantum) * quantum;
}

// acc + sum of terms[0 .. n): exact (then fp32) for the fp32 model. For the tensor-core model every addend is
// first truncated to the model's fraction bits below the largest exponent among them, the sum formed exactly
// (the addends are multiples of one quantum below 2^(bits + 1) quanta each) and truncated again to the same bits
// below its own leading one.
double accumulate(double acc, const double* terms, int64_t n, int64_t stride, const Fp8Arithmetic& a) {
  if (a.mma_block == 0) {
    for (int64_t i = 0; i < n; ++i) acc += terms[i * stride];
    return acc;
  }
  double largest = std::fabs(acc);
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(terms[i * stride]));
  if (largest == 0.0) return 0.0;
  double s = truncated(acc, largest, a.mma_fraction_bits);
  for (int64_t i = 0; i < n; ++i) s += truncated(terms[i * stride], largest, a.mma_fraction_bits);
  return s == 0.0 ? 0.0 : static_cast<float>(truncated(s, std::fabs(s), a.mma_fraction_bits));
}

// q . k over d elements in steps of the model's block.
double dot(const double* q, const double* k, int64_t d, const Fp8Arithmetic& a, std::vector<double>& products) {
  products.resize(static_cast<size_t>(d));
  for (int64_t x = 0; x < d; ++x) products[x] = q[x] * k[x];
  const int64_t step = a.mma_block == 0 ? d : a.mma_block;
  double s = 0.0;
  for (int64_t x = 0; x < d; x += step) s = accumulate(s, products.data() + x, std::min(step, d - x), 1, a);
  return s;
}

}  // namespace

ForwardResult naive_fp8_forward(const detail::Problem& p, DType out_dtype, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<int64_t>& rows, Fp8Arithmetic arithmetic) {
  const Fp8Arithmetic& a = arithmetic;
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
    std::vector<double> s, products, pv, q_row, k_row, o(static_cast<size_t>(dv));
    for (int64_t i : rows.empty() ? all : rows) {
      if (i >= sq) continue;
      const detail::KeyRange r = p.sequence_mask(b).keys_of_row(i);
      const int64_t n = std::max<int64_t>(0, r.hi - r.lo + 1);
      s.resize(static_cast<size_t>(n));
      // The tensor-core model multiplies the FP8 values themselves (x / descale, exact) and applies the descales
      // after the matmuls, as a kernel does: truncation then cuts the FP8 products' few bits, not the long
      // mantissas of dequantized ones.
      const bool raw = a.mma_block > 0;
      const double qd = raw ? p.q_descale.at(b, hk) : 1.0, kd = raw ? p.k_descale.at(b, hk) : 1.0;
      const double vd = raw ? p.v_descale.at(b, hk) : 1.0;
      const double* qi = q.data() + at.q_row(qb, i, h);
      q_row.resize(static_cast<size_t>(d));
      for (int64_t x = 0; x < d; ++x) q_row[x] = qi[x] / qd;
      const double score_scale = raw ? static_cast<float>(p.softmax_scale * static_cast<float>(qd * kd)) : p.softmax_scale;
      for (int64_t j = 0; j < n; ++j) {
        const double* kj = k.data() + at.k_row(kb, r.lo + j, hk);
        k_row.resize(static_cast<size_t>(d));
        for (int64_t x = 0; x < d; ++x) k_row[x] = kj[x] / kd;
        // Held in fp32 (the accumulator every implementation holds scores in), scaled in fp32.
        double score = static_cast<float>(dot(q_row.data(), k_row.data(), d, a, products));
        score = static_cast<float>(score * score_scale);
        if (p.softcap > 0.0f) score = p.softcap * std::tanh(score / p.softcap);
        s[j] = score;
      }
      // Key tiles [first, last) of the row, walked as the model says: one tile of every key with the row's max
      // as the reference, or tiles of a.tile_keys (aligned to key 0) from the last.
      struct Tile {
        int64_t first, last;
      };
      std::vector<Tile> tiles;
      if (a.tile_keys == 0 || n == 0) {
        tiles.push_back({0, n});
      } else {
        for (int64_t t = (r.lo + n - 1) / a.tile_keys; t >= r.lo / a.tile_keys; --t)
          tiles.push_back({std::max(t * a.tile_keys, r.lo) - r.lo, std::min((t + 1) * a.tile_keys, r.lo + n) - r.lo});
      }
      // The fp32 model's reference is the max over the keys and the sink; the tiled one's starts at its first
      // tile's max (the kernel adds the sink's term at the end).
      double m = a.tile_keys == 0 ? sink : kNegInf, l = 0.0;
      std::fill(o.begin(), o.end(), 0.0);
      for (const Tile& tile : tiles) {
        double m_tile = kNegInf;
        for (int64_t j = tile.first; j < tile.last; ++j) m_tile = std::max(m_tile, s[j]);
        if (a.tile_keys == 0) {
          m = std::max(m, m_tile);
        } else if (m == kNegInf) {
          m = m_tile;
        } else if ((m_tile - m) * detail::kLog2e > a.rescale_threshold_log2) {
          const double factor = static_cast<float>(std::exp(m - m_tile));
          for (double& x : o) x = static_cast<float>(x * factor);
          l *= factor;
          m = m_tile;
        }
        const int64_t step = a.mma_block == 0 ? 32 : a.mma_block;
        for (int64_t j0 = tile.first; j0 < tile.last; j0 += step) {
          const int64_t keys = std::min(step, tile.last - j0);
          pv.resize(static_cast<size_t>(keys * dv));
          for (int64_t j = 0; j < keys; ++j) {
            const double numerator = std::exp(s[j0 + j] - m);
            l += numerator;
            const double p_fp8 = round_to_e4m3(static_cast<float>(numerator));  // the FP8 operand of P~ V
            const double* vj = v.data() + at.v_row(kb, r.lo + j0 + j, hk);
            for (int64_t x = 0; x < dv; ++x) pv[j * dv + x] = p_fp8 * (vj[x] / vd);
          }
          for (int64_t x = 0; x < dv; ++x) o[x] = accumulate(o[x], pv.data() + x, keys, dv, a);
        }
      }
      if (p.learnable_sink) {
        if (m == kNegInf) m = sink;  // no keys: the sink alone
        l += std::exp(sink - m);
      }
      double* out = res.out.data() + at.out_row(qb, i, h);
      for (int64_t x = 0; x < dv; ++x) out[x] = l > 0.0 ? round_to_dtype(o[x] * vd / l, out_dtype) : 0.0;
      res.lse[at.lse_at(b, h, i)] = l > 0.0 ? static_cast<float>(m + std::log(l)) : kNegInf;
    }
  });
  return res;
}

}  // namespace flash4::check
