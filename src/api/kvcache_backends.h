// The internal contract of KV-cache attention between the API layer (src/api/kvcache_api.cpp) and the backends,
// apart from backends.h so the dense/packed contract stays as it is.
#pragma once

#include "common/kvcache_problem.h"
#include "flash4/kvcache.h"

namespace flash4::detail {

// Validates everything visible on the host (throws Error(kInvalidArgument) naming the argument) and returns the
// normalized problem. Defined in src/api/validate_kvcache.cpp.
KvCacheProblem validate(const KvCacheArgs& args);

// CPU backend (src/cpu/kvcache_forward.cpp): append (with rotary), split-KV attention, LSE combine.
void cpu_forward_kvcache(const KvCacheArgs& args, const KvCacheProblem& p);

// CUDA backend (src/kernels/sm90/decode): append (with rotary), split-KV decode attention, combine. In a build
// without CUDA these report "built without CUDA" (src/api/cuda_stub.cc).
Support cuda_can_forward_kvcache(const KvCacheArgs& args, const KvCacheProblem& p);
void cuda_forward_kvcache(const KvCacheArgs& args, const KvCacheProblem& p, Stream stream);

}  // namespace flash4::detail
