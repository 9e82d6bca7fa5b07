// The CUDA backend of a build without CUDA: every CUDA tensor is refused with the reason. (A .cc file so the
// api/*.cpp glob leaves it to src/CMakeLists.txt, which adds it only when FLASH4_WITH_CUDA is off.)
#include <string>

#include "api/backends.h"
#include "api/kvcache_backends.h"

namespace flash4::detail {
namespace {
constexpr const char* kNoCuda = "flash4 was built without CUDA";
}  // namespace

Support cuda_can_forward(const ForwardArgs&, const Problem&) { return {false, kNoCuda}; }
Support cuda_can_backward(const BackwardArgs&, const Problem&) { return {false, kNoCuda}; }

void cuda_forward(const ForwardArgs&, const Problem&, Stream) {
  throw Error(Status::kNotSupported, std::string("flash4::forward: ") + kNoCuda);
}
void cuda_backward(const BackwardArgs&, const Problem&, Stream) {
  throw Error(Status::kNotSupported, std::string("flash4::backward: ") + kNoCuda);
}

Support cuda_can_forward_kvcache(const KvCacheArgs&, const KvCacheProblem&) { return {false, kNoCuda}; }
void cuda_forward_kvcache(const KvCacheArgs&, const KvCacheProblem&, Stream) {
  throw Error(Status::kNotSupported, std::string("flash4::forward_kvcache: ") + kNoCuda);
}

bool cuda_device_supported(int) { return false; }

}  // namespace flash4::detail
