// flash4 public API: exact attention forward and backward (FlashAttention-4 algorithm), on the CPU or on
// Hopper GPUs. Conventions follow FlashAttention 2/3/4:
//   q    (batch, seqlen_q, heads,    head_dim)      out (batch, seqlen_q, heads,    head_dim_v)
//   k    (batch, seqlen_k, heads_kv, head_dim)      v   (batch, seqlen_k, heads_kv, head_dim_v)
//   lse  (batch, heads, seqlen_q) fp32, natural log; -inf for a fully masked row (whose out is 0)
// heads % heads_kv == 0 (GQA / MQA). head_dim and head_dim_v are multiples of 8 in [8, 256]; head_dim_v (v's
// and out's last dimension, also dout's and dv's in the backward) may differ from head_dim (q's and k's), as in
// DeepSeek's multi-head latent attention (192, 128); the default softmax_scale is 1/sqrt(head_dim). The CPU runs
// every such pair; the Hopper kernels take every head_dim == head_dim_v (kernels of width 64, 96, 128, 192 and
// 256, the others zero-padded on the next wider one) and the splits (head_dim, head_dim_v) = (192, 128) and
// (128, 64), and can_implement gives the reason for anything else.
// Causal masking is aligned bottom-right: query i sees key j iff j <= i + seqlen_k - seqlen_q. A window
// (left, right), -1 = unbounded, allows i + sk - sq - left <= j <= i + sk - sq + right. Softcap c > 0 replaces
// the score s = q.k * softmax_scale by c * tanh(s / c). A sequence has at most 2^40 - 1 queries and as many
// keys (the masks' offsets). Outputs must not be broadcast views (a zero stride in a dimension longer than 1).
// C callers: flash4/c_api.h.
//
// Variable-length (packed) batches, set cu_seqlens_q and cu_seqlens_k (both or neither):
//   q (total_q, heads, head_dim)   k (total_k, heads_kv, head_dim)   lse (heads, total_q) fp32
//   out (total_q, heads, head_dim_v)   v (total_k, heads_kv, head_dim_v)
//   cu_seqlens_q/k int32 (batch + 1), contiguous, on the tensors' device: segment b's queries are rows
//   cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (the same for keys); max_seqlen_q/k bound the segment lengths
//   (>= 1 when the packed tensor has rows; 0 is allowed only for an empty one). Masks are per segment (causal
//   bottom-right in each). seqused_q / seqused_k (int32 (batch), optional, dense or packed): only the first n
//   queries / keys of entry b take part. Rows that take part in no segment get out = 0 and lse = -inf in the
//   forward and zero gradients in the backward.
//   Host-resident offsets (CPU tensors) are checked exactly: cu[0] == 0, non-decreasing, cu[batch] <= total,
//   every segment <= max_seqlen, seqused in [0, its segment]. CUDA-resident ones are not read on the host by
//   validation (that would need a synchronisation): offsets are clamped to [0, total] and lengths to the maxima
//   and to the tensor's end, so bad values give wrong results but never an out-of-bounds access. The GPU forward
//   and backward read them on the device (no synchronisation, CUDA-graph capturable); only a backward whose
//   tensors TMA cannot describe runs one dense backward per sequence and so copies them to the host (a stream
//   synchronisation; refused inside CUDA graph capture).
//   The GPU kernels read whole 64..128-row tiles, so rows of a tile past a sequence's used rows (past seqused_q /
//   seqused_k, or after cu_seqlens[batch]) are read: the forward zeroes those V rows and hides their scores, and
//   the backward zeroes those K and V rows, so any values in the unused rows of k and v are harmless to both, and
//   those of q to the forward; the backward masks the unused queries' P to 0 but forms dK, dV with their q and
//   dout rows, so those must hold finite values (a NaN or inf there would turn a product with 0 into NaN); the
//   rows of the next sequence always do. (Python's opt-in host check,
//   flash4.check_varlen_offsets / FLASH4_CHECK_OFFSETS=1, copies the offsets to the host and applies the CPU
//   checks.)
// Learnable sink (gpt-oss): learnable_sink fp32 (heads) adds one logit sink[h] (natural-log domain: neither
// scaled nor softcapped) that carries no value to every row's softmax denominator, dense or packed. LSE
// includes it, so a row that sees no key has lse = sink[h] and out = 0. The backward's dsink (heads, fp32,
// optional) receives d loss / d sink[h] = -sum over rows i of head h of exp(sink[h] - lse_i) * rowsum(dO_i * O_i),
// overwritten, not accumulated.
// FP8 forward: q, k, v all DType::kFloat8E4M3 ("float8_e4m3fn"), out bf16 or fp16 (its dtype picks the output
// type), lse fp32. q_descale / k_descale / v_descale (fp32 (batch, heads_kv), optional, 1 when not given; packed:
// batch = the number of segments) give the real inputs: q[b, i, h, :] * q_descale[b, h / (heads / heads_kv)],
// k[b, j, hk, :] * k_descale[b, hk], v likewise. The backward takes no FP8. CPU: dequantize, then the same
// algorithm in fp32. GPU: head dims 128 and 256, dense batches, bf16 out (can_implement gives the reason
// otherwise).
#pragma once

#include <string>

#include "flash4/error.h"
#include "flash4/types.h"

namespace flash4 {

// How exp2 is evaluated in the softmax (forward). kAuto lets each backend pick what is fastest on it.
enum class Exp2Mode : int {
  kAuto = 0,
  kExact = 1,       // hardware exp2 (GPU), an exp2 within 1.3 ulp (CPU), everywhere
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
  float softmax_scale = 0.0f;   // 0 means 1/sqrt(head_dim) (q's and k's head_dim)
  bool causal = false;
  int window_left = -1;         // -1 = unbounded
  int window_right = -1;
  float softcap = 0.0f;         // 0 = off
  Tuning tuning{};
  // Variable-length batches and the learnable sink (see the header comment); all optional.
  TensorView cu_seqlens_q, cu_seqlens_k;  // int32 (batch + 1), rank 1; both set = packed layout
  TensorView seqused_q, seqused_k;        // int32 (batch), rank 1
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;  // packed: upper bounds of the segment lengths
  TensorView learnable_sink;              // fp32 (heads), rank 1
  // FP8 descale factors (see the header comment); only with float8_e4m3fn q, k, v.
  TensorView q_descale, k_descale, v_descale;  // fp32 (batch, heads_kv), rank 2
};

struct BackwardArgs {
  TensorView dout, q, k, v, out, lse;  // lse as produced by forward (required)
  TensorView dq, dk, dv;               // outputs, same shapes and dtypes as q, k, v (dout like out)
  float softmax_scale = 0.0f;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool deterministic = false;          // bit-identical gradients run to run
  // As in ForwardArgs (the same values as the forward call); dsink (fp32 (heads)) is written when given, and
  // may only be given with learnable_sink.
  TensorView cu_seqlens_q, cu_seqlens_k;
  TensorView seqused_q, seqused_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  TensorView learnable_sink;
  TensorView dsink;
};

// Result of can_implement: ok, or the reason this device cannot run the configuration.
struct Support {
  bool ok = true;
  std::string reason;
  explicit operator bool() const { return ok; }
};

// What can_implement validates. kWithoutBuffers checks shapes, strides, dtypes, devices and values but not the
// data pointers (null is fine), aliasing, nor the contents of host cu_seqlens / seqused, so that a
// configuration can be checked before its memory is allocated (sizes that overflow are still refused); forward
// and backward always check everything.
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
