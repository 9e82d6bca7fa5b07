// The FP8 (float8_e4m3fn) forward on the CPU: E4M3 conversions, then forward(out, lse) through the public API
// against the fp64 reference of the dequantized inputs (FP8 value * descale), judged by the tolerance rule with
// the naive FP8 attention as the baseline (src/check/naive_fp8_attention.h): dense and packed, causal, window,
// softcap, GQA, the sink, split head dims, bf16 and fp16 outputs, with and without descale factors. Also: the
// FP8 path equals the fp32 path on the dequantized values bit for bit, and the rule catches a dropped descale.
#include <cmath>
#include <cstdint>
#include <ostream>
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
namespace {

constexpr DType kFP8 = DType::kFloat8E4M3;

TEST(E4m3, EveryCodeRoundTripsAndRoundingIsToNearestEven) {
  for (int b = 0; b < 256; ++b) {
    const float f = e4m3_bits_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      continue;
    }
    EXPECT_EQ(float_to_e4m3_bits(f), b == 0x80 ? 0x80 : b) << b << " = " << f;
  }
  EXPECT_EQ(e4m3_bits_to_float(0x7e), 448.0f);      // largest finite
  EXPECT_EQ(e4m3_bits_to_float(0x01), 0x1p-9f);     // smallest subnormal
  EXPECT_EQ(e4m3_bits_to_float(0x08), 0x1p-6f);     // smallest normal
  EXPECT_EQ(round_to_e4m3(1.0625f), 1.0f);          // tie between 1 and 1.125: the even code
  EXPECT_EQ(round_to_e4m3(1.1875f), 1.25f);         // tie between 1.125 and 1.25: the even code
  EXPECT_EQ(round_to_e4m3(0x1p-10f), 0.0f);         // half the smallest subnormal: to zero (even)
  EXPECT_EQ(round_to_e4m3(3 * 0x1p-10f), 0x1p-8f);  // tie between 2^-9 and 2^-8: the even code
  EXPECT_EQ(round_to_e4m3(-0.3f), -0.3125f);
  EXPECT_EQ(round_to_e4m3(1000.0f), 448.0f);  // saturates
  EXPECT_EQ(round_to_e4m3(-1e30f), -448.0f);
  EXPECT_TRUE(std::isnan(round_to_e4m3(std::nanf(""))));
}

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

int64_t sum(const std::vector<int>& x) {
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
    const int64_t rows_q = s.packed() ? sum(s.lens_q) : s.batch * s.seqlen_q;
    const int64_t rows_k = s.packed() ? sum(s.lens_k) : s.batch * s.seqlen_k;
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

::testing::AssertionResult check_fp8(const Fp8Problem& t, const std::vector<double>& out,
                                     const std::vector<double>& lse) {
  const detail::Problem p = check::make_problem(t.args);
  const std::vector<double> q = t.real_q(), k = t.real_k(), v = t.real_v();
  const ForwardResult ref = reference_forward(p, q, k, v);
  const ForwardResult naive = check::naive_fp8_forward(p, t.s.out, q, k, v);
  auto o = within_tolerance("out", out, ref.out, naive.out, t.s.out);
  if (!o) return o << " [" << t.s.name() << "]";
  auto l = within_tolerance("lse", lse, ref.lse, naive.lse, DType::kFloat32);
  if (!l) return l << " [" << t.s.name() << "]";
  return ::testing::AssertionSuccess();
}

Fp8Spec spec(int64_t sq, int64_t sk, int64_t heads, int64_t heads_kv, int64_t d, int64_t dv) {
  Fp8Spec s;
  s.batch = 2, s.seqlen_q = sq, s.seqlen_k = sk, s.heads = heads, s.heads_kv = heads_kv, s.head_dim = d;
  s.head_dim_v = dv;
  return s;
}

template <class Change>
Fp8Spec with(Fp8Spec s, Change&& change) {
  change(s);
  return s;
}

std::vector<Fp8Spec> fp8_cases() {
  std::vector<Fp8Spec> c;
  c.push_back(spec(1, 1, 1, 1, 64, 64));
  c.push_back(spec(70, 90, 4, 2, 128, 128));
  c.push_back(with(spec(130, 100, 4, 1, 128, 128), [](Fp8Spec& s) { s.causal = true, s.out = DType::kFloat16; }));
  c.push_back(with(spec(100, 120, 2, 2, 256, 256), [](Fp8Spec& s) { s.window_left = 20, s.window_right = 3; }));
  c.push_back(with(spec(80, 80, 2, 1, 64, 64), [](Fp8Spec& s) { s.softcap = 10.0f, s.causal = true; }));
  c.push_back(with(spec(60, 50, 4, 2, 96, 96), [](Fp8Spec& s) { s.sink = true, s.causal = true; }));
  c.push_back(with(spec(70, 70, 4, 2, 192, 128), [](Fp8Spec& s) { s.causal = true; }));
  c.push_back(with(spec(65, 65, 2, 2, 128, 128), [](Fp8Spec& s) { s.descale = false; }));
  c.push_back(with(spec(0, 0, 4, 2, 128, 128), [](Fp8Spec& s) {  // packed: 3 segments, one empty
    s.lens_q = {40, 0, 70}, s.lens_k = {50, 9, 65}, s.seqlen_q = 70, s.seqlen_k = 65, s.causal = true, s.sink = true;
  }));
  return c;
}

// gtest prints a parameter with this (its name) instead of a byte dump.
void PrintTo(const Fp8Spec& s, std::ostream* os) { *os << s.name(); }

class CpuFp8Forward : public ::testing::TestWithParam<Fp8Spec> {};

TEST_P(CpuFp8Forward, MatchesReferenceOfDequantizedInputs) {
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(GetParam(), rng);
  forward(t.args);
  EXPECT_TRUE(check_fp8(t, t.out_values(), t.lse_values()));
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuFp8Forward, ::testing::ValuesIn(fp8_cases()),
                         [](const auto& info) { return info.param.name(); });

// Dequantize-then-compute: the FP8 call gives bit for bit what the fp32 call gives on the dequantized values
// (each an fp32 product, as the CPU path forms it), once that fp32 output is rounded to bf16.
TEST(CpuFp8Forward, EqualsTheFp32PathOnDequantizedValues) {
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(with(spec(90, 110, 4, 2, 128, 64), [](Fp8Spec& s) { s.causal = true; }), rng);
  forward(t.args);
  auto fp32 = [&](const std::vector<uint8_t>& x, const std::vector<float>& descale,
                  const std::vector<int64_t>& entry, int64_t heads, int64_t dim) {
    std::vector<float> f(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t h = static_cast<int64_t>(i) / dim % heads, row = static_cast<int64_t>(i) / dim / heads;
      f[i] = e4m3_bits_to_float(x[i]) * descale[entry[row] * t.s.heads_kv + h / (heads / t.s.heads_kv)];
    }
    return f;
  };
  std::vector<float> q = fp32(t.q, t.q_descale, t.entry_q, 4, 128), k = fp32(t.k, t.k_descale, t.entry_k, 2, 128);
  std::vector<float> v = fp32(t.v, t.v_descale, t.entry_k, 2, 64), out(t.out.size()), lse(t.lse.size());
  ForwardArgs a = t.args;
  a.q = make_view(q.data(), DType::kFloat32, Device::cpu(), 2, 90, 4, 128);
  a.k = make_view(k.data(), DType::kFloat32, Device::cpu(), 2, 110, 2, 128);
  a.v = make_view(v.data(), DType::kFloat32, Device::cpu(), 2, 110, 2, 64);
  a.out = make_view(out.data(), DType::kFloat32, Device::cpu(), 2, 90, 4, 64);
  a.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), 2, 4, 90);
  a.q_descale = a.k_descale = a.v_descale = TensorView{};
  forward(a);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(t.out[i], float_to_bf16_bits(out[i])) << i;
  EXPECT_EQ(t.lse, lse);
}

// The rule has teeth: an output computed without v's descale (every value off by its factor) fails it.
TEST(CpuFp8Forward, TheRuleCatchesADroppedDescale) {
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(spec(64, 64, 2, 1, 64, 64), rng);
  t.args.v_descale = TensorView{};
  forward(t.args);
  EXPECT_FALSE(check_fp8(t, t.out_values(), t.lse_values()));
}

}  // namespace
}  // namespace flash4::test
