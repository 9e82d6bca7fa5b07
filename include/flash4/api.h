// flash4 public API: exact attention forward and backward (FlashAttention-4 algorithm), on the CPU or on
// Hopper GPUs. Conventions follow FlashAttention 2/3/4:
//   q    (batch, seqlen_q, heads,    head_dim)      out like q
//   k, v (batch, seqlen_k, heads_kv, head_dim)      heads % heads_kv == 0 (GQA / MQA)
//   lse  (batch, heads, seqlen_q) fp32, natural log; -inf for a fully masked row (whose out is 0)
// Causal masking is aligned bottom-right: query i sees key j iff j <= i + seqlen_k - seqlen_q. A window
// (left, right), -1 = unbounded, allows i + sk - sq - left <= j <= i + sk - sq + right. Softcap c > 0 replaces
// the score s = q.k * softmax_scale by c * tanh(s / c). C callers: flash4/c_api.h.
#pragma once

#include <string>

#include "flash4/error.h"
#include "flash4/types.h"

namespace flash4 {

// How exp2 is evaluated in the softmax (forward). kAuto lets each backend pick what is fastest on it.
enum class Exp2Mode : int {
  kAuto = 0,
  kExact = 1,       // hardware / libm exp2 everywhere
  kPolynomial = 2,  // FMA-pipe polynomial (FA4) for the elements the backend's pattern selects (CPU: all;
                    // GPU: the tile table's share, currently none: it measured slower on H200)
};

// Knobs for ablations and tests; defaults are what users want.
struct Tuning {
  Exp2Mode exp2 = Exp2Mode::kAuto;
  bool conditional_rescale = true;  // FA4: rescale O and l only when the row max grows by > 2^8
};

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;
  TensorView lse;               // optional: leave data == nullptr and shape zero to skip
  float softmax_scale = 0.0f;   // 0 means 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1;         // -1 = unbounded
  int window_right = -1;
  float softcap = 0.0f;         // 0 = off
  Tuning tuning{};
};

struct BackwardArgs {
  TensorView dout, q, k, v, out, lse;  // lse as produced by forward (required)
  TensorView dq, dk, dv;               // outputs, same shapes and dtypes as q, k, v
  float softmax_scale = 0.0f;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool deterministic = false;          // bit-identical gradients run to run
};

// Result of can_implement: ok, or the reason this device cannot run the configuration.
struct Support {
  bool ok = true;
  std::string reason;
  explicit operator bool() const { return ok; }
};

// What can_implement validates. kWithoutBuffers checks shapes, strides, dtypes, devices and values but not the
// data pointers (null is fine) nor aliasing, so that a configuration can be checked before its memory is
// allocated (sizes that overflow are still refused); forward and backward always check everything.
enum class Validation : int { kFull = 0, kWithoutBuffers = 1 };

// Validates the arguments (throws Error(kInvalidArgument) on bad input) and reports whether the device the
// tensors live on can run them.
Support can_implement(const ForwardArgs& args, Validation scope = Validation::kFull);
Support can_implement(const BackwardArgs& args, Validation scope = Validation::kFull);

// Run attention. Throw flash4::Error; on any error nothing is written to the outputs.
// CUDA work is enqueued on `stream` and not synchronized.
void forward(const ForwardArgs& args, Stream stream = nullptr);
void backward(const BackwardArgs& args, Stream stream = nullptr);

// True when a CUDA device usable by flash4 (sm_90) is present and the library was built with CUDA.
bool cuda_available(int device_index = 0);

// Version string, e.g. "0.1.0".
const char* version();

}  // namespace flash4
