#include "common/kvcache_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "check/naive_attention.h"
#include "common/tolerance_assertion.h"

namespace flash4::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Unit roundoff of a dtype: half the spacing of its values at 1.
double unit_roundoff(DType t) { return t == DType::kBFloat16 ? 0x1p-8 : t == DType::kFloat16 ? 0x1p-11 : 0x1p-24; }

struct Slot {
  int64_t slot, row;
};

// The fp64 model's own page mapping (the library's is common/paged_keys.h).
Slot slot_of(const KvCacheCase& c, int64_t b, int64_t j) {
  if (c.spec.page_size == 0) return {c.spec.cache_batch_idx ? c.cache_batch_idx[b] : b, j};
  return {c.block_table[b * c.max_pages + j / c.spec.page_size], j % c.spec.page_size};
}

int64_t cache_index(const TensorView& cache, Slot s, int64_t h, int64_t x) {
  return ((s.slot * cache.shape[1] + s.row) * cache.shape[2] + h) * cache.shape[3] + x;
}

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Rotates features [0, rotary_dim) of x (fp64) at row `pos` of the tables; bound[x] receives the rounding
// allowance of an fp32 rotation rounded to `dtype`.
void rotate(const KvCacheCase& c, std::vector<double>& x, int64_t pos, const std::vector<double>& cos,
            const std::vector<double>& sin, std::vector<double>& bound) {
  const int64_t half = (c.spec.rotary_dim ? c.spec.rotary_dim : c.spec.head_dim) / 2;
  const bool interleaved = c.spec.rotary == Rotary::kInterleaved;
  const double u = unit_roundoff(c.spec.dtype);
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const double co = cos[pos * half + i], si = sin[pos * half + i], xa = x[a], xb = x[b];
    x[a] = check::round_to_dtype(xa * co - xb * si, c.spec.dtype);
    x[b] = check::round_to_dtype(xa * si + xb * co, c.spec.dtype);
    bound[a] = bound[b] = 2.0 * u * (std::abs(xa) + std::abs(xb)) + 0x1p-22 * (std::abs(xa) + std::abs(xb));
  }
}

}  // namespace

std::string KvCaseSpec::name() const {
  std::string s = "b" + std::to_string(batch) + "_sq" + std::to_string(seqlen_q) + "_h" + std::to_string(heads) + "/" +
                  std::to_string(heads_kv) + "_d" + std::to_string(head_dim) + "_" + dtype_name(dtype) + "_new" +
                  std::to_string(seqlen_new) + "_cache";
  for (int64_t n : cache_lengths) s += "-" + std::to_string(n);
  if (page_size) s += "_page" + std::to_string(page_size);
  if (cache_batch_idx) s += "_idx";
  if (!leftpad.empty()) s += "_leftpad";
  if (rotary != Rotary::kNone) s += rotary == Rotary::kInterleaved ? "_rope" : "_neox";
  if (causal) s += "_causal";
  if (window_left >= 0 || window_right >= 0)
    s += "_w" + std::to_string(window_left) + "," + std::to_string(window_right);
  if (softcap > 0) s += "_softcap";
  if (sink) s += "_sink";
  return s + "_splits" + std::to_string(num_splits);
}

KvCacheCase::KvCacheCase(const KvCaseSpec& s, Rng& rng)
    : spec(s),
      q(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim),
      k_cache(s.dtype, 0, 0, 0, 0),
      v_cache(s.dtype, 0, 0, 0, 0),
      k(s.dtype, s.batch, s.seqlen_new, s.heads_kv, s.head_dim),
      v(s.dtype, s.batch, s.seqlen_new, s.heads_kv, s.head_dim),
      cos(HostTensor::vector(s.dtype, 0)),
      sin(HostTensor::vector(s.dtype, 0)),
      out(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim),
      lse(HostTensor::lse(s.batch, s.heads, s.seqlen_q)),
      sink(HostTensor::vector(DType::kFloat32, s.heads)) {
  int64_t max_keys = 0;
  for (int64_t b = 0; b < s.batch; ++b) max_keys = std::max(max_keys, s.cache_lengths[b] + s.seqlen_new);
  int64_t slots = 0, rows = 0;
  if (s.page_size == 0) {
    slots = s.batch + (s.cache_batch_idx ? 2 : 0);
    rows = max_keys + s.spare;
    std::vector<int32_t> perm(static_cast<size_t>(slots));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = slots - 1; i > 0; --i) std::swap(perm[i], perm[rng.uniform_int(0, i)]);
    if (s.cache_batch_idx) cache_batch_idx.assign(perm.begin(), perm.begin() + s.batch);
  } else {
    max_pages = (max_keys + s.page_size - 1) / s.page_size + 1;  // one entry more than needed: padded with -1
    rows = s.page_size;
    slots = s.batch * max_pages + s.spare;
    std::vector<int32_t> perm(static_cast<size_t>(slots));  // pages anywhere in the pool, in any order
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = slots - 1; i > 0; --i) std::swap(perm[i], perm[rng.uniform_int(0, i)]);
    block_table.assign(static_cast<size_t>(s.batch * max_pages), -1);
    int64_t next = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t used = (s.cache_lengths[b] + s.seqlen_new + s.page_size - 1) / s.page_size;
      for (int64_t j = 0; j < used; ++j) block_table[b * max_pages + j] = perm[next++];
    }
  }
  k_cache = HostTensor(s.dtype, slots, rows, s.heads_kv, s.head_dim);
  v_cache = HostTensor(s.dtype, slots, rows, s.heads_kv, s.head_dim);
  // NaN everywhere but each sequence's cached keys: reading past a sequence poisons its output.
  for (HostTensor* cache : {&k_cache, &v_cache}) {
    std::vector<double> values(static_cast<size_t>(cache->numel()), kNaN);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t j = s.leftpad.empty() ? 0 : s.leftpad[b]; j < s.cache_lengths[b]; ++j)  // padding stays NaN
        for (int64_t h = 0; h < s.heads_kv; ++h)
          for (int64_t x = 0; x < s.head_dim; ++x)
            values[cache_index(cache->view(), slot_of(*this, b, j), h, x)] = rng.normal();
    cache->assign(values);
  }
  initial_k_cache = k_cache.to_double();
  initial_v_cache = v_cache.to_double();
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  for (int64_t b = 0; b < s.batch; ++b) cache_seqlens.push_back(static_cast<int32_t>(s.cache_lengths[b]));
  for (int64_t pad : s.leftpad) cache_leftpad.push_back(static_cast<int32_t>(pad));
  if (s.rotary != Rotary::kNone) {
    const int64_t rotary_dim = s.rotary_dim ? s.rotary_dim : s.head_dim, half = rotary_dim / 2;
    seqlen_ro = max_keys + s.seqlen_q + 2;
    cos = HostTensor::vector(s.dtype, seqlen_ro * half);
    sin = HostTensor::vector(s.dtype, seqlen_ro * half);
    std::vector<double> c(static_cast<size_t>(seqlen_ro * half)), sn(c.size());
    for (int64_t p = 0; p < seqlen_ro; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / rotary_dim);
        c[p * half + i] = std::cos(angle);
        sn[p * half + i] = std::sin(angle);
      }
    cos.assign(c);
    sin.assign(sn);
  }
  if (s.sink) {
    std::vector<double> values(static_cast<size_t>(s.heads));
    for (double& x : values) x = rng.normal();
    sink.assign(values);
  }
  out.poison();
  lse.poison();
}

KvCacheArgs KvCacheCase::args() const {
  KvCacheArgs a;
  a.q = q.view();
  a.k_cache = k_cache.view();
  a.v_cache = v_cache.view();
  if (spec.seqlen_new > 0) {
    a.k = k.view();
    a.v = v.view();
  }
  if (spec.rotary != Rotary::kNone) {
    const int64_t half = (spec.rotary_dim ? spec.rotary_dim : spec.head_dim) / 2;
    a.rotary_cos = make_view(cos.view().data, spec.dtype, Device::cpu(), seqlen_ro, half);
    a.rotary_sin = make_view(sin.view().data, spec.dtype, Device::cpu(), seqlen_ro, half);
    a.rotary_interleaved = spec.rotary == Rotary::kInterleaved;
  }
  if (spec.scalar_length) {
    a.cache_seqlen = spec.cache_lengths[0];
  } else {
    a.cache_seqlens = make_view(const_cast<int32_t*>(cache_seqlens.data()), DType::kInt32, Device::cpu(), spec.batch);
  }
  if (spec.cache_batch_idx)
    a.cache_batch_idx =
        make_view(const_cast<int32_t*>(cache_batch_idx.data()), DType::kInt32, Device::cpu(), spec.batch);
  if (!spec.leftpad.empty())
    a.cache_leftpad = make_view(const_cast<int32_t*>(cache_leftpad.data()), DType::kInt32, Device::cpu(), spec.batch);
  if (spec.page_size > 0)
    a.block_table =
        make_view(const_cast<int32_t*>(block_table.data()), DType::kInt32, Device::cpu(), spec.batch, max_pages);
  a.out = out.view();
  a.lse = lse.view();
  if (spec.sink) a.learnable_sink = sink.view();
  a.causal = spec.causal;
  a.window_left = spec.window_left;
  a.window_right = spec.window_right;
  a.softcap = spec.softcap;
  a.num_splits = spec.num_splits;
  return a;
}

::testing::AssertionResult check_kvcache(const KvCacheCase& c) {
  const KvCaseSpec& s = c.spec;
  const int64_t d = s.head_dim, hkv = s.heads_kv;
  const std::vector<double> cos = c.cos.to_double(), sin = c.sin.to_double();
  const std::vector<double> qv = c.q.to_double(), kv = c.k.to_double(), vv = c.v.to_double();
  const int64_t rotary_dim = s.rotary == Rotary::kNone ? 0 : (s.rotary_dim ? s.rotary_dim : d);
  const auto rotated = [&](std::vector<double> x, int64_t pos, std::vector<double>& bound) {
    bound.assign(static_cast<size_t>(d), 0.0);
    if (rotary_dim > 0) rotate(c, x, pos, cos, sin, bound);
    return x;
  };

  // The caches after the append.
  std::vector<double> ek = c.initial_k_cache, ev = c.initial_v_cache;
  std::vector<double> k_bound(ek.size(), -1.0);  // >= 0: an appended element and its allowance
  std::vector<double> bound;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.seqlen_new; ++t)
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t src = ((b * s.seqlen_new + t) * hkv + h) * d;
        const std::vector<double> x = rotated({kv.begin() + src, kv.begin() + src + d}, s.cache_lengths[b] + t, bound);
        for (int64_t i = 0; i < d; ++i) {
          const int64_t dst = cache_index(c.k_cache.view(), slot_of(c, b, s.cache_lengths[b] + t), h, i);
          ek[dst] = x[i];
          k_bound[dst] = bound[i];
          ev[dst] = vv[src + i];
        }
      }
  const std::vector<double> k_cache = c.k_cache.to_double(), v_cache = c.v_cache.to_double();
  for (size_t i = 0; i < ek.size(); ++i) {
    const bool ok_k = k_bound[i] >= 0.0 ? std::abs(k_cache[i] - ek[i]) <= k_bound[i] : same(k_cache[i], ek[i]);
    if (!ok_k || !same(v_cache[i], ev[i]))
      return ::testing::AssertionFailure() << s.name() << ": cache element " << i << " is k " << k_cache[i] << " v "
                                           << v_cache[i] << ", expected k " << ek[i] << " v " << ev[i];
  }

  // Attention per sequence on its gathered keys, against the reference and the naive baseline.
  ForwardResult ref, naive;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t pad = s.leftpad.empty() ? 0 : s.leftpad[b];  // keys are rows pad .. cache_lengths[b] + new - 1
    const int64_t seqlen_k = s.cache_lengths[b] + s.seqlen_new - pad;
    std::vector<double> qb(static_cast<size_t>(s.seqlen_q * s.heads * d)), kb(static_cast<size_t>(seqlen_k * hkv * d)),
        vb(kb.size());
    for (int64_t i = 0; i < s.seqlen_q; ++i)
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t src = ((b * s.seqlen_q + i) * s.heads + h) * d;
        const bool per_row = s.causal || s.window_left >= 0 || s.window_right >= 0;
        const std::vector<double> x =
            rotated({qv.begin() + src, qv.begin() + src + d}, s.cache_lengths[b] + (per_row ? i : 0), bound);
        std::copy(x.begin(), x.end(), qb.begin() + (i * s.heads + h) * d);
      }
    for (int64_t j = 0; j < seqlen_k; ++j)
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t x = 0; x < d; ++x) {
          const int64_t src = cache_index(c.k_cache.view(), slot_of(c, b, pad + j), h, x);
          kb[(j * hkv + h) * d + x] = ek[src];
          vb[(j * hkv + h) * d + x] = ev[src];
        }
    detail::Problem p;
    p.batch = 1;
    p.seqlen_q = s.seqlen_q;
    p.seqlen_k = seqlen_k;
    p.heads = s.heads;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.head_dim_v = d;
    p.total_q = s.seqlen_q;
    p.total_k = seqlen_k;
    p.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    p.softcap = s.softcap;
    p.causal = s.causal;
    p.window_left = s.window_left;
    p.window_right = s.causal ? (s.window_right == -1 ? 0 : std::min(s.window_right, 0)) : s.window_right;
    if (s.sink) p.learnable_sink = static_cast<const float*>(c.sink.view().data);
    const ForwardResult r = reference_forward(p, qb, kb, vb);
    const ForwardResult n = naive_forward(p, s.dtype, qb, kb, vb);
    ref.out.insert(ref.out.end(), r.out.begin(), r.out.end());
    ref.lse.insert(ref.lse.end(), r.lse.begin(), r.lse.end());
    naive.out.insert(naive.out.end(), n.out.begin(), n.out.end());
    naive.lse.insert(naive.lse.end(), n.lse.begin(), n.lse.end());
  }
  const ::testing::AssertionResult out =
      within_tolerance(s.name() + " out", c.out.to_double(), ref.out, naive.out, s.dtype);
  if (!out) return out;
  return within_tolerance(s.name() + " lse", c.lse.to_double(), ref.lse, naive.lse, DType::kFloat32);
}

std::vector<KvCaseSpec> decode_grid() {
  std::vector<KvCaseSpec> grid;
  const int64_t pages[] = {0, 16, 32, 128, 256}, dims[] = {64, 128, 256};
  int i = 0;
  for (int64_t group : {1, 3, 5, 7, 12, 32, 64}) {
    for (int64_t seqlen_q : {1, 3, 7}) {
      KvCaseSpec s;
      s.heads_kv = group >= 32 ? 1 : 2;
      s.heads = group * s.heads_kv;
      s.batch = 3;
      s.seqlen_q = seqlen_q;
      s.head_dim = dims[i % 3];
      s.page_size = pages[i % 5];
      s.cache_lengths = {1 + i % 5, 255 + i, 2049 + 3 * i};
      s.causal = i % 2 == 0;
      s.num_splits = 0;
      grid.push_back(s);
      ++i;
    }
  }
  return grid;
}

}  // namespace flash4::test
