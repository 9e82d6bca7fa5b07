// Sampling, the report and the verdict of `flash4 run --check` (see check.h).
#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "check/attention_results.h"
#include "check/naive_attention.h"
#include "check/naive_fp8_attention.h"
#include "check/problem_from_args.h"
#include "check/tolerance.h"

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

// Scores (query, key pairs times heads) of `batch` entries of p, in double: the sizes' product may exceed int64.
double scores(int64_t batch, const Problem& p) {
  return static_cast<double>(batch) * static_cast<double>(p.heads) * static_cast<double>(p.seqlen_q) *
         static_cast<double>(p.seqlen_k);
}

// ||test - ref|| / ||ref|| over the finite reference values: reported beside the rule's maximum error.
double relative_l2(const std::vector<double>& test, const std::vector<double>& ref) {
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t x = 0; x < ref.size(); ++x) {
    if (!std::isfinite(ref[x])) continue;
    const double d = test[x] - ref[x];
    diff2 += std::isnan(d) ? INFINITY : d * d;
    ref2 += ref[x] * ref[x];
  }
  return ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
}

// Prints one line of the report and returns whether the tolerance rule holds.
bool judge(const char* name, const std::vector<double>& test, const std::vector<double>& naive,
           const std::vector<double>& ref, DType dtype, double extra_atol = 0.0) {
  const flash4::check::Verdict v = flash4::check::judge(test, ref, naive, dtype, extra_atol);
  std::printf("  %-4s   max abs err %.3e  rel l2 %.3e | naive %s %.3e -> limit %.3e  %s\n", name, v.error,
              relative_l2(test, ref), flash4::dtype_name(dtype), v.baseline_error, v.limit,
              v.pass ? "PASS" : "FAIL");
  return v.pass;
}

// Evenly spaced rows including the first and the last.
std::vector<int64_t> sample_rows(int64_t seqlen, int64_t count) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < count; ++r) rows.push_back(r * (seqlen - 1) / (count - 1));
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// The elements of `x` at `indices`, or all of `x` when `indices` is empty.
std::vector<double> pick(const std::vector<double>& x, const std::vector<int64_t>& indices) {
  if (indices.empty()) return x;
  std::vector<double> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(x[i]);
  return out;
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

std::string backward_check_refusal(const flash4::BackwardArgs& args) {
  const Problem p = flash4::check::make_problem(args);
  if (scores(p.batch, p) <= kFullCheckScores) return {};
  // The reduced check: batch 0, one group of query heads.
  const double reduced = static_cast<double>(p.group()) * static_cast<double>(p.seqlen_q) *
                         static_cast<double>(p.seqlen_k);
  if (reduced <= static_cast<double>(kMaxBackwardCheckScores)) return {};
  char text[200];
  std::snprintf(text, sizeof(text),
                "--check: the backward check needs (heads / heads_kv) x seqlen_q x seqlen_k = %.4g scores in the "
                "fp64 reference, above its limit of %lld",
                reduced, static_cast<long long>(kMaxBackwardCheckScores));
  return text;
}

bool check_forward(const flash4::ForwardArgs& args, const HostResults& r) {
  const Problem p = flash4::check::make_problem(args);
  const DType dtype = args.q.dtype;
  const bool sampled = scores(p.batch, p) > kFullCheckScores && p.seqlen_q > kSampledRows;
  const std::vector<int64_t> rows = sampled ? sample_rows(p.seqlen_q, kSampledRows) : std::vector<int64_t>{};
  if (sampled) {
    std::printf("check    vs the fp64 reference on %zu of %lld query rows per (batch, head)\n", rows.size(),
                static_cast<long long>(p.seqlen_q));
  } else {
    std::printf("check    vs the fp64 reference on every row\n");
  }
  std::fflush(stdout);
  std::fprintf(stderr, "computing the fp64 reference and the naive %s baseline...\n", flash4::dtype_name(dtype));

  const flash4::check::ForwardResult ref = flash4::check::reference_forward(p, r.q, r.k, r.v, rows);
  // FP8: the naive FP8 attention writing out's dtype (docs/numerics.md, "FP8 forward"), in the model of the
  // arithmetic that ran (a GPU's tensor cores or the CPU's fp32); inputs have descale 1.
  const DType out_dtype = args.out.dtype;
  const flash4::check::Fp8Arithmetic fp8_arithmetic = args.q.device.kind == flash4::DeviceKind::kCuda
                                                          ? flash4::check::Fp8Arithmetic::hopper_tensor_cores()
                                                          : flash4::check::Fp8Arithmetic::fp32();
  const flash4::check::ForwardResult naive =
      dtype == DType::kFloat8E4M3 ? flash4::check::naive_fp8_forward(p, out_dtype, r.q, r.k, r.v, rows, fp8_arithmetic)
                                  : flash4::check::naive_forward(p, dtype, r.q, r.k, r.v, rows);

  std::vector<int64_t> out_indices, lse_indices;  // elements of the sampled rows
  for (int64_t b = 0; b < p.batch && sampled; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i : rows) {
        lse_indices.push_back((b * p.heads + h) * p.seqlen_q + i);
        for (int64_t c = 0; c < p.head_dim; ++c)
          out_indices.push_back(((b * p.seqlen_q + i) * p.heads + h) * p.head_dim + c);
      }
  const std::vector<double> ref_out = pick(ref.out, out_indices), ref_lse = pick(ref.lse, lse_indices);
  // The polynomial exp2 is an approximation by design: its documented error is allowed on top of the rule.
  const bool poly = args.tuning.exp2 == flash4::Exp2Mode::kPolynomial;
  const double out_extra = poly ? flash4::check::exp2_poly_out_allowance(ref_out) : 0.0;
  const double lse_extra = poly ? flash4::check::exp2_poly_lse_allowance() : 0.0;
  const bool out_ok =
      judge("out", pick(r.out, out_indices), pick(naive.out, out_indices), ref_out, out_dtype, out_extra);
  const bool lse_ok =
      judge("lse", pick(r.lse, lse_indices), pick(naive.lse, lse_indices), ref_lse, DType::kFloat32, lse_extra);
  return out_ok && lse_ok;
}

bool check_backward(const flash4::BackwardArgs& args, const HostResults& r) {
  const Problem p = flash4::check::make_problem(args);
  const DType dtype = args.q.dtype;
  Problem sub = p;
  HostResults in;
  const HostResults* use = &r;
  if (scores(p.batch, p) > kFullCheckScores) {
    // dK and dV need every query row, so check a smaller slice in full instead of sampling rows.
    sub.batch = 1;
    sub.heads = p.group();
    sub.heads_kv = 1;
    if (const std::string refusal = backward_check_refusal(args); !refusal.empty()) {
      std::printf("check    not run: %s\n", refusal.c_str());  // run_attention refuses these before the run
      return false;
    }
    const int64_t d = p.head_dim, g = sub.heads;
    in.q = first_heads(r.q, p.seqlen_q, p.heads, g, d);
    in.out = first_heads(r.out, p.seqlen_q, p.heads, g, p.head_dim_v);
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
  const flash4::check::Gradients ref = flash4::check::reference_backward(sub, x.q, x.k, x.v, x.dout);
  const flash4::check::Gradients naive = flash4::check::naive_backward(sub, dtype, x.q, x.k, x.v, x.out, x.dout);
  const bool dq_ok = judge("dq", x.dq, naive.dq, ref.dq, dtype);
  const bool dk_ok = judge("dk", x.dk, naive.dk, ref.dk, dtype);
  const bool dv_ok = judge("dv", x.dv, naive.dv, ref.dv, dtype);
  return dq_ok && dk_ok && dv_ok;
}

}  // namespace flash4_cli
