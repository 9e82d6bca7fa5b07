// The decode kernel's constexpr plan (src/kernels/sm90/decode/decode_config.h) on the CPU: shared memory fits the
// CTAs per SM it promises, the pipeline is deep enough to keep >= 32 KB per SM in flight, the merge fits in the
// stages, and the split heuristic gives the documented counts (docs/kvcache.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/decode_rows.h"
#include "common/kvcache_problem.h"
#include "common/paged_keys.h"
#include "kernels/sm90/decode/decode_config.h"

namespace flash4::sm90::decode {
namespace {

template <int kHeadDim, int kWarpsM>
void check_tile() {
  using Tile = DecodeTile<kHeadDim, kWarpsM>;
  SCOPED_TRACE("d " + std::to_string(kHeadDim) + " rows " + std::to_string(Tile::kBlockM));
  EXPECT_LE(Tile::kCtasPerSm * (Tile::kSmemBytes + kSmemReservedPerCta), kSmemPerSm);
  EXPECT_LE(Tile::kSmemBytes, kMaxSmemPerCta);
  // Blocks in flight while one is computed, over every resident CTA of an SM.
  EXPECT_GE(Tile::kCtasPerSm * (Tile::kStages - 1) * Tile::kStageBytes, 32 * 1024);
  EXPECT_LE(Tile::kMergeBytes, Tile::kPipeBytes);
  EXPECT_EQ(Tile::kWarpsM * Tile::kWarpsN, 4);
  EXPECT_EQ(Tile::kKeysPerWarp % 16, 0);
}

// The decode-like rule (common/decode_rows.h) that the forward's route, the KV-cache path and the CPU mirror share.
TEST(DecodeConfig, DecodeRowsRule) {
  using detail::decode_rows;
  EXPECT_TRUE(decode_rows(1, 8) && decode_rows(16, 4) && decode_rows(16, 8) && decode_rows(1, 128));
  EXPECT_FALSE(decode_rows(17, 1));  // too many queries for the decode kernel's bound
  EXPECT_FALSE(decode_rows(9, 16));  // 144 rows per KV head
  EXPECT_FALSE(decode_rows(1, 129));
}

// The GPU's rule for a few long caches: up to 64 queries and 256 rows per KV head when the dense kernel's
// batch x heads CTAs fill at most half the SMs, the keys are many and the call's query rows at most 2048.
// The segments of a mixed packed batch that the decode kernel takes: the most queries decode_rows allows.
TEST(DecodeConfig, DecodeMaxQueries) {
  using detail::decode_max_queries;
  using detail::decode_rows;
  for (int64_t group : {1, 2, 3, 4, 5, 7, 8, 12, 16, 32, 64, 128, 129, 256}) {
    const int64_t n = decode_max_queries(group);
    EXPECT_TRUE(n == 0 || decode_rows(n, group)) << group;
    EXPECT_FALSE(decode_rows(n + 1, group)) << group;
  }
  EXPECT_EQ(decode_max_queries(1), 16);
  EXPECT_EQ(decode_max_queries(8), 16);
  EXPECT_EQ(decode_max_queries(32), 4);
  EXPECT_EQ(decode_max_queries(129), 0);
}

TEST(DecodeConfig, DecodeRowsOnFewCtas) {
  using detail::decode_rows_on_few_ctas;
  EXPECT_TRUE(decode_rows_on_few_ctas(24, 4, 1, 32, 32768, 132));   // one 32k cache, GQA 4:1
  EXPECT_TRUE(decode_rows_on_few_ctas(64, 4, 1, 32, 16384, 132));   // 256 rows per KV head, 2048 query rows
  EXPECT_FALSE(decode_rows_on_few_ctas(64, 4, 2, 32, 16384, 132));  // 64 CTAs of 132, but 4096 query rows
  EXPECT_FALSE(decode_rows_on_few_ctas(65, 1, 1, 8, 32768, 132));   // more queries than the bound
  EXPECT_FALSE(decode_rows_on_few_ctas(48, 8, 1, 64, 32768, 132));  // 384 rows
  EXPECT_FALSE(decode_rows_on_few_ctas(24, 4, 8, 32, 8192, 132));   // 256 CTAs: the dense kernel fills the SMs
  EXPECT_FALSE(decode_rows_on_few_ctas(24, 4, 3, 32, 32768, 132));  // 96 CTAs > half of 132
  EXPECT_FALSE(decode_rows_on_few_ctas(24, 4, 1, 32, 16383, 132));  // too few keys to split
  EXPECT_TRUE(decode_rows_on_few_ctas(32, 8, 1, 64, 32768, 132));   // 2048 query rows: the bound
  EXPECT_FALSE(decode_rows_on_few_ctas(64, 1, 2, 32, 16384, 132));  // 4096 query rows (MHA): the dense tile fills
}

TEST(DecodeConfig, SharedMemoryAndPipelineDepth) {
  check_tile<64, 1>();
  check_tile<64, 4>();
  check_tile<128, 1>();
  check_tile<128, 4>();
  check_tile<256, 1>();
  check_tile<256, 4>();
  EXPECT_EQ((DecodeTile<128, 1>::kStages), 3);
  EXPECT_EQ((DecodeTile<128, 1>::kCtasPerSm), 2);
}

// The chunk swizzle: within a row a permutation of the row's own chunks; the 8 rows of an ldmatrix phase (same
// logical chunk) and the 8 chunks of a quarter-warp's cp.async writes each hit 8 distinct 16-byte bank groups.
template <int kHeadDim>
void check_swizzle() {
  using Tile = DecodeTile<kHeadDim, 1>;
  constexpr int kChunks = kHeadDim / 8;
  SCOPED_TRACE("d " + std::to_string(kHeadDim));
  for (int row = 0; row < kBlockN; ++row) {
    std::vector<bool> seen(kChunks, false);
    for (int c = 0; c < kChunks; ++c) {
      const int off = Tile::offset(row, c);
      ASSERT_EQ(off / Tile::kRowBytes, row);
      ASSERT_EQ(off % 16, 0);
      const int physical = off % Tile::kRowBytes / 16;
      EXPECT_FALSE(seen[physical]);
      seen[physical] = true;
    }
  }
  for (int row0 = 0; row0 < kBlockN; row0 += 8)
    for (int c = 0; c < kChunks; ++c) {
      std::vector<bool> by_rows(8, false), by_chunks(8, false);
      for (int r = 0; r < 8; ++r) {
        const int group = Tile::offset(row0 + r, c) / 16 % 8;  // 16-byte bank group of 32 banks
        EXPECT_FALSE(by_rows[group]);
        by_rows[group] = true;
        const int chunk = c / 8 * 8 + r;
        const int group2 = Tile::offset(row0 + c % 8, chunk) / 16 % 8;
        EXPECT_FALSE(by_chunks[group2]);
        by_chunks[group2] = true;
      }
    }
}

TEST(DecodeConfig, SwizzledRowsAreConflictFree) {
  check_swizzle<64>();
  check_swizzle<128>();
  check_swizzle<256>();
}

// The loader's one-lookup path: keys a <= b are in one page exactly when one lookup of a gives b's row at the
// same slot, b - a rows further (pages in shuffled order, power-of-two and other sizes, contiguous caches).
TEST(DecodeConfig, SamePageMatchesLookups) {
  const std::vector<int> table = {5, 2, 7, 0, 3, 6, 1, 4};
  for (int page_size : {1, 3, 16, 24, 64, 256}) {
    int shift = -1;
    if ((page_size & (page_size - 1)) == 0)
      for (shift = 0; (1 << shift) != page_size; ++shift) {
      }
    const detail::PagedKeys keys = detail::PagedKeys::paged(table.data(), page_size, 8, 8, shift);
    const int64_t capacity = keys.capacity();
    for (int64_t a = 0; a < capacity; a += 5)
      for (int64_t b = a; b < capacity && b < a + 80; b += 3) {
        const detail::CacheRow ra = keys.at(a), rb = keys.at(b);
        const bool consecutive = ra.slot == rb.slot && rb.row - ra.row == b - a;
        EXPECT_EQ(keys.same_page(a, b), consecutive) << "page " << page_size << " keys " << a << ", " << b;
      }
  }
  const detail::PagedKeys contiguous = detail::PagedKeys::contiguous(3, 1000, 4);
  EXPECT_TRUE(contiguous.same_page(0, 999));
}

// Packed keys (the forward's decode route for packed batches): sequence b's keys start at cu_seqlens_k[b] of one
// slot, clamped as the packed forward clamps them (SequenceLayout::info), seqused_k in cache_seqlens.
TEST(DecodeConfig, PackedKeysFollowTheOffsets) {
  const std::vector<int> cu = {0, 5, 5, 40, 30};  // the last segment runs backwards: empty
  const std::vector<int> used = {3, 9, 100, 4};
  detail::KvCacheProblem kv;
  kv.attention.batch = 4;
  kv.capacity = 32;  // max_seqlen_k
  kv.total_k = 36;   // the third segment (5 .. 39) is cut at the tensor's end
  kv.cu_seqlens_k = cu.data();
  const int64_t lengths[4] = {5, 0, 31, 0}, offsets[4] = {0, 5, 5, 36};
  for (int64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(kv.cache_length(b), lengths[b]) << b;
    EXPECT_EQ(kv.seqlen_k(b), lengths[b]) << b;
    const detail::PagedKeys keys = kv.keys(b);
    EXPECT_EQ(keys.at(0).slot, 0);
    EXPECT_EQ(keys.at(0).row, offsets[b]) << b;
    EXPECT_EQ(keys.at(2).row, offsets[b] + 2) << b;
    EXPECT_GE(keys.capacity(), lengths[b]) << b;  // every key the sequence attends to is a row of the tensor
  }
  kv.cache_seqlens = used.data();  // seqused_k: at most the segment
  const int64_t used_lengths[4] = {3, 0, 31, 0};
  for (int64_t b = 0; b < 4; ++b) EXPECT_EQ(kv.cache_length(b), used_lengths[b]) << b;
}

TEST(DecodeConfig, SplitHeuristic) {
  constexpr int kSms = 132;
  // GQA 32/8, d = 128, one query: 4 rows per KV head, one 16-row tile (2 CTA slots per SM). Items that leave
  // the SMs at least two splits each take one CTA per SM's worth of splits: 132 / 8 items.
  EXPECT_EQ(decode_num_splits(0, kSms, 1, 8, 4, 128, 65536), 16);
  EXPECT_EQ(decode_num_splits(0, kSms, 1, 8, 4, 128, 8192), 16);
  EXPECT_EQ(decode_num_splits(0, kSms, 1, 8, 4, 128, 4096), 16);  // at least 256 keys per split
  EXPECT_EQ(decode_num_splits(0, kSms, 1, 8, 4, 128, 2048), 8);
  EXPECT_EQ(decode_num_splits(0, kSms, 8, 8, 4, 128, 32768), 2);
  // 96 items: 132 / 96 < 2, so the splits fill the 264 slots instead.
  EXPECT_EQ(decode_num_splits(0, kSms, 12, 8, 4, 128, 32768), 2);
  EXPECT_EQ(decode_num_splits(0, kSms, 2, 8, 4, 256, 65536), 8);  // d = 256: one CTA per SM, 132 / 16
  EXPECT_EQ(decode_num_splits(0, kSms, 1, 8, 64, 128, 65536), 16);  // 64 rows (speculative): one CTA per SM
  EXPECT_EQ(decode_num_splits(0, kSms, 32, 8, 4, 128, 16384), 1);
  EXPECT_EQ(decode_num_splits(0, kSms, 64, 8, 4, 128, 4096), 1);
  EXPECT_EQ(decode_num_splits(0, kSms, 128, 8, 4, 128, 2048), 1);
  EXPECT_EQ(decode_num_splits(0, kSms, 1, 8, 4, 128, 200), 1);  // too few keys to split
  EXPECT_EQ(decode_num_splits(7, kSms, 1, 8, 4, 128, 65536), 7);  // num_splits overrides
  EXPECT_FALSE(decode_wide_rows(16));
  EXPECT_TRUE(decode_wide_rows(17));
}

}  // namespace
}  // namespace flash4::sm90::decode
