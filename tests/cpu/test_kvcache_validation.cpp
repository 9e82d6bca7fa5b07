// Bad KV-cache arguments (flash4/kvcache.h) are refused with a message naming the argument, and nothing is
// written: neither the outputs nor the caches. CUDA tensors are refused by the one GPU gate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/kvcache_case.h"
#include "common/kvcache_packed.h"

namespace flash4::test {
namespace {

KvCaseSpec paged_spec() {
  KvCaseSpec s;
  s.batch = 2;
  s.seqlen_q = 2;
  s.heads = 4;
  s.heads_kv = 2;
  s.cache_lengths = {20, 5};
  s.seqlen_new = 2;
  s.page_size = 16;
  s.rotary = Rotary::kInterleaved;
  return s;
}

KvCaseSpec contiguous_spec() {
  KvCaseSpec s = paged_spec();
  s.page_size = 0;
  s.cache_batch_idx = true;
  s.rotary = Rotary::kNone;
  return s;
}

KvCaseSpec with_no_append(KvCaseSpec s) {
  s.seqlen_new = 0;
  return s;
}

bool all_nan(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isnan(v)) return false;
  return true;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// The call with `change` applied is refused naming `expected`, and writes nothing.
void expect_refused(const KvCaseSpec& spec, const std::function<void(KvCacheArgs&, KvCacheCase&)>& change,
                    const std::string& expected) {
  SCOPED_TRACE(expected);
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(spec, rng);
  KvCacheArgs a = c.args();
  change(a, c);
  try {
    forward_kvcache(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("flash4::forward_kvcache"), std::string::npos) << e.what();
  }
  EXPECT_THROW(can_implement(a), Error);
  EXPECT_TRUE(all_nan(c.out.to_double()));
  EXPECT_TRUE(all_nan(c.lse.to_double()));
  EXPECT_TRUE(same_bits(c.k_cache.to_double(), c.initial_k_cache));
  EXPECT_TRUE(same_bits(c.v_cache.to_double(), c.initial_v_cache));
}

TEST(KvCacheValidation, PageTable) {
  const KvCaseSpec s = paged_spec();
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.block_table.dtype = DType::kFloat32; }, "block_table.dtype");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.block_table.shape[0] = 1; }, "block_table.shape[0] (batch)");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.block_table.rank = 1; }, "block_table must have rank 2");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase& c) {
        c.block_table[c.max_pages] = -1;
        a.block_table.data = c.block_table.data();
      },
      "block_table[1][0] = -1");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase& c) { c.block_table[1] = static_cast<int32_t>(a.k_cache.shape[0]); },
      "block_table[0][1]");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.k_cache.shape[1] = a.v_cache.shape[1] = 0; }, "page_size");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase& c) {
        a.cache_batch_idx = make_view(c.cache_seqlens.data(), DType::kInt32, Device::cpu(), 2);
      },
      "cache_batch_idx is set with block_table");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase& c) {
        a.cache_leftpad = make_view(c.cache_seqlens.data(), DType::kInt32, Device::cpu(), 2);
      },
      "cache_leftpad is set with block_table");
  // 20 + 2 new keys fit in 2 pages of 16, but not in 1: a shorter table overflows.
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.block_table.shape[1] = 1; }, "the append would overflow");
}

// cache_leftpad: an int32 vector of the batch, each value in [0, cache_seqlens[b]] (host-resident: checked).
TEST(KvCacheValidation, LeftPad) {
  const KvCaseSpec s = with(contiguous_spec(), [](KvCaseSpec& x) { x.leftpad = {3, 5}; });
  expect_refused(
      s, [](KvCacheArgs&, KvCacheCase& c) { c.cache_leftpad[1] = 6; },
      "cache_leftpad[1] = 6 but must be in [0, 5]");
  expect_refused(
      s, [](KvCacheArgs&, KvCacheCase& c) { c.cache_leftpad[0] = -1; }, "cache_leftpad[0] = -1");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.cache_leftpad.shape[0] = 1; }, "cache_leftpad");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.cache_leftpad.dtype = DType::kFloat32; }, "cache_leftpad.dtype");
}

// An empty batch leaves block_table's max_pages unbounded by any buffer: max_pages * page_size must not overflow
// (the kvcache_args fuzzer's signed-overflow finding).
TEST(KvCacheValidation, HugePageTableOfAnEmptyBatch) {
  std::vector<uint16_t> q(16), cache(2 * 16 * 8), out(16);
  std::vector<int32_t> table(1);
  KvCacheArgs a;
  a.q = make_view(q.data(), DType::kBFloat16, Device::cpu(), 0, 1, 2, 8);
  a.k_cache = make_view(cache.data(), DType::kBFloat16, Device::cpu(), 1, 16, 1, 8);
  a.v_cache = make_view(cache.data() + 16 * 8, DType::kBFloat16, Device::cpu(), 1, 16, 1, 8);
  a.out = make_view(out.data(), DType::kBFloat16, Device::cpu(), 0, 1, 2, 8);
  a.block_table = make_view(table.data(), DType::kInt32, Device::cpu(), 0, std::numeric_limits<int64_t>::max());
  try {
    (void)can_implement(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("overflow int64 key positions"), std::string::npos) << e.what();
  }
}

// Pages of a size that is not a power of two, max_pages * page_size just below the 2^40 keys a sequence may
// have: the pages a sequence uses are counted without adding page_size - 1, and its first page is checked. A
// capacity beyond that limit (3 * 2^58 keys a page, within int64) is refused naming it.
TEST(KvCacheValidation, PageCountNearTheSequenceLimit) {
  std::vector<uint16_t> q(8), out(8), cache(2 * 8);
  std::vector<int32_t> table(10, 0);
  table[0] = -1;
  const int64_t page_size = int64_t{3} << 35;  // 10 pages hold 30 * 2^35 keys, below 2^40
  KvCacheArgs a;
  a.q = make_view(q.data(), DType::kBFloat16, Device::cpu(), 1, 1, 1, 8);
  a.out = make_view(out.data(), DType::kBFloat16, Device::cpu(), 1, 1, 1, 8);
  a.k_cache = make_view(cache.data(), DType::kBFloat16, Device::cpu(), 1, page_size, 1, 8);
  a.k_cache.stride[0] = a.k_cache.stride[1] = a.k_cache.stride[2] = 0;  // every row the same 8 elements
  a.v_cache = a.k_cache;
  a.v_cache.data = cache.data() + 8;
  a.block_table = make_view(table.data(), DType::kInt32, Device::cpu(), 1, 10);
  a.cache_seqlen = -1;  // the whole capacity
  try {
    (void)can_implement(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("block_table[0][0] = -1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uses its first 10 pages"), std::string::npos) << e.what();
  }
  a.k_cache.shape[1] = a.v_cache.shape[1] = int64_t{3} << 58;
  try {
    (void)can_implement(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pages * page_size = 8646911284551352320 exceeds the 2^40 - 1 keys"),
              std::string::npos)
        << e.what();
  }
}

TEST(KvCacheValidation, CacheLengths) {
  const KvCaseSpec s = contiguous_spec();
  expect_refused(
      s, [](KvCacheArgs&, KvCacheCase& c) { c.cache_seqlens[0] = -1; }, "cache_seqlens[0] = -1");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase& c) { c.cache_seqlens[1] = static_cast<int32_t>(a.k_cache.shape[1]) - 1; },
      "the append would overflow");
  expect_refused(
      with_no_append(s),
      [](KvCacheArgs& a, KvCacheCase& c) { c.cache_seqlens[1] = static_cast<int32_t>(a.k_cache.shape[1]) + 1; },
      "exceeds the cache's capacity");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.cache_seqlens.dtype = DType::kFloat32; }, "cache_seqlens.dtype");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.cache_seqlens.shape[0] = 3; }, "cache_seqlens.shape[0]");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {
        a.cache_seqlens = TensorView{};
        a.cache_seqlen = -2;
      },
      "cache_seqlen = -2");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.cache_seqlens = TensorView{}; }, "cache_seqlen (-1: the whole cache)");
  expect_refused(
      s, [](KvCacheArgs&, KvCacheCase& c) { c.cache_batch_idx[1] = 99; }, "cache_batch_idx[1] = 99");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {
        a.cache_batch_idx = TensorView{};
        a.k_cache.shape[0] = a.v_cache.shape[0] = 1;
      },
      "k_cache.shape[0] (batch_cache) = 1");
}

TEST(KvCacheValidation, Tensors) {
  const KvCaseSpec s = paged_spec();
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {
        for (TensorView* t : {&a.q, &a.k_cache, &a.v_cache, &a.k, &a.v}) t->dtype = DType::kFloat8E4M3;
      },
      "q.dtype is float8_e4m3fn but KV-cache attention takes fp32, fp16 or bf16");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.v = TensorView{}; }, "k is set but v is not");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.k.shape[2] = 1; }, "k.shape[2] (heads_kv)");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.v.shape[1] = 1; }, "v.shape[1] (seqlen_new)");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.k.dtype = DType::kFloat16; }, "k.dtype");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.v_cache.shape[2] = 1; }, "v_cache.shape[2] (heads_kv)");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.k_cache.shape[3] = a.v_cache.shape[3] = 32; }, "k_cache.shape[3]");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {
        a.q.shape[2] = 3;
        a.out.shape[2] = 3;
      },
      "is not a multiple of");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {
        a.out = a.k_cache;
        a.out.shape[0] = 2;
        a.out.shape[1] = 2;
        a.out.shape[2] = 4;
      },
      "out overlaps k_cache");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.lse.shape[2] = 3; }, "lse.shape[2] (seqlen_q)");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.num_splits = 129; }, "num_splits = 129");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.num_splits = -1; }, "num_splits = -1");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.softmax_scale = 3e38f; }, "softmax_scale = 3e+38");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.softcap = 1e-45f; }, "softmax_scale / softcap");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.softcap = -1e-10f; }, "softcap = -1e-10 must be");
  // The same scalar checks and messages as flash4::forward (one check_score_options).
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.softmax_scale = std::nanf(""); }, "softmax_scale = nan must be finite");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.softmax_scale = -0.5f; }, "softmax_scale = -0.5 must be >= 0");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.window_left = -2; }, "window_left = -2 must be >= -1");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase& c) {
        a.learnable_sink = c.sink.view();
        a.learnable_sink.dtype = DType::kFloat16;
      },
      "learnable_sink.dtype");
}

// Appending into caches that share elements would write the new keys and values over each other: refused, as
// are broadcast caches; the interleaved K and V halves of one buffer share no element and are accepted.
TEST(KvCacheValidation, AppendedCachesMustNotShareElements) {
  const KvCaseSpec s = contiguous_spec();
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.v_cache = a.k_cache; }, "k_cache and v_cache share elements");
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {  // v_cache one row into k_cache: rows 1.. of one are rows 0.. of the other
        a.v_cache = a.k_cache;
        a.v_cache.data = static_cast<uint16_t*>(a.k_cache.data) + a.k_cache.stride[1];
      },
      "k_cache and v_cache share elements");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.k_cache.stride[1] = 0; }, "k_cache.stride[1] = 0");
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(s, rng);
  KvCacheArgs a = c.args();
  // One buffer (slots, rows, heads_kv, 2, d): K in the first half of each row pair, V in the second.
  const int64_t d = a.k_cache.shape[3];
  std::vector<uint16_t> kv(static_cast<size_t>(a.k_cache.numel() * 2));
  a.k_cache = make_view(kv.data(), a.k_cache.dtype, Device::cpu(), a.k_cache.shape[0], a.k_cache.shape[1],
                        a.k_cache.shape[2], d);
  for (int i = 0; i < 3; ++i) a.k_cache.stride[i] *= 2;
  a.v_cache = a.k_cache;
  a.v_cache.data = kv.data() + d;
  EXPECT_NO_THROW((void)can_implement(a));
  // Without an append the caches are only read: the same tensor for both is fine.
  KvCacheCase r(with_no_append(s), rng);
  KvCacheArgs b = r.args();
  b.v_cache = b.k_cache;
  EXPECT_NO_THROW((void)can_implement(b));
}

TEST(KvCacheValidation, Rotary) {
  const KvCaseSpec s = paged_spec();
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.rotary_sin = TensorView{}; }, "rotary_cos is set but rotary_sin is not");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.k = a.v = TensorView{}; }, "rotary_cos and rotary_sin are set but k");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 20; }, "seqlen_ro");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.rotary_cos.shape[1] = a.rotary_sin.shape[1] = 40; }, "rotary_dim");
  expect_refused(
      s, [](KvCacheArgs& a, KvCacheCase&) { a.rotary_sin.shape[1] = 8; }, "rotary_sin.shape[1]");
  // An empty table spans no memory whatever its width: rotary_dim = 2 * shape[1] must not overflow.
  expect_refused(
      s,
      [](KvCacheArgs& a, KvCacheCase&) {
        for (TensorView* t : {&a.rotary_cos, &a.rotary_sin}) {
          t->shape[0] = 0;  // empty: no extent check can catch the width
          t->shape[1] = std::numeric_limits<int64_t>::max();
        }
      },
      "rotary_dim");
}

// A q without heads spans no memory whatever its length: the rotary position cache_length + seqlen_q - 1 of a
// windowed call at the longest sequence allowed is refused naming the table; a longer q names the limit.
TEST(KvCacheValidation, RotaryPositionOfAHugeEmptyQuery) {
  std::vector<float> cache(2 * 8 * 8), new_kv(2 * 8), table(2 * 16 * 2);
  KvCacheArgs a;
  a.q = make_view(nullptr, DType::kFloat32, Device::cpu(), 1, (int64_t{1} << 40) - 1, 0, 8);
  a.out = a.q;
  a.k_cache = make_view(cache.data(), DType::kFloat32, Device::cpu(), 1, 8, 1, 8);
  a.v_cache = make_view(cache.data() + 64, DType::kFloat32, Device::cpu(), 1, 8, 1, 8);
  a.k = make_view(new_kv.data(), DType::kFloat32, Device::cpu(), 1, 1, 1, 8);
  a.v = make_view(new_kv.data() + 8, DType::kFloat32, Device::cpu(), 1, 1, 1, 8);
  a.rotary_cos = make_view(table.data(), DType::kFloat32, Device::cpu(), 16, 2);
  a.rotary_sin = make_view(table.data() + 32, DType::kFloat32, Device::cpu(), 16, 2);
  a.cache_seqlen = 3;
  a.window_left = 0;  // q row i takes the angle of position cache_length + i
  for (int call = 0; call < 2; ++call) {
    try {
      if (call == 0) (void)can_implement(a);
      else forward_kvcache(a);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("rotary_cos.shape[0] (seqlen_ro) = 16"), std::string::npos) << e.what();
    }
  }
  a.q.shape[1] = a.out.shape[1] = std::numeric_limits<int64_t>::max();
  try {
    forward_kvcache(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q.shape[1] (seqlen_q) = 9223372036854775807 exceeds the 2^40 - 1"),
              std::string::npos)
        << e.what();
  }
  for (float x : cache) EXPECT_EQ(x, 0.0f);  // the append did not run
}

// Packed queries (cu_seqlens_q): host offsets are checked like a packed batch's, q and the outputs take the packed
// ranks, and a packed call appends nothing.
TEST(KvCacheValidation, PackedQueries) {
  KvCaseSpec s = with_no_append(paged_spec());
  s.rotary = Rotary::kNone;
  // The packed call of the case with `change` applied; the packed tensors outlive the call.
  using Packed = PackedQueries;
  using Case = KvCacheCase;
  std::vector<std::unique_ptr<Packed>> keep;
  auto packed = [&keep](const std::function<void(KvCacheArgs&, Packed&, Case&)>& change) {
    return [&keep, change](KvCacheArgs& a, Case& c) {
      keep.push_back(std::make_unique<Packed>(c, std::vector<int64_t>{2, 1}, 1));
      keep.back()->apply(a);
      change(a, *keep.back(), c);
    };
  };
  auto offsets = [](Packed& p) { return static_cast<int32_t*>(p.cu_seqlens_q.data()); };
  expect_refused(s, packed([&](KvCacheArgs&, Packed& p, Case&) { offsets(p)[0] = 1; }), "cu_seqlens_q[0] = 1");
  expect_refused(s, packed([&](KvCacheArgs&, Packed& p, Case&) { offsets(p)[2] = 1; }),
                 "cu_seqlens_q must be non-decreasing");
  expect_refused(s, packed([&](KvCacheArgs& a, Packed&, Case&) { a.max_seqlen_q = 1; }),
                 "segment 0 of cu_seqlens_q has 2 tokens but max_seqlen_q = 1");
  expect_refused(s, packed([&](KvCacheArgs& a, Packed& p, Case&) {
                   offsets(p)[2] = 5;
                   a.max_seqlen_q = 3;
                 }),
                 "cu_seqlens_q[2] = 5 exceeds q.shape[0] (total_q) = 4");
  expect_refused(s, packed([&](KvCacheArgs& a, Packed&, Case&) { a.max_seqlen_q = 0; }), "max_seqlen_q = 0");
  expect_refused(s, packed([&](KvCacheArgs& a, Packed&, Case&) { a.cu_seqlens_q.dtype = DType::kFloat32; }),
                 "cu_seqlens_q.dtype is fp32 but must be int32");
  HostTensor three = HostTensor::vector(DType::kInt32, 4);  // offsets of three sequences for a batch of two
  for (int i = 0; i < 4; ++i) static_cast<int32_t*>(three.data())[i] = i < 2 ? 2 * i : 3;
  expect_refused(s, packed([&](KvCacheArgs& a, Packed&, Case&) { a.cu_seqlens_q = three.view(); }),
                 "block_table.shape[0] (batch) = 2 but expected 3 (one row per sequence: cu_seqlens_q.shape[0] - 1)");
  expect_refused(s, packed([&](KvCacheArgs& a, Packed&, Case&) { a.lse.shape[1] = 3; }),
                 "lse must be (heads, total_q)");
  expect_refused(s, packed([&](KvCacheArgs& a, Packed&, Case& c) { a.q = c.q.view(); }),
                 "q must have rank 3, got rank 4");
  expect_refused(paged_spec(), packed([&](KvCacheArgs&, Packed&, Case&) {}),
                 "k and v (an append) are set with cu_seqlens_q");
  expect_refused(s, [](KvCacheArgs& a, KvCacheCase&) { a.max_seqlen_q = 4; },
                 "max_seqlen_q = 4 but it is only used with cu_seqlens_q");
}

// Without a usable GPU (a CPU-only build, or no sm_90 device), CUDA tensors pass validation (device-resident indices
// are not read) and are refused with the reason, before anything is written.
TEST(KvCacheValidation, CudaTensorsRefusedWithoutGpu) {
  if (cuda_available(0)) GTEST_SKIP() << "an sm_90 GPU is present: tests/gpu/test_kvcache.cu runs the GPU path";
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(paged_spec(), rng);
  KvCacheArgs a = c.args();
  for (TensorView* t : {&a.q, &a.k_cache, &a.v_cache, &a.k, &a.v, &a.rotary_cos, &a.rotary_sin, &a.cache_seqlens,
                        &a.block_table, &a.out, &a.lse})
    t->device = Device::cuda(0);
  const Support s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_FALSE(s.reason.empty());
  try {
    forward_kvcache(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    EXPECT_NE(std::string(e.what()).find(s.reason), std::string::npos) << e.what();
  }
  EXPECT_TRUE(all_nan(c.out.to_double()));
}

}  // namespace
}  // namespace flash4::test
