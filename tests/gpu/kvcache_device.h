// A KvCacheCase (tests/common/kvcache_case.h) on the device: every tensor, index tensors included, mirrored to
// device memory (device-resident indices: the kernels clamp them, nothing is read on the host), the KvCacheArgs
// of those mirrors, and the way back (out, lse and both caches into the case's host tensors).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common/kvcache_case.h"
#include "device_mirror.h"
#include "flash4/kvcache.h"

namespace flash4::test {

#define FLASH4_REQUIRE_GPU() \
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU"

// A GPU test's case: the GPU's own split count unless the test asks for one.
inline KvCaseSpec gpu_kv_spec(int64_t batch, int64_t seqlen_q, int64_t heads, int64_t heads_kv,
                              std::vector<int64_t> lengths, int64_t head_dim = 128,
                              DType dtype = DType::kBFloat16) {
  KvCaseSpec s;
  s.batch = batch;
  s.seqlen_q = seqlen_q;
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  s.dtype = dtype;
  s.cache_lengths = std::move(lengths);
  s.num_splits = 0;
  return s;
}

class DeviceKvCall {
 public:
  explicit DeviceKvCall(KvCacheCase& c) : c_(c) {
    args = c.args();
    mirror(c.q, args.q);
    mirror(c.k_cache, args.k_cache);
    mirror(c.v_cache, args.v_cache);
    mirror(c.out, args.out);
    mirror(c.lse, args.lse);
    if (args.k.data != nullptr) {
      mirror(c.k, args.k);
      mirror(c.v, args.v);
    }
    if (args.rotary_cos.data != nullptr) {
      mirror(c.cos, args.rotary_cos);
      mirror(c.sin, args.rotary_sin);
    }
    if (args.learnable_sink.data != nullptr) mirror(c.sink, args.learnable_sink);
    if (args.cache_seqlens.data != nullptr) index(c.cache_seqlens, args.cache_seqlens);
    if (args.cache_batch_idx.data != nullptr) index(c.cache_batch_idx, args.cache_batch_idx);
    if (args.block_table.data != nullptr) index(c.block_table, args.block_table);
    if (args.cache_leftpad.data != nullptr) index(c.cache_leftpad, args.cache_leftpad);
  }

  bool ok() const {
    for (const auto& m : mirrors_)
      if (!m->ok()) return false;
    return true;
  }
  // Replaces the device copy of an index tensor (cache_seqlens, cache_batch_idx or block_table) by `values`.
  cudaError_t set_index(const TensorView& view, const std::vector<int32_t>& values) {
    return cudaMemcpy(view.data, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
  // out, lse and the caches back into the case.
  cudaError_t download() {
    for (DeviceMirror* m : {out_, lse_, k_cache_, v_cache_})
      if (const cudaError_t e = m->download(); e != cudaSuccess) return e;
    return cudaSuccess;
  }
  // The flash4 call on the device, synchronized.
  cudaError_t run() {
    forward_kvcache(args);
    if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return e;
    return download();
  }

  KvCacheArgs args;

 private:
  // The device copy of `host` replaces `view`'s data (shape and strides stay those of c.args()).
  DeviceMirror* mirror(HostTensor& host, TensorView& view) {
    mirrors_.push_back(std::make_unique<DeviceMirror>(host));
    DeviceMirror* m = mirrors_.back().get();
    view.data = const_cast<void*>(m->view().data);
    view.device = Device::cuda(0);
    if (&host == &c_.out) out_ = m;
    if (&host == &c_.lse) lse_ = m;
    if (&host == &c_.k_cache) k_cache_ = m;
    if (&host == &c_.v_cache) v_cache_ = m;
    return m;
  }
  void index(const std::vector<int32_t>& values, TensorView& view) {
    indices_.push_back(std::make_unique<HostTensor>(HostTensor::vector(DType::kInt32, int64_t(values.size()))));
    std::memcpy(indices_.back()->data(), values.data(), values.size() * sizeof(int32_t));
    mirror(*indices_.back(), view);
  }

  KvCacheCase& c_;
  std::vector<std::unique_ptr<DeviceMirror>> mirrors_;
  std::vector<std::unique_ptr<HostTensor>> indices_;
  DeviceMirror *out_ = nullptr, *lse_ = nullptr, *k_cache_ = nullptr, *v_cache_ = nullptr;
};

}  // namespace flash4::test
