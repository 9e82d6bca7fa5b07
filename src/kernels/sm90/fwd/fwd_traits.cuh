// Compile-time shape of one forward kernel: the tile configuration it was built for, what follows from it
// (consumers, register split, Q buffers), its shared memory, and the per-tile key range from the mask policy.
// The producer, the mainloop and the epilogue all read these; none recomputes them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/mask.h"
#include "kernels/sm90/fwd/fwd_config.h"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/fwd/fwd_softmax.cuh"

namespace flash4::sm90 {

// A compiled configuration is a type whose `tile` names its FwdTileConfig: the table's (below), or an edited one
// in the ablation benchmark and tests.
template <int kHeadDim, bool kMasked, bool kShortTile = false>
struct FwdTableConfig {
  static constexpr FwdTileConfig tile =
      kShortTile ? fwd_short_tile_config(kHeadDim) : fwd_tile_config(kHeadDim, kMasked);
};

// The configuration of a kernel whose v / out head dim is narrower than q / k's (DeepSeek's MLA, (192, 128)):
// O, V and P V are kHeadDimV wide (fwd_split_tile_config).
template <int kHeadDim, int kHeadDimV_, bool kMasked>
struct FwdSplitTableConfig {
  static constexpr FwdTileConfig tile = fwd_split_tile_config(kHeadDim, kHeadDimV_);
  static constexpr int head_dim_v = kHeadDimV_;
};

// A configuration's v / out head dim: its head_dim_v where it names one, else q / k's.
template <class Config, int kHeadDim, class = void>
struct ConfigHeadDimV {
  static constexpr int value = kHeadDim;
};
template <class Config, int kHeadDim>
struct ConfigHeadDimV<Config, kHeadDim, std::void_t<decltype(Config::head_dim_v)>> {
  static constexpr int value = Config::head_dim_v;
};

// The FP8 kernels' configuration (e4m3 q, k and a transposed v: fwd_fp8.cu): whole 128-key tiles, whose V^T rows
// are one 128-byte swizzle chunk each.
template <int kHeadDim>
struct FwdFp8TableConfig {
  static constexpr FwdTileConfig tile = fwd_fp8_tile_config(kHeadDim);
};

template <class Element_, int kHeadDim_, bool kMasked_, class Config>
struct FwdTraits {
  using Element = Element_;
  // One-byte elements are FP8 (e4m3): q and k as read, v transposed to (head_dim, keys) because FP8 wgmma takes
  // K-major operands only; the output is bf16.
  static constexpr bool kFp8 = sizeof(Element) == 1;
  using OutElement = std::conditional_t<kFp8, __nv_bfloat16, Element>;
  static constexpr int kElementBytes = static_cast<int>(sizeof(Element));
  static constexpr int kChunkCols = 128 / kElementBytes;  // elements per 128-byte swizzle chunk row
  static constexpr int kKStep = 32 / kElementBytes;       // wgmma K: 32 bytes of each operand row
  static constexpr int kHeadDim = kHeadDim_;                                  // q's and k's columns
  static constexpr int kHeadDimV = ConfigHeadDimV<Config, kHeadDim_>::value;  // v's and out's columns
  static_assert(kHeadDimV == kHeadDim || (!kFp8 && kHeadDimV < kHeadDim && kHeadDimV % 64 == 0),
                "a narrower v fills whole 128-byte chunks (16-bit)");
  static constexpr bool kMasked = kMasked_;
  static constexpr FwdTileConfig kCfg = Config::tile;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kPolyPer8 = kCfg.poly_exp2_per_8;
  static constexpr bool kIntraWgOverlap = kCfg.intra_wg_overlap;
  static constexpr bool kPingPong = kCfg.pingpong;
  static constexpr bool kDoubleP = kCfg.double_p && kCfg.intra_wg_overlap;
  // Cross-tile overlap (FwdMainloop::consume_stream): the next tile's first S issues with this tile's last P V,
  // so the next tile's Q loads into a second Q buffer during this tile.
  static constexpr bool kCrossTile = fwd_cross_tile(kCfg, kHeadDim);
  static constexpr int kQBuffers = fwd_q_buffers(kCfg, kHeadDim);
  // 128-byte swizzle chunks per Q / K row; at d = 96 the second is half used (fwd_smem_head_dim).
  static constexpr int kChunks = (kHeadDim + kChunkCols - 1) / kChunkCols;
  static constexpr int kChunksV = (kHeadDimV + kChunkCols - 1) / kChunkCols;  // the same per V row
  static constexpr int kWgRows = 64;             // query rows per consumer warpgroup
  static constexpr int kConsumers = fwd_consumer_warpgroups(kCfg);
  static constexpr int kThreads = fwd_threads(kCfg);
  // wgmma k-step descriptors as 32-bit offsets from one base descriptor per operand, instead of one built per
  // k-step: it shortens the path to the next issue where measured to pay (three consumers, d = 96 / 128).
  static constexpr bool kKStepsFromBase = kConsumers == 3 || kHeadDim == 96 || kHeadDim == 128;
  static_assert(kBlockM == kWgRows * kConsumers && (kConsumers == 2 || kConsumers == 3));
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and TMA box rows");
  static_assert(kHeadDim % kChunkCols == 0 || (!kFp8 && kHeadDim == 96),
                "head_dim fills whole 128-byte swizzle chunks, or 1.5 of them (16-bit d = 96)");
  static_assert(!kFp8 || (kBlockN % 128 == 0 && !kCrossTile), "FP8: V^T rows are whole 128-key chunks");
  // V's tile in shared memory: (block_n, d) in 64-column chunks (MN-major B of P V), or for FP8 V^T, (d, block_n)
  // in 128-key chunks (K-major B).
  static constexpr int kVChunks = kFp8 ? kBlockN / 128 : kChunksV;
  static constexpr int kVRows = kFp8 ? kHeadDim : kBlockN;
  static constexpr int kVCols = kFp8 ? 128 : 64;

  // Registers per thread after setmaxnreg (64K per SM). Two consumers: 232 each, 40 for the producer's tile
  // bookkeeping, unless the accumulators are large (d = 256: O alone is 128 registers; block_n > 128): then 240
  // and 24. Three consumers (block_m 192): 160 each, the producer 32.
  static constexpr bool kLargeAccumulators = kHeadDimV > 128 || kBlockN > 128;
  static constexpr int kProducerRegisters = kConsumers == 3 ? 32 : kLargeAccumulators ? 24 : 40;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : kLargeAccumulators ? 240 : 232;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <= 65536);

  // Whether `consume` keeps a tile's mask band in registers across its key loop or recomputes it on the tiles
  // that need the mask: keeping it pays at d = 64 and costs the d = 256 kernel (O fills its registers).
  static constexpr bool kKeepBand = kHeadDim <= 64;

  using Softmax = FwdSoftmax<kBlockN>;
  // Bytes TMA writes per tile: whole chunks, the columns past the tensor's width zero-filled.
  static constexpr uint32_t kQBytes = kBlockM * kChunks * kChunkCols * kElementBytes;
  static constexpr uint32_t kKTileBytes = kBlockN * kChunks * kChunkCols * kElementBytes;
  static constexpr uint32_t kVTileBytes = kFp8 ? kKTileBytes : kBlockN * kChunksV * kChunkCols * kElementBytes;

  struct SharedStorage {
    alignas(1024) Element q[kQBuffers][kChunks][kBlockM][kChunkCols];  // (block_m, d), 128B swizzle, K-major A of Q K^T
    alignas(1024) Element k[kStages][kChunks][kBlockN][kChunkCols];    // (block_n, d), 128B swizzle, K-major B of Q K^T
    alignas(1024) Element v[kStages][kVChunks][kVRows][kVCols];        // V or V^T (above), 128B swizzle, B of P V
    uint64_t q_full[kQBuffers];
    uint64_t q_empty[kQBuffers];
    int tile_id[kQBuffers];  // tile whose Q the buffer's current q_full phase delivers; -1 = no more tiles
    uint64_t k_full[kStages];
    uint64_t v_full[kStages];
    uint64_t k_empty[kStages];
    uint64_t v_empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + the base's alignment
  static_assert(kSmemBytes <= 232448, "forward tile configuration exceeds the 227 KB shared-memory limit");

  // What every role needs of a tile's query rows, from the sequence and mask policy, in 32-bit registers: the
  // K/V tiles it visits [n_min, n_max] (tiles entirely outside every row's window are skipped) and the keys that
  // every row of the CTA sees (K/V tiles inside them need no element mask). The producer and the consumers compute
  // the same values.
  struct TileKeys {
    int n_min, n_max;
    int unmasked_lo, unmasked_hi;
    __device__ __forceinline__ int count() const { return n_max >= n_min ? n_max - n_min + 1 : 0; }
    __device__ __forceinline__ bool needs_mask(int n) const {
      return n * kBlockN < unmasked_lo || n * kBlockN + kBlockN - 1 > unmasked_hi;
    }
  };
  // The band of allowed key-minus-query offsets, from which each row's key window follows on the tiles that
  // need the element mask.
  struct TileBand {
    int band_lo, band_hi;  // clamped to [-seqlen_q, seqlen_k]: row + band stays within 32 bits
    int seqlen_k;
    // Keys [lo, hi] query row `row` sees (the tail past seqlen_k folded into hi).
    __device__ __forceinline__ void row_window(int row, int& lo, int& hi) const {
      lo = kMasked ? max(row + band_lo, 0) : 0;
      hi = kMasked ? min(row + band_hi, seqlen_k - 1) : seqlen_k - 1;
    }
  };
  static __device__ __forceinline__ detail::SequenceMask sequence_mask(const FwdParams& p, int batch) {
    const detail::SequenceInfo si = p.seq.info(batch);
    return detail::SequenceMask::make(p.mask, si.seqlen_q, si.seqlen_k);
  }
  static __device__ __forceinline__ TileKeys tile_keys(const detail::SequenceMask& m, int m_block) {
    const int m_first = m_block * kBlockM;
    const int m_last = min(m_first + kBlockM, static_cast<int>(m.seqlen_q)) - 1;
    const int seqlen_k = static_cast<int>(m.seqlen_k);
    if (m_first >= m.seqlen_q || seqlen_k <= 0) return {0, -1, 0, -1};  // no rows or no keys: nothing to visit
    TileKeys t{0, (seqlen_k - 1) / kBlockN, 0, seqlen_k - 1};
    if constexpr (kMasked) {
      const detail::IndexRange any = m.keys_of_any_row(m_first, m_last);
      const detail::IndexRange every = m.keys_of_every_row(m_first, m_last);
      if (any.hi < any.lo || any.hi < 0) {
        t.n_min = 0;
        t.n_max = -1;
      } else {
        t.n_min = static_cast<int>(any.lo) / kBlockN;
        t.n_max = static_cast<int>(any.hi) / kBlockN;
      }
      t.unmasked_lo = static_cast<int>(every.lo);
      t.unmasked_hi = static_cast<int>(every.hi);
    }
    return t;
  }
  static __device__ __forceinline__ TileBand tile_band(const detail::SequenceMask& m) {
    return {static_cast<int>(max(m.band_lo, -m.seqlen_q)), static_cast<int>(min(m.band_hi, m.seqlen_k)),
            static_cast<int>(m.seqlen_k)};
  }
};

}  // namespace flash4::sm90
