// Host side of TMA: encode CUtensorMaps for (batch, seqlen, heads, head_dim) tensors with 128-byte swizzle.
// cuTensorMapEncodeTiled is a driver API function; we fetch it through the runtime's entry-point query so the
// library needs no -lcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "flash4/error.h"

namespace flash4::sm90 {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess || ptr == nullptr) {
      throw Error(Status::kCudaError, "flash4: cannot find cuTensorMapEncodeTiled in the CUDA driver");
    }
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// Tensor map over a 4-D (b, s, h, d) tensor with d contiguous and element strides `stride_*`. The box is
// (box_cols, box_rows, 1 head, 1 batch); with 128-byte swizzle box_cols * element bytes must be 128.
inline CUtensorMap make_tensor_map_4d(const void* base, CUtensorMapDataType type, int elem_bytes, int64_t batch,
                                      int64_t seqlen, int64_t heads, int64_t head_dim, int64_t stride_b,
                                      int64_t stride_s, int64_t stride_h, int box_cols, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(stride_s * elem_bytes),
                                 static_cast<cuuint64_t>(stride_h * elem_bytes),
                                 static_cast<cuuint64_t>(stride_b * elem_bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled_fn()(&map, type, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw Error(Status::kCudaError, "flash4: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r) +
                                        " for a (" + std::to_string(batch) + ", " + std::to_string(seqlen) + ", " +
                                        std::to_string(heads) + ", " + std::to_string(head_dim) +
                                        ") tensor with element strides (" + std::to_string(stride_b) + ", " +
                                        std::to_string(stride_s) + ", " + std::to_string(stride_h) + ", 1)");
  }
  return map;
}

// A 16-bit (b, s, h, d) tensor (bf16 or fp16: TMA moves bits, so UINT16 serves both). Box: 64 columns = 128
// bytes by box_rows rows, one 128B-swizzled shared-memory chunk.
inline CUtensorMap make_tensor_map_bshd(const void* base, int64_t batch, int64_t seqlen, int64_t heads,
                                        int64_t head_dim, int64_t stride_b, int64_t stride_s, int64_t stride_h,
                                        int box_rows) {
  return make_tensor_map_4d(base, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, batch, seqlen, heads, head_dim, stride_b,
                            stride_s, stride_h, 64, box_rows);
}

// The backward's contiguous fp32 dQ accumulator, laid out (b, h, s, d). Box: 32 columns = 128 bytes by box_rows
// rows, 128B-swizzled (TMA reduce-add target; rows past seqlen are clipped).
inline CUtensorMap make_tensor_map_f32_bhsd(float* base, int64_t batch, int64_t heads, int64_t seqlen,
                                            int64_t head_dim, int box_rows) {
  return make_tensor_map_4d(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, batch, seqlen, heads, head_dim,
                            heads * seqlen * head_dim, head_dim, seqlen * head_dim, 32, box_rows);
}

}  // namespace flash4::sm90
