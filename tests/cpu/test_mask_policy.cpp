// The sequence and mask policy of src/common (mask.h, sequence.h, score_transform.h) against brute force: every
// range a kernel asks for (keys of a row, key tiles of a query tile, query tiles of a key tile, blocks that need
// the element mask) equals a scan of the element predicate, on odd lengths, ragged q/k and every window shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/mask.h"
#include "common/score_transform.h"
#include "common/sequence.h"

namespace flash4::detail {
namespace {

struct Window {
  int64_t left, right;
};
constexpr Window kWindows[] = {{-1, -1}, {-1, 0}, {32, 0}, {70, 5}, {0, 0}, {5, -1}, {3, 200}, {0, -1}};
constexpr int64_t kLengths[] = {1, 2, 17, 63, 64, 65, 128, 129, 300};

// Bottom-right-aligned window, written out from the definition (../docs/numerics.md).
bool visible_by_definition(const Window& w, int64_t sq, int64_t sk, int64_t i, int64_t j) {
  const int64_t diag = i + sk - sq;
  if (j < 0 || j >= sk) return false;
  if (w.left >= 0 && j < diag - w.left) return false;
  if (w.right >= 0 && j > diag + w.right) return false;
  return true;
}

TEST(MaskPolicy, ElementPredicateAndRowRanges) {
  for (const Window& w : kWindows)
    for (int64_t sq : kLengths)
      for (int64_t sk : kLengths) {
        const SequenceMask m = SequenceMask::make({w.left, w.right}, sq, sk);
        for (int64_t i = 0; i < sq; ++i) {
          int64_t lo = sk, hi = -1;
          for (int64_t j = -1; j <= sk; ++j) {
            const bool v = visible_by_definition(w, sq, sk, i, j);
            ASSERT_EQ(m.visible(i, j), v) << sq << "x" << sk << " i " << i << " j " << j;
            if (v) lo = std::min(lo, j), hi = std::max(hi, j);
          }
          const IndexRange r = m.keys_of_row(i);
          if (hi < 0) {
            EXPECT_TRUE(r.empty()) << sq << "x" << sk << " row " << i;
          } else {
            EXPECT_EQ(r.lo, lo);
            EXPECT_EQ(r.hi, hi);
          }
        }
        for (int64_t j = 0; j < sk; ++j) {
          const IndexRange r = m.rows_of_key(j);
          for (int64_t i = 0; i < sq; ++i) EXPECT_EQ(m.visible(i, j), i >= r.lo && i <= r.hi);
        }
      }
}

TEST(MaskPolicy, TileRangesAndMaskedBlocks) {
  for (const Window& w : kWindows)
    for (int64_t sq : kLengths)
      for (int64_t sk : kLengths)
        for (int64_t bm : {16, 64}) {
          const int64_t bn = 32;
          const SequenceMask m = SequenceMask::make({w.left, w.right}, sq, sk);
          const int64_t m_tiles = (sq + bm - 1) / bm, n_tiles = (sk + bn - 1) / bn;
          for (int64_t mt = 0; mt < m_tiles; ++mt) {
            const int64_t i0 = mt * bm, i1 = std::min(i0 + bm, sq) - 1;
            const IndexRange tiles = m.key_tiles(i0, i1, bn);
            for (int64_t nt = 0; nt < n_tiles; ++nt) {
              const int64_t j0 = nt * bn, j1 = std::min(j0 + bn, sk) - 1;
              bool any = false, all = true;
              for (int64_t i = i0; i <= i1; ++i)
                for (int64_t j = j0; j <= j0 + bn - 1; ++j) {  // the whole tile: its tail past seqlen_k is hidden
                  const bool v = m.visible(i, j);
                  any = any || v;
                  all = all && v;
                }
              EXPECT_EQ(m.block_visible(i0, i1, j0, j1), any) << sq << "x" << sk << " tile " << mt << "," << nt;
              // Key tiles run as one interval from the first to the last visible one.
              EXPECT_EQ(any, nt >= tiles.lo && nt <= tiles.hi) << sq << "x" << sk << " tile " << mt << "," << nt;
              // A block that is not entirely visible must take the element mask (the converse may be loose).
              if (!all) EXPECT_TRUE(m.block_needs_mask(i0, i1, j0, j0 + bn - 1));
              if (!m.block_needs_mask(i0, i1, j0, j0 + bn - 1)) EXPECT_TRUE(all);
              const IndexRange rows = m.query_tiles(j0, j1, bm);
              EXPECT_EQ(any, mt >= rows.lo && mt <= rows.hi) << sq << "x" << sk << " tile " << mt << "," << nt;
            }
          }
        }
}

TEST(SequencePolicy, DenseAndPackedLayouts) {
  const SequenceLayout dense = dense_layout(100, 300);
  EXPECT_FALSE(dense.packed());
  const SequenceInfo d = dense.info(7);
  EXPECT_EQ(d.q_offset, 0);
  EXPECT_EQ(d.seqlen_q, 100);
  EXPECT_EQ(d.seqlen_k, 300);

  // Packed offsets with one corrupt segment: lengths are clamped to the maxima and never negative.
  const std::vector<int> cu_q = {0, 3, 3, 10, 5}, cu_k = {0, 4, 9, 9, 400};
  const std::vector<int> used_k = {2, 9, 0, 50};
  SequenceLayout packed = dense_layout(7, 50);
  packed.total_q = 10;
  packed.total_k = 400;
  packed.cu_seqlens_q = cu_q.data();
  packed.cu_seqlens_k = cu_k.data();
  packed.seqused_k = used_k.data();
  EXPECT_TRUE(packed.packed());
  const SequenceInfo s0 = packed.info(0), s1 = packed.info(1), s3 = packed.info(3);
  EXPECT_EQ(s0.q_offset, 0);
  EXPECT_EQ(s0.seqlen_q, 3);
  EXPECT_EQ(s0.seqlen_k, 2);  // seqused_k
  EXPECT_EQ(s1.seqlen_q, 0);
  EXPECT_EQ(s1.k_offset, 4);
  EXPECT_EQ(s1.seqlen_k, 5);  // seqused_k 9 clamped to the segment
  EXPECT_EQ(s3.seqlen_q, 0);  // decreasing offsets: empty, not negative
  EXPECT_EQ(s3.seqlen_k, 50);  // 391 keys clamped to max_seqlen_k
  EXPECT_EQ(packed.info(2).seqlen_q, 7);  // 10 - 3 clamped to max_seqlen_q

  // Offsets past the packed tensors: the offset is clamped to total and offset + length never exceeds it.
  const std::vector<int> bad_q = {-5, 8, 12, 30}, used_q = {1, 9, 1};
  SequenceLayout wild = dense_layout(6, 50);
  wild.total_q = 10;
  wild.cu_seqlens_q = bad_q.data();
  wild.seqused_q = used_q.data();
  const SequenceInfo w0 = wild.info(0), w1 = wild.info(1), w2 = wild.info(2);
  EXPECT_EQ(w0.q_offset, 0);   // negative offset clamped to 0
  EXPECT_EQ(w0.seqlen_q, 1);   // 13 -> 6 (max) -> seqused_q 1
  EXPECT_EQ(w1.q_offset, 8);
  EXPECT_EQ(w1.seqlen_q, 2);   // 4 clamped to total - offset = 2; seqused_q 9 clamped to that
  EXPECT_EQ(w2.q_offset, 10);  // 12 clamped to total
  EXPECT_EQ(w2.seqlen_q, 0);
  for (int b = 0; b < 3; ++b) EXPECT_LE(wild.info(b).q_offset + wild.info(b).seqlen_q, wild.total_q);
}

// A packed batch shared between two kernels: entries with fewer queries than min_seqlen_q take no part (the
// other kernel's), the rest keep their offsets and lengths.
TEST(SequencePolicy, MinSeqlenQLeavesShortSegments) {
  const std::vector<int> cu_q = {0, 1, 17, 33, 49};  // 1, 16, 16, 16 queries
  const std::vector<int> used_k = {5, 40, 40, 40};
  SequenceLayout packed = dense_layout(20, 64);
  packed.total_q = 49;
  packed.cu_seqlens_q = cu_q.data();
  packed.seqused_k = used_k.data();
  const std::vector<int> cu_long = {0, 1, 18, 18, 40};  // 1, 17, 0, 22 queries
  SequenceLayout mixed = packed;
  mixed.cu_seqlens_q = cu_long.data();
  mixed.total_q = 40;
  mixed.min_seqlen_q = 17;
  const int64_t expected[4] = {0, 17, 0, 20};  // 22 clamped to max_seqlen_q
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(mixed.info(b).seqlen_q, expected[b]) << b;
    EXPECT_EQ(mixed.info(b).q_offset, cu_long[b]) << b;
    EXPECT_EQ(mixed.info(b).seqlen_k, used_k[b]) << b;
  }
  for (int b = 0; b < 4; ++b) EXPECT_EQ(packed.info(b).seqlen_q, cu_q[b + 1] - cu_q[b]);  // min 0: all take part
  SequenceLayout dense = dense_layout(3, 10);
  dense.min_seqlen_q = 17;  // packed batches only
  EXPECT_EQ(dense.info(0).seqlen_q, 3);
}

TEST(SequencePolicy, EntryAtPackedQueryRow) {
  // Segments [2, 5), [5, 5) (empty), [5, 9); rows 0-1 lie before the first, row 9 after the last.
  const std::vector<int> cu_q = {2, 5, 5, 9};
  SequenceLayout packed = dense_layout(4, 4);
  packed.total_q = 10;
  packed.cu_seqlens_q = cu_q.data();
  const int64_t batch = 3;
  const int64_t expected[10] = {-1, -1, 0, 0, 0, 2, 2, 2, 2, 2};
  for (int64_t j = 0; j < 10; ++j) EXPECT_EQ(packed.entry_at_q_row(j, batch), expected[j]) << "row " << j;
  // Row 9 belongs to no segment: entry 2 is found, and its info says the row is past it.
  const SequenceInfo last = packed.info(packed.entry_at_q_row(9, batch));
  EXPECT_EQ(last.q_offset + last.seqlen_q, 9);
  EXPECT_EQ(packed.entry_at_q_row(0, 0), -1);  // no entries

  // Decreasing (corrupt) offsets: some entry in range is still returned, never an index past batch - 1.
  const std::vector<int> wild_q = {0, 9, 3, 1, 8};
  SequenceLayout wild = packed;
  wild.cu_seqlens_q = wild_q.data();
  for (int64_t j = 0; j < 12; ++j) {
    const int64_t b = wild.entry_at_q_row(j, 4);
    EXPECT_GE(b, 0);
    EXPECT_LT(b, 4);
  }
}

TEST(ScorePolicy, OneMeaningWithAndWithoutSoftcap) {
  const float scale = 0.125f, qk = 3.7f;
  const ScoreTransform plain = ScoreTransform::make(scale, 0.0f);
  EXPECT_FALSE(plain.has_softcap());
  EXPECT_FLOAT_EQ(qk * plain.log2_scale, qk * scale / std::log(2.0f));
  const ScoreTransform capped = ScoreTransform::make(scale, 30.0f);
  EXPECT_TRUE(capped.has_softcap());
  const double want = 30.0 * std::tanh(double(qk) * scale / 30.0) / std::log(2.0);
  EXPECT_NEAR(std::tanh(qk * capped.tanh_scale) * capped.log2_scale, want, 1e-5);
  EXPECT_FLOAT_EQ(kLog2e * kLn2, 1.0f);
}

}  // namespace
}  // namespace flash4::detail
