// Error measurement and the tolerance verdict of `flash4 run --check` (see check.h).
#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "naive_attention.h"
#include "reference/reference.h"

namespace flash4_cli {
namespace {

using flash4::DType;
using flash4::detail::Problem;

// Problems with at most this many scores (batch * heads * seqlen_q * seqlen_k) are checked in full.
constexpr int64_t kFullCheckScores = int64_t{1} << 22;
// Forward: query rows sampled per (batch, head) above that size.
constexpr int64_t kSampledRows = 64;
// Backward: the reduced problem (batch 0, one K/V head group) must stay below this many scores.
constexpr int64_t kMaxBackwardCheckScores = int64_t{1} << 25;
// Room for the polynomial exp2's relative error (8.8e-5), relative to the largest reference value.
constexpr double kRelativeAtol = 1e-4;

// One ulp of the dtype at 0.3, FlashAttention 3's absolute tolerance term.
double ulp_at_0_3(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return std::ldexp(1.0, -9);
    case DType::kFloat16: return std::ldexp(1.0, -12);
    case DType::kFloat32: return std::ldexp(1.0, -25);
  }
  return 0.0;
}

// |a - b|, with equal infinities (fully masked rows' LSE) counting as exact and NaN as infinitely wrong.
double abs_diff(double a, double b) {
  if (a == b) return 0.0;
  const double d = std::abs(a - b);
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
}

struct Errors {
  double max_abs = 0.0;  // vs the reference
  double rel_l2 = 0.0;   // ||test - ref|| / ||ref||
  double naive_max_abs = 0.0;
  double max_ref = 0.0;
};

// Compares `test` and `naive` with `ref` at the listed element indices (all when `indices` is empty).
Errors measure(const std::vector<double>& test, const std::vector<double>& naive, const std::vector<double>& ref,
               const std::vector<int64_t>& indices) {
  Errors e;
  double diff2 = 0.0, ref2 = 0.0;
  auto visit = [&](int64_t x) {
    const double d = abs_diff(test[x], ref[x]);
    e.max_abs = std::max(e.max_abs, d);
    e.naive_max_abs = std::max(e.naive_max_abs, abs_diff(naive[x], ref[x]));
    if (std::isfinite(ref[x])) {
      e.max_ref = std::max(e.max_ref, std::abs(ref[x]));
      ref2 += ref[x] * ref[x];
      diff2 += d * d;
    }
  };
  if (indices.empty()) {
    for (size_t x = 0; x < ref.size(); ++x) visit(static_cast<int64_t>(x));
  } else {
    for (int64_t x : indices) visit(x);
  }
  e.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return e;
}

// Prints one line of the report and returns whether the tolerance rule holds.
bool judge(const char* name, const Errors& e, DType dtype) {
  const double limit = 2.0 * e.naive_max_abs + ulp_at_0_3(dtype) + kRelativeAtol * e.max_ref;
  const bool pass = e.max_abs <= limit;
  std::printf("  %-4s   max abs err %.3e  rel l2 %.3e | naive %s %.3e -> limit %.3e  %s\n", name, e.max_abs,
              e.rel_l2, flash4::dtype_name(dtype), e.naive_max_abs, limit, pass ? "PASS" : "FAIL");
  return pass;
}

// Evenly spaced rows including the first and the last.
std::vector<int64_t> sample_rows(int64_t seqlen, int64_t count) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < count; ++r) rows.push_back(r * (seqlen - 1) / (count - 1));
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Batch 0, query heads [0, group) and K/V head 0 of a contiguous (batch, seqlen, heads, dim) tensor.
std::vector<double> first_heads(const std::vector<double>& x, int64_t seqlen, int64_t heads, int64_t count,
                                int64_t dim) {
  std::vector<double> out;
  out.reserve(seqlen * count * dim);
  for (int64_t s = 0; s < seqlen; ++s) {
    const auto row = x.begin() + s * heads * dim;
    out.insert(out.end(), row, row + count * dim);
  }
  return out;
}

}  // namespace

bool check_forward(const Problem& p, DType dtype, const HostResults& r) {
  const bool sampled = p.batch * p.heads * p.seqlen_q * p.seqlen_k > kFullCheckScores && p.seqlen_q > kSampledRows;
  const std::vector<int64_t> rows = sampled ? sample_rows(p.seqlen_q, kSampledRows) : std::vector<int64_t>{};
  if (sampled) {
    std::printf("check    vs the fp64 reference on %zu of %lld query rows per (batch, head)\n", rows.size(),
                static_cast<long long>(p.seqlen_q));
  } else {
    std::printf("check    vs the fp64 reference on every row\n");
  }
  std::fflush(stdout);
  std::fprintf(stderr, "computing the fp64 reference and the naive %s baseline...\n", flash4::dtype_name(dtype));

  std::vector<double> ref_out(r.out.size()), ref_lse(r.lse.size()), naive_out(r.out.size()), naive_lse(r.lse.size());
  flash4::reference::forward(p, r.q.data(), r.k.data(), r.v.data(), ref_out.data(), ref_lse.data(), rows);
  naive_forward(p, dtype, r.q.data(), r.k.data(), r.v.data(), naive_out.data(), naive_lse.data(), rows);

  std::vector<int64_t> out_indices, lse_indices;  // elements of the sampled rows
  for (int64_t b = 0; b < p.batch && sampled; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i : rows) {
        lse_indices.push_back((b * p.heads + h) * p.seqlen_q + i);
        for (int64_t c = 0; c < p.head_dim; ++c)
          out_indices.push_back(((b * p.seqlen_q + i) * p.heads + h) * p.head_dim + c);
      }
  const bool out_ok = judge("out", measure(r.out, naive_out, ref_out, out_indices), dtype);
  const bool lse_ok = judge("lse", measure(r.lse, naive_lse, ref_lse, lse_indices), dtype);
  return out_ok && lse_ok;
}

bool check_backward(const Problem& p, DType dtype, const HostResults& r) {
  Problem sub = p;
  HostResults in;
  const HostResults* use = &r;
  if (p.batch * p.heads * p.seqlen_q * p.seqlen_k > kFullCheckScores) {
    // dK and dV need every query row, so check a smaller slice in full instead of sampling rows.
    sub.batch = 1;
    sub.heads = p.group();
    sub.heads_kv = 1;
    if (sub.heads * p.seqlen_q * p.seqlen_k > kMaxBackwardCheckScores) {
      std::printf("check    skipped: seqlen_q x seqlen_k too large for the fp64 backward reference here\n");
      return true;
    }
    const int64_t d = p.head_dim, g = sub.heads;
    in.q = first_heads(r.q, p.seqlen_q, p.heads, g, d);
    in.dout = first_heads(r.dout, p.seqlen_q, p.heads, g, d);
    in.dq = first_heads(r.dq, p.seqlen_q, p.heads, g, d);
    in.k = first_heads(r.k, p.seqlen_k, p.heads_kv, 1, d);
    in.v = first_heads(r.v, p.seqlen_k, p.heads_kv, 1, d);
    in.dk = first_heads(r.dk, p.seqlen_k, p.heads_kv, 1, d);
    in.dv = first_heads(r.dv, p.seqlen_k, p.heads_kv, 1, d);
    use = &in;
    std::printf("check    vs the fp64 reference on batch 0, query heads 0..%lld (K/V head 0)\n",
                static_cast<long long>(g - 1));
  } else {
    std::printf("check    vs the fp64 reference on every element\n");
  }
  std::fflush(stdout);
  std::fprintf(stderr, "computing the fp64 reference and the naive %s baseline...\n", flash4::dtype_name(dtype));

  const HostResults& x = *use;
  std::vector<double> ref_dq(x.dq.size()), ref_dk(x.dk.size()), ref_dv(x.dv.size());
  std::vector<double> naive_dq(x.dq.size()), naive_dk(x.dk.size()), naive_dv(x.dv.size());
  flash4::reference::backward(sub, x.q.data(), x.k.data(), x.v.data(), x.dout.data(), ref_dq.data(), ref_dk.data(),
                              ref_dv.data());
  naive_backward(sub, dtype, x.q.data(), x.k.data(), x.v.data(), x.dout.data(), naive_dq.data(), naive_dk.data(),
                 naive_dv.data());
  const bool dq_ok = judge("dq", measure(x.dq, naive_dq, ref_dq, {}), dtype);
  const bool dk_ok = judge("dk", measure(x.dk, naive_dk, ref_dk, {}), dtype);
  const bool dv_ok = judge("dv", measure(x.dv, naive_dv, ref_dv, {}), dtype);
  return dq_ok && dk_ok && dv_ok;
}

}  // namespace flash4_cli
