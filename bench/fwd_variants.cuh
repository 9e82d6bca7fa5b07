// flash4_bench's forward kernel variants (--ablation, --candidates): tile configurations the library does not
// compile, the library's launch with another tile order, each launched through the library's parameter builder.
// Compiled only with FLASH4_BENCH_VARIANTS (a build without them is quicker for A/B runs of the library). Included
// by flash4_bench.cu after its Shape, Launcher and Variant.
#pragma once

#include <vector>

namespace fwd_variants {

#if FLASH4_BENCH_VARIANTS
// A kernel configuration the library does not compile, launched through the same parameter builder.
// kPersistent: 1 = one CTA per SM claiming tiles, 0 = one CTA per tile, -1 = the library's launch rule.
template <int kHeadDim, bool kMasked, template <int, bool> class Config, int kPersistent = -1>
void variant_forward(const flash4::ForwardArgs& a) {
  const flash4::detail::Problem p = flash4::detail::validate(a);
  using Cfg = Config<kHeadDim, kMasked>;
  const bool persistent = kPersistent >= 0 ? kPersistent != 0 : flash4::detail::choose_fwd_launch(p).persistent;
  flash4::sm90::launch_forward_kernel<__nv_bfloat16, kHeadDim, kMasked, Cfg>(
      flash4::detail::make_fwd_params(a, p, Cfg::tile), persistent, nullptr);
}

// The library's own launch with another L2 section in the masked tile order (fwd_tile_scheduler.h):
// kSectionMb < 0: one (batch, head) pair per section (head-major), 0: one section of all pairs, else the pairs
// whose K/V fit kSectionMb MB.
template <int kHeadDim, bool kMasked, int kSectionMb>
void section_forward(const flash4::ForwardArgs& a) {
  const flash4::detail::Problem p = flash4::detail::validate(a);
  const flash4::sm90::FwdLaunchConfig launch = flash4::detail::choose_fwd_launch(p);
  flash4::sm90::FwdParams params = flash4::detail::make_fwd_params(a, p, launch.tile);
  const int64_t pairs = p.batch * p.heads;
  params.tile_section = kSectionMb < 0    ? 1
                        : kSectionMb == 0 ? static_cast<int>(pairs)
                                          : flash4::sm90::fwd_tile_section(pairs, p.group(), p.seqlen_k, p.head_dim,
                                                                           p.head_dim_v, 2, int64_t(kSectionMb) << 20);
  flash4::sm90::launch_forward<__nv_bfloat16, kHeadDim, kMasked>(params, launch, nullptr);
}
template <int kSectionMb>
Launcher section_launcher(const Shape& sh) {
  switch (sh.d) {
    case 64: return sh.causal ? &section_forward<64, true, kSectionMb> : nullptr;
    case 128: return sh.causal ? &section_forward<128, true, kSectionMb> : nullptr;
    case 256: return sh.causal ? &section_forward<256, true, kSectionMb> : nullptr;
  }
  return nullptr;
}

template <template <int, bool> class Config, int kPersistent = -1>
Launcher variant_launcher(const Shape& sh) {
  switch (sh.d) {
    case 64: return sh.causal ? &variant_forward<64, true, Config, kPersistent> : &variant_forward<64, false, Config, kPersistent>;
    case 96: return sh.causal ? &variant_forward<96, true, Config, kPersistent> : &variant_forward<96, false, Config, kPersistent>;
    case 128: return sh.causal ? &variant_forward<128, true, Config, kPersistent> : &variant_forward<128, false, Config, kPersistent>;
    case 256: return sh.causal ? &variant_forward<256, true, Config, kPersistent> : &variant_forward<256, false, Config, kPersistent>;
  }
  return nullptr;
}

template <int kHeadDim, template <int, bool> class Config, int kPersistent = -1>
Launcher launcher_for(const Shape& sh) {
  return sh.causal ? &variant_forward<kHeadDim, true, Config, kPersistent>
                   : &variant_forward<kHeadDim, false, Config, kPersistent>;
}

// The configurations of the ablation and the candidates: the tile table's entry with named edits.
using flash4::sm90::fwd_tile_config;
using flash4::sm90::FwdTileConfig;
template <int D, bool M> struct Table { static constexpr FwdTileConfig tile = fwd_tile_config(D, M); };
template <int D, bool M> struct Plain {  // warp specialization alone
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_intra_wg_overlap(false).with_pingpong(false);
};
template <int D, bool M> struct Overlap {
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_intra_wg_overlap(true).with_pingpong(false);
};
template <int D, bool M> struct OverlapPingPong {
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_intra_wg_overlap(true).with_pingpong(true);
};
template <int D, bool M> struct PingPongOn { static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_pingpong(true); };
template <int D, bool M> struct PingPongOff { static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_pingpong(false); };
template <int kPer8>
struct Poly {
  template <int D, bool M> struct Of {
    static constexpr FwdTileConfig tile =
        fwd_tile_config(D, M).with_intra_wg_overlap(true).with_pingpong(false).with_poly_exp2_per_8(kPer8);
  };
};
template <int D, bool M> struct Stages3 { static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_stages(3); };
template <int D, bool M> struct SingleP { static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_double_p(false); };
template <int D, bool M> struct DoubleP { static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_double_p(true); };
template <int D, bool M> struct Tile128 {
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_intra_wg_overlap(true).with_tile(128, 128);
};
template <int D, bool M> struct Tile128PingPong {
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_tile(128, 128).with_pingpong(true);
};
template <int D, bool M> struct Tile128Stages2 {
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_tile(128, 128).with_stages(2);
};
template <int D, bool M> struct Tile128DoubleP {
  static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_tile(128, 128).with_double_p(true);
};
// Three consumers (192 query rows, 160 registers each) with one P buffer and block_n keys.
template <int kBlockN>
struct ThreeConsumers {
  template <int D, bool M> struct Of {
    static constexpr FwdTileConfig tile = fwd_tile_config(D, M).with_tile(192, kBlockN).with_double_p(false);
  };
};
template <int D, bool M> struct ThreeConsumersStages3 {
  static constexpr FwdTileConfig tile = ThreeConsumers<96>::Of<D, M>::tile.with_stages(3);
};


// The ablation ladder of the forward issue, then tuning candidates. Each step adds one idea.
std::vector<Variant> ablation(const Shape& sh) {
  const flash4::Tuning exact_always{flash4::Exp2Mode::kExact, false};
  const flash4::Tuning exact_cond{flash4::Exp2Mode::kExact, true};
  std::vector<Variant> v = {
      {"1_warp_specialized", exact_always, variant_launcher<Plain>(sh)},
      {"2_+intra_wg_overlap", exact_always, variant_launcher<Overlap>(sh)},
      {"3_+pingpong", exact_always, variant_launcher<OverlapPingPong>(sh)},
      {"4_+conditional_rescale", exact_cond, variant_launcher<OverlapPingPong>(sh)},
      {"5_+exp2_emulation", {}, variant_launcher<OverlapPingPong>(sh)},
      {"overlap_condrescale_exact", exact_cond, variant_launcher<Overlap>(sh)},
      {"non_persistent", {}, variant_launcher<Table, 0>(sh)},
      {"persistent", {}, variant_launcher<Table, 1>(sh)},
      {"pingpong_on", {}, variant_launcher<PingPongOn>(sh)},
      {"pingpong_off", {}, variant_launcher<PingPongOff>(sh)},
      {"poly_1of8", {}, variant_launcher<Poly<1>::Of>(sh)},
      {"poly_2of8", {}, variant_launcher<Poly<2>::Of>(sh)},
      {"poly_4of8", {}, variant_launcher<Poly<4>::Of>(sh)},
  };
  if (sh.d == 128) v.push_back({"stages_3", {}, launcher_for<128, Stages3>(sh)});
  return v;
}

// Tile-table candidates per head dim (--candidates, every seqlen): launch modes and other tile shapes.
std::vector<Variant> tile_candidates(const Shape& sh) {
  std::vector<Variant> v = {{"persistent", {}, variant_launcher<Table, 1>(sh)},
                            {"non_persistent", {}, variant_launcher<Table, 0>(sh)}};
  // The masked tile order's L2 section: one (batch, head) pair (head-major), 16 MB of K/V.
  if (sh.causal && (sh.d == 64 || sh.d == 128 || sh.d == 256)) {
    v.push_back({"order_head_major", {}, section_launcher<-1>(sh)});
    v.push_back({"order_section_16mb", {}, section_launcher<16>(sh)});
  }
  // One P buffer at d = 128 (the table has two), two at d = 256 (d = 64 has no registers for a second one).
  if (sh.d == 128) v.push_back({"single_p", {}, launcher_for<128, SingleP>(sh)});
  if (sh.d == 96) {  // the d = 128 tile with two P buffers, and three consumers on 192 x 96
    v.push_back({"m128_n128", {}, launcher_for<96, Tile128DoubleP>(sh)});
    v.push_back({"m192_n96", {}, launcher_for<96, ThreeConsumers<96>::Of>(sh)});
    v.push_back({"m192_n96_stages3", {}, launcher_for<96, ThreeConsumersStages3>(sh)});
  }
  if (sh.d == 256) v.push_back({"double_p", {}, launcher_for<256, DoubleP>(sh)});
  if (sh.d == 64) {
    v.push_back({"m128", {}, launcher_for<64, Tile128>(sh)});
    v.push_back({"m128_pingpong", {}, launcher_for<64, Tile128PingPong>(sh)});
    v.push_back({"m128_stages2", {}, launcher_for<64, Tile128Stages2>(sh)});
    v.push_back({"poly_1of8", {}, launcher_for<64, Poly<1>::Of>(sh)});
  }
  return v;
}

#else
// Built without the variant kernels (-DFLASH4_BENCH_VARIANTS=OFF: a quick build for A/B runs of the library).
std::vector<Variant> ablation(const Shape&) { return {}; }
std::vector<Variant> tile_candidates(const Shape&) { return {}; }
#endif

}  // namespace fwd_variants
