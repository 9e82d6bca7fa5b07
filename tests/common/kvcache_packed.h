// Packed queries (KvCacheArgs::cu_seqlens_q) made from a dense KvCacheCase, for the CPU and GPU tests alike:
// sequence b keeps the last counts[b] of its seqlen_q queries. Those are its last positions in both calls, so under
// every mask the dense call's reference for those rows is the packed call's reference too: the packed results,
// scattered back into the case's out / lse, are checked by check_kvcache.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/kvcache_case.h"

namespace flash4::test {

struct PackedQueries {
  std::vector<int64_t> counts;  // queries of each sequence, at most c.spec.seqlen_q
  int64_t extra = 0;            // rows after the last segment (in no sequence)
  int64_t total = 0;            // rows of q: sum(counts) + extra
  HostTensor q, out, lse;       // (total, heads, head_dim) x2, lse (heads, total)
  HostTensor cu_seqlens_q;      // int32 (batch + 1)

  PackedQueries(const KvCacheCase& c, std::vector<int64_t> counts, int64_t extra);
  // `a` (c.args() or its device mirror) with the packed q, out, lse and offsets (host views: the GPU tests
  // replace their data by device copies).
  void apply(KvCacheArgs& a) const;
  // Writes the packed rows into c.out / c.lse at their dense places (the other rows keep what c holds), and
  // checks the rows after the last segment: out 0, lse -inf.
  ::testing::AssertionResult scatter_into(KvCacheCase& c) const;
};

// Query counts for a batch: 1, 2, .., up to max_count in turn, with an empty sequence every fifth.
std::vector<int64_t> mixed_counts(int64_t batch, int64_t max_count);

}  // namespace flash4::test
