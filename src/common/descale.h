// FP8 descale factors: one fp32 per (batch entry, kv head) by which FP8 q, k or v values are multiplied to give
// the real inputs (x = fp8 value * descale), as in FlashAttention 3's FP8 API. Plain data, host and device.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

struct Descale {
  const float* data = nullptr;  // (batch, heads_kv) fp32; null = 1 everywhere
  int64_t stride_batch = 0, stride_head = 0;

  // The factor of batch entry b (a packed batch's segment b), kv head hk; query head h uses hk = h / group.
  FLASH4_HD float at(int64_t b, int64_t hk) const {
    return data == nullptr ? 1.0f : data[b * stride_batch + hk * stride_head];
  }
};

}  // namespace flash4::detail
