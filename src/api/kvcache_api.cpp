// The public KV-cache entry points (flash4/kvcache.h): validate, pick the backend from the tensors' device, run.
#include <string>

#include "api/kvcache_backends.h"

namespace flash4 {
namespace {

// ---- GPU KV-cache gate: the one place that refuses CUDA tensors. Replace with the CUDA backend's own
// can_implement / launch when the split-KV decode kernel and its combine kernel exist. ----
Support cuda_kvcache_support() { return {false, "KV-cache attention is not yet implemented on the GPU path"}; }

bool is_cpu(const TensorView& t) { return t.device.kind == DeviceKind::kCpu; }

}  // namespace

Support can_implement(const KvCacheArgs& args) {
  detail::validate(args);
  if (is_cpu(args.q)) return {};
  return cuda_kvcache_support();
}

void forward_kvcache(const KvCacheArgs& args, Stream) {
  const detail::KvCacheProblem p = detail::validate(args);
  if (!is_cpu(args.q)) {
    throw Error(Status::kNotSupported, std::string("flash4::forward_kvcache: ") + cuda_kvcache_support().reason);
  }
  detail::cpu_forward_kvcache(args, p);
}

}  // namespace flash4
