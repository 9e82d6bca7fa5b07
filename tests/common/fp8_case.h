// One FP8 (float8_e4m3fn) forward test case, shared by the CPU and GPU tests: the spec (shapes, mask, output
// dtype, sink, descales), random e4m3 host inputs with poisoned outputs, the matching ForwardArgs (host views:
// GPU tests copy the buffers and repoint the views), and the check against the fp64 reference of the dequantized
// inputs (FP8 value * descale) with the naive FP8 attention as the tolerance baseline.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "check/naive_fp8_attention.h"
#include "check/problem_from_args.h"
#include "common/float_convert.h"
#include "common/test_rng.h"
#include "common/tolerance_assertion.h"
#include "flash4/api.h"
#include "reference/reference.h"

namespace flash4::test {

inline constexpr DType kFP8 = DType::kFloat8E4M3;

struct Fp8Spec {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads = 1, heads_kv = 1, head_dim = 64, head_dim_v = 64;
  std::vector<int> lens_q, lens_k;  // non-empty: a packed batch of these segments (batch = their count)
  DType out = DType::kBFloat16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sink = false, descale = true;

  bool packed() const { return !lens_q.empty(); }
  std::string name() const {
    std::string n = (packed() ? "packed" + std::to_string(lens_q.size()) : "b" + std::to_string(batch)) + "_sq" +
                    std::to_string(seqlen_q) + "_sk" + std::to_string(seqlen_k) + "_h" + std::to_string(heads) +
                    "_hkv" + std::to_string(heads_kv) + "_d" + std::to_string(head_dim) + "_dv" +
                    std::to_string(head_dim_v) + "_" + dtype_name(out);
    if (causal) n += "_causal";
    if (window_left >= 0 || window_right >= 0) n += "_window";
    if (softcap > 0.0f) n += "_softcap";
    if (sink) n += "_sink";
    if (!descale) n += "_nodescale";
    return n;
  }
};

inline int64_t fp8_total(const std::vector<int>& x) {
  int64_t s = 0;
  for (int v : x) s += v;
  return s;
}

// One FP8 problem's host buffers and arguments. Dense tensors are (batch, seqlen, heads, dim), packed ones
// (total, heads, dim); `entry[row]` is the batch entry a token row belongs to (for the descales).
struct Fp8Problem {
  Fp8Spec s;
  std::vector<uint8_t> q, k, v;
  std::vector<float> q_descale, k_descale, v_descale, sink, lse;
  std::vector<uint16_t> out;
  std::vector<int> cu_q, cu_k;
  std::vector<int64_t> entry_q, entry_k;
  ForwardArgs args;

  Fp8Problem(const Fp8Spec& spec, Rng& rng) : s(spec) {
    const int64_t rows_q = s.packed() ? fp8_total(s.lens_q) : s.batch * s.seqlen_q;
    const int64_t rows_k = s.packed() ? fp8_total(s.lens_k) : s.batch * s.seqlen_k;
    const int64_t batch = s.packed() ? static_cast<int64_t>(s.lens_q.size()) : s.batch;
    auto fp8 = [&](int64_t n, double stddev) {
      std::vector<uint8_t> x(static_cast<size_t>(n));
      for (uint8_t& b : x) b = float_to_e4m3_bits(static_cast<float>(stddev * rng.normal()));
      return x;
    };
    // FP8 holds values up to 448: inputs quantized at a few units, as a per-tensor scale would leave them.
    q = fp8(rows_q * s.heads * s.head_dim, 4.0);
    k = fp8(rows_k * s.heads_kv * s.head_dim, 4.0);
    v = fp8(rows_k * s.heads_kv * s.head_dim_v, 4.0);
    // Descales far from 1 and different per (entry, kv head), so a dropped or misplaced one shows.
    for (auto* d : {&q_descale, &k_descale, &v_descale}) {
      d->resize(static_cast<size_t>(batch * s.heads_kv));
      for (float& x : *d) x = static_cast<float>(std::exp2(rng.uniform(-3.0, -1.0)));
    }
    out.assign(static_cast<size_t>(rows_q * s.heads * s.head_dim_v), 0x7fc1);  // NaN in bf16 and fp16
    lse.assign(static_cast<size_t>(rows_q * s.heads), std::nanf(""));
    for (int64_t r = 0; r < rows_q; ++r) entry_q.push_back(s.packed() ? 0 : r / s.seqlen_q);
    for (int64_t r = 0; r < rows_k; ++r) entry_k.push_back(s.packed() ? 0 : r / s.seqlen_k);
    const Device cpu = Device::cpu();
    if (s.packed()) {
      cu_q = {0};
      cu_k = {0};
      for (size_t b = 0; b < s.lens_q.size(); ++b) {
        cu_q.push_back(cu_q.back() + s.lens_q[b]);
        cu_k.push_back(cu_k.back() + s.lens_k[b]);
        for (int64_t r = cu_q[b]; r < cu_q[b + 1]; ++r) entry_q[r] = static_cast<int64_t>(b);
        for (int64_t r = cu_k[b]; r < cu_k[b + 1]; ++r) entry_k[r] = static_cast<int64_t>(b);
      }
      args.q = make_view(q.data(), kFP8, cpu, rows_q, s.heads, s.head_dim);
      args.k = make_view(k.data(), kFP8, cpu, rows_k, s.heads_kv, s.head_dim);
      args.v = make_view(v.data(), kFP8, cpu, rows_k, s.heads_kv, s.head_dim_v);
      args.out = make_view(out.data(), s.out, cpu, rows_q, s.heads, s.head_dim_v);
      args.lse = make_view(lse.data(), DType::kFloat32, cpu, s.heads, rows_q);
      args.cu_seqlens_q = make_view(cu_q.data(), DType::kInt32, cpu, batch + 1);
      args.cu_seqlens_k = make_view(cu_k.data(), DType::kInt32, cpu, batch + 1);
      args.max_seqlen_q = s.seqlen_q;
      args.max_seqlen_k = s.seqlen_k;
    } else {
      args.q = make_view(q.data(), kFP8, cpu, s.batch, s.seqlen_q, s.heads, s.head_dim);
      args.k = make_view(k.data(), kFP8, cpu, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
      args.v = make_view(v.data(), kFP8, cpu, s.batch, s.seqlen_k, s.heads_kv, s.head_dim_v);
      args.out = make_view(out.data(), s.out, cpu, s.batch, s.seqlen_q, s.heads, s.head_dim_v);
      args.lse = make_view(lse.data(), DType::kFloat32, cpu, s.batch, s.heads, s.seqlen_q);
    }
    if (s.descale) {
      args.q_descale = make_view(q_descale.data(), DType::kFloat32, cpu, batch, s.heads_kv);
      args.k_descale = make_view(k_descale.data(), DType::kFloat32, cpu, batch, s.heads_kv);
      args.v_descale = make_view(v_descale.data(), DType::kFloat32, cpu, batch, s.heads_kv);
    }
    if (s.sink) {
      for (int64_t h = 0; h < s.heads; ++h) sink.push_back(static_cast<float>(rng.normal()));
      args.learnable_sink = make_view(sink.data(), DType::kFloat32, cpu, s.heads);
    }
    args.causal = s.causal;
    args.window_left = s.window_left;
    args.window_right = s.window_right;
    args.softcap = s.softcap;
  }

  // The real inputs: FP8 values times the descale of their row's entry and kv head (q head h: h / group), fp64.
  std::vector<double> dequantized(const std::vector<uint8_t>& x, const std::vector<float>& descale,
                                  const std::vector<int64_t>& entry, int64_t heads, int64_t dim) const {
    const int64_t group = heads / s.heads_kv;
    std::vector<double> d(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t h = static_cast<int64_t>(i) / dim % heads, row = static_cast<int64_t>(i) / dim / heads;
      const double f = s.descale ? descale[entry[row] * s.heads_kv + h / group] : 1.0;
      d[i] = double{e4m3_bits_to_float(x[i])} * f;
    }
    return d;
  }
  std::vector<double> real_q() const { return dequantized(q, q_descale, entry_q, s.heads, s.head_dim); }
  std::vector<double> real_k() const { return dequantized(k, k_descale, entry_k, s.heads_kv, s.head_dim); }
  std::vector<double> real_v() const { return dequantized(v, v_descale, entry_k, s.heads_kv, s.head_dim_v); }
  std::vector<double> out_values() const { return reference::to_double(args.out); }
  std::vector<double> lse_values() const { return reference::to_double(args.lse); }
};

// `arithmetic`: the naive baseline's model, fp32 for the CPU path, hopper_tensor_cores for the GPU kernels
// (src/check/naive_fp8_attention.h).
inline ::testing::AssertionResult check_fp8(const Fp8Problem& t, const std::vector<double>& out,
                                            const std::vector<double>& lse,
                                            check::Fp8Arithmetic arithmetic = check::Fp8Arithmetic::fp32()) {
  const detail::Problem p = check::make_problem(t.args);
  const std::vector<double> q = t.real_q(), k = t.real_k(), v = t.real_v();
  const ForwardResult ref = reference_forward(p, q, k, v);
  const ForwardResult naive = check::naive_fp8_forward(p, t.s.out, q, k, v, {}, arithmetic);
  auto o = within_tolerance("out", out, ref.out, naive.out, t.s.out);
  if (!o) return o << " [" << t.s.name() << "]";
  auto l = within_tolerance("lse", lse, ref.lse, naive.lse, DType::kFloat32);
  if (!l) return l << " [" << t.s.name() << "]";
  return ::testing::AssertionSuccess();
}

inline Fp8Spec fp8_spec(int64_t sq, int64_t sk, int64_t heads, int64_t heads_kv, int64_t d, int64_t dv) {
  Fp8Spec s;
  s.batch = 2, s.seqlen_q = sq, s.seqlen_k = sk, s.heads = heads, s.heads_kv = heads_kv, s.head_dim = d;
  s.head_dim_v = dv;
  return s;
}

template <class Change>
Fp8Spec fp8_with(Fp8Spec s, Change&& change) {
  change(s);
  return s;
}

}  // namespace flash4::test
