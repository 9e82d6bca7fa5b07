// The Hopper layer tested alone: TMA 4-D loads with 128B swizzle completing on an mbarrier, wgmma SS with a
// K-major B (the Q K^T case) and wgmma RS with an MN-major B (the P V case), against host matmuls.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/tma.cuh"
#include "hw/sm90/tma_map.h"
#include "hw/sm90/wgmma.cuh"

namespace flash4::sm90 {
namespace {

constexpr int kRows = 64;  // M of the MMA, and N, and K: every operand is a 64 x 64 tile

struct alignas(1024) HwSmem {
  __nv_bfloat16 a[kRows][64];  // A (M x K), K-major
  __nv_bfloat16 b[kRows][64];  // B^T (N x K), K-major: C = A B^T
  __nv_bfloat16 v[kRows][64];  // V (K x N), N contiguous: MN-major B of D = A V
  uint64_t full;
};

// One warpgroup. c = A B^T (SS), d = A V (RS with A from registers); both 64 x 64 fp32, row-major.
__global__ void hw_mma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                              const __grid_constant__ CUtensorMap map_v, const __nv_bfloat16* a_global, float* c,
                              float* d) {
  extern __shared__ char raw[];
  HwSmem& s = *reinterpret_cast<HwSmem*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  if (threadIdx.x == 0) {
    mbarrier::init(&s.full, 1);
    mbarrier::fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier::arrive_expect_tx(&s.full, 3 * kRows * 64 * 2);
    tma::load_4d(&s.a[0][0], &map_a, 0, 0, 0, 0, &s.full);
    tma::load_4d(&s.b[0][0], &map_b, 0, 0, 0, 0, &s.full);
    tma::load_4d(&s.v[0][0], &map_v, 0, 0, 0, 0, &s.full);
  }
  mbarrier::wait(&s.full, 0);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc_c[32], acc_d[32];
  for (int i = 0; i < 32; ++i) acc_c[i] = acc_d[i] = 0.0f;
  // A fragments from global memory, mma.m16n8k16 layout: k-step j, register r holds (row, k), (row, k+1).
  uint32_t a_frag[4][4];
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 4; ++r) {
      const int row = warp * 16 + lane / 4 + 8 * (r % 2);
      const int col = 16 * j + 2 * (lane % 4) + 8 * (r / 2);
      __nv_bfloat162 pair{a_global[row * 64 + col], a_global[row * 64 + col + 1]};
      a_frag[j][r] = *reinterpret_cast<uint32_t*>(&pair);
    }
  wgmma::fence();
  for (int ks = 0; ks < 4; ++ks) {
    wgmma::mma_ss<64, 0, __nv_bfloat16>(acc_c, wgmma::make_desc_sw128(&s.a[0][ks * 16], 16, 1024),
                                        wgmma::make_desc_sw128(&s.b[0][ks * 16], 16, 1024), ks > 0);
  }
  for (int ks = 0; ks < 4; ++ks) {
    wgmma::mma_rs<64, 1, __nv_bfloat16>(acc_d, a_frag[ks], wgmma::make_desc_sw128(&s.v[ks * 16][0], kRows * 128, 1024),
                                        ks > 0);
  }
  wgmma::commit_group();
  wgmma::wait_group<0>();
  wgmma::fence_operand(acc_c);
  wgmma::fence_operand(acc_d);
  for (int i = 0; i < 32; ++i) {
    const int row = warp * 16 + lane / 4 + 8 * ((i / 2) % 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    c[row * 64 + col] = acc_c[i];
    d[row * 64 + col] = acc_d[i];
  }
}

TEST(HopperLayer, TmaSwizzledLoadsAndWgmmaSsRs) {
  std::mt19937 gen(1234 + static_cast<unsigned>(time(nullptr)));
  std::normal_distribution<float> normal;
  const int n = kRows * 64;
  std::vector<__nv_bfloat16> a(n), b(n), v(n);
  for (int i = 0; i < n; ++i) {
    a[i] = __float2bfloat16(normal(gen));
    b[i] = __float2bfloat16(normal(gen));
    v[i] = __float2bfloat16(normal(gen));
  }
  __nv_bfloat16 *ga, *gb, *gv;
  float *gc, *gd;
  ASSERT_EQ(cudaMalloc(&ga, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gb, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gv, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gc, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gd, n * 4), cudaSuccess);
  cudaMemcpy(ga, a.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(gb, b.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(gv, v.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemset(gc, 0xFF, n * 4);  // NaN poison
  cudaMemset(gd, 0xFF, n * 4);
  // As (b=1, s=64, h=1, d=64) tensors.
  const CUtensorMap ma = make_tensor_map_bshd(ga, 1, kRows, 1, 64, n, 64, 64, kRows);
  const CUtensorMap mb = make_tensor_map_bshd(gb, 1, kRows, 1, 64, n, 64, 64, kRows);
  const CUtensorMap mv = make_tensor_map_bshd(gv, 1, kRows, 1, 64, n, 64, 64, kRows);
  const int smem = sizeof(HwSmem) + 1024;
  ASSERT_EQ(cudaFuncSetAttribute(hw_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  hw_mma_kernel<<<1, 128, smem>>>(ma, mb, mv, ga, gc, gd);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> c(n), d(n);
  cudaMemcpy(c.data(), gc, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(d.data(), gd, n * 4, cudaMemcpyDeviceToHost);
  double err_c = 0, err_d = 0;
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < 64; ++j) {
      double rc = 0, rd = 0;
      for (int k = 0; k < 64; ++k) {
        rc += double(__bfloat162float(a[i * 64 + k])) * __bfloat162float(b[j * 64 + k]);
        rd += double(__bfloat162float(a[i * 64 + k])) * __bfloat162float(v[k * 64 + j]);
      }
      err_c = std::max(err_c, std::isnan(c[i * 64 + j]) ? 1e30 : std::abs(c[i * 64 + j] - rc));
      err_d = std::max(err_d, std::isnan(d[i * 64 + j]) ? 1e30 : std::abs(d[i * 64 + j] - rd));
    }
  EXPECT_LT(err_c, 1e-3) << "wgmma SS (K-major B) or TMA swizzle mismatch";
  EXPECT_LT(err_d, 1e-3) << "wgmma RS (MN-major B) mismatch";
  cudaFree(ga);
  cudaFree(gb);
  cudaFree(gv);
  cudaFree(gc);
  cudaFree(gd);
}

// The offset of a 1024-aligned dynamic shared-memory declaration within the CTA's shared window, modulo 1024.
__global__ void smem_base_offset_kernel(unsigned* out) {
  extern __shared__ __align__(1024) char smem_base[];
  smem_base[0] = 1;  // keep the array in use
  if (threadIdx.x == 0) *out = static_cast<unsigned>(__cvta_generic_to_shared(smem_base)) & 1023u;
}

// The d = 64 / 128 backward kernel allocates no slack for realigning its shared memory (bwd_wgmma_entry.cuh): the
// declared alignment must hold at every dynamic size, up to the 227 KB opt-in.
TEST(HopperLayer, DynamicSharedMemoryBaseIs1024Aligned) {
  unsigned* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaFuncSetAttribute(&smem_base_offset_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448),
            cudaSuccess);
  for (int bytes : {1024, 48 * 1024, 100 * 1024, 232448}) {
    ASSERT_EQ(cudaMemset(out, 0xff, sizeof(unsigned)), cudaSuccess);
    smem_base_offset_kernel<<<2, 128, bytes>>>(out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    unsigned offset = 0;
    ASSERT_EQ(cudaMemcpy(&offset, out, sizeof(unsigned), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(offset, 0u) << "dynamic shared memory of " << bytes << " bytes";
  }
  cudaFree(out);
}

}  // namespace
}  // namespace flash4::sm90
