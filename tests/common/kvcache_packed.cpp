#include "common/kvcache_packed.h"

#include <cmath>
#include <utility>

namespace flash4::test {

namespace {

int64_t sum_of(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t x : counts) n += x;
  return n;
}

}  // namespace

PackedQueries::PackedQueries(const KvCacheCase& c, std::vector<int64_t> counts_, int64_t extra_)
    : counts(std::move(counts_)),
      extra(extra_),
      total(sum_of(counts) + extra_),
      q(c.spec.dtype, 1, total, c.spec.heads, c.spec.head_dim),
      out(c.spec.dtype, 1, total, c.spec.heads, c.spec.head_dim),
      lse(HostTensor::lse(1, c.spec.heads, total)),
      cu_seqlens_q(HostTensor::vector(DType::kInt32, c.spec.batch + 1)) {
  const KvCaseSpec& s = c.spec;
  for (HostTensor* t : {&q, &out, &lse}) t->drop_leading_dim();
  out.poison();
  lse.poison();
  auto* cu = static_cast<int32_t*>(cu_seqlens_q.data());
  const std::vector<double> dense = c.q.to_double();  // (batch, seqlen_q, heads, head_dim)
  std::vector<double> packed(static_cast<size_t>(total * s.heads * s.head_dim), 0.5);  // extra rows: any value
  const int64_t row = s.heads * s.head_dim;
  cu[0] = 0;
  for (int64_t b = 0, at = 0; b < s.batch; ++b) {
    const int64_t first = s.seqlen_q - counts[b];  // the sequence's last counts[b] queries
    for (int64_t i = 0; i < counts[b]; ++i, ++at)
      for (int64_t x = 0; x < row; ++x) packed[at * row + x] = dense[((b * s.seqlen_q) + first + i) * row + x];
    cu[b + 1] = static_cast<int32_t>(at);
  }
  q.assign(packed);
}

void PackedQueries::apply(KvCacheArgs& a) const {
  a.q = q.view();
  a.out = out.view();
  a.lse = lse.view();
  a.cu_seqlens_q = cu_seqlens_q.view();
  int64_t most = 0;
  for (int64_t n : counts) most = n > most ? n : most;
  a.max_seqlen_q = most;
}

::testing::AssertionResult PackedQueries::scatter_into(KvCacheCase& c) const {
  const KvCaseSpec& s = c.spec;
  const int64_t row = s.heads * s.head_dim;
  std::vector<double> dense_out = c.out.to_double(), dense_lse = c.lse.to_double();  // lse (batch, heads, seqlen_q)
  const std::vector<double> packed_out = out.to_double(), packed_lse = lse.to_double();  // lse (heads, total)
  int64_t at = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t first = s.seqlen_q - counts[b];
    for (int64_t i = 0; i < counts[b]; ++i, ++at) {
      for (int64_t x = 0; x < row; ++x) dense_out[((b * s.seqlen_q) + first + i) * row + x] = packed_out[at * row + x];
      for (int64_t h = 0; h < s.heads; ++h)
        dense_lse[(b * s.heads + h) * s.seqlen_q + first + i] = packed_lse[h * total + at];
    }
  }
  c.out.assign(dense_out);
  c.lse.assign(dense_lse);
  for (; at < total; ++at) {
    for (int64_t x = 0; x < row; ++x)
      if (packed_out[at * row + x] != 0.0)
        return ::testing::AssertionFailure() << "out row " << at << " (in no sequence) = " << packed_out[at * row + x];
    for (int64_t h = 0; h < s.heads; ++h)
      if (!(std::isinf(packed_lse[h * total + at]) && packed_lse[h * total + at] < 0))
        return ::testing::AssertionFailure() << "lse[" << h << "][" << at << "] (in no sequence) = "
                                             << packed_lse[h * total + at];
  }
  return ::testing::AssertionSuccess();
}

std::vector<int64_t> mixed_counts(int64_t batch, int64_t max_count) {
  std::vector<int64_t> counts(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) counts[b] = b % 5 == 3 ? 0 : 1 + b % max_count;
  return counts;
}

}  // namespace flash4::test
