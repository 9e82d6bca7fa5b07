// The public KV-cache entry points (flash4/kvcache.h): validate, pick the backend from the tensors' device, run.
#include <string>

#include "api/kvcache_backends.h"

namespace flash4 {
namespace {

bool is_cpu(const TensorView& t) { return t.device.kind == DeviceKind::kCpu; }

}  // namespace

Support can_implement(const KvCacheArgs& args) {
  const detail::KvCacheProblem p = detail::validate(args);
  if (is_cpu(args.q)) return {};
  return detail::cuda_can_forward_kvcache(args, p);
}

void forward_kvcache(const KvCacheArgs& args, Stream stream) {
  const detail::KvCacheProblem p = detail::validate(args);
  if (!is_cpu(args.q)) {
    if (const Support s = detail::cuda_can_forward_kvcache(args, p); !s)
      throw Error(Status::kNotSupported, std::string("flash4::forward_kvcache: ") + s.reason);
    detail::cuda_forward_kvcache(args, p, stream);
    return;
  }
  detail::cpu_forward_kvcache(args, p);
}

}  // namespace flash4
