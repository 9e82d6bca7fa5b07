// Argument validation: every bad input is rejected here, before any backend touches memory, with a message
// that names the argument and what was expected. Returns the normalized Problem the backends run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "api/backends.h"
#include "api/checker.h"
#include "api/validate_fp8.h"
#include "api/validate_sequences.h"
#include "common/score_transform.h"

namespace flash4::detail {
namespace {

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kHeadDimMultiple = 8;  // 16-byte rows for vector loads and TMA

// Names of the dimensions, for messages: dense attention tensors, packed ones, and the LSE of each.
constexpr const char* kDimNames[4] = {"batch", "seqlen", "heads", "head_dim"};
constexpr const char* kPackedDimNames[3] = {"total", "heads", "head_dim"};
constexpr const char* kLseDimNames[3] = {"batch", "heads", "seqlen_q"};
constexpr const char* kPackedLseDimNames[2] = {"heads", "total_q"};


}  // namespace

std::string dim_label(const char* tensor, int i, const char* const* dims) {
  return std::string(tensor) + ".shape[" + std::to_string(i) + "] (" + dims[i] + ")";
}

bool present(const TensorView& t) {
  if (t.data != nullptr) return true;
  for (int64_t s : t.shape)
    if (s != 0) return true;
  return false;
}

// (Its extent fitting in int64 keeps later pointer arithmetic in the backends from overflowing.)
void check_tensor(const Checker& c, const TensorView& t, const char* name, int rank, const char* const* dims) {
  FLASH4_REQUIRE(
      c, t.rank == rank,
      std::string(name) + " must have rank " + std::to_string(rank) + ", got rank " + std::to_string(t.rank));
  const int dtype = static_cast<int>(t.dtype);
  FLASH4_REQUIRE(c, dtype >= 0 && dtype <= static_cast<int>(DType::kFloat8E4M3),
                 std::string(name) + ".dtype has invalid value " + std::to_string(dtype));
  const int kind = static_cast<int>(t.device.kind);
  FLASH4_REQUIRE(c, kind == 0 || kind == 1,
                 std::string(name) + ".device.kind has invalid value " + std::to_string(kind));
  FLASH4_REQUIRE(c, t.device.kind == DeviceKind::kCpu || t.device.index >= 0,
                 std::string(name) + ".device.index must be >= 0, got " + std::to_string(t.device.index));
  bool empty = false;
  for (int i = 0; i < rank; ++i) empty = empty || t.shape[i] == 0;
  int64_t numel = 1;
  int64_t last_offset = 0;  // offset in elements of the last element, strides being non-negative
  for (int i = 0; i < rank; ++i) {
    FLASH4_REQUIRE(c, t.shape[i] >= 0, dim_label(name, i, dims) + " = " + std::to_string(t.shape[i]) + " must be >= 0");
    FLASH4_REQUIRE(
        c, t.stride[i] >= 0,
        std::string(name) + ".stride[" + std::to_string(i) + "] = " + std::to_string(t.stride[i]) + " must be >= 0");
    int64_t span = 0;
    const bool overflow = __builtin_mul_overflow(empty ? 0 : t.shape[i] - 1, t.stride[i], &span) ||
                          __builtin_add_overflow(last_offset, span, &last_offset) ||
                          __builtin_mul_overflow(numel, t.shape[i], &numel);
    FLASH4_REQUIRE(c, !overflow, std::string(name) + " is too large: its size or extent overflows int64");
  }
  int64_t bytes = 0;
  FLASH4_REQUIRE(c,
                 !__builtin_add_overflow(last_offset, int64_t{1}, &bytes) &&
                     !__builtin_mul_overflow(bytes, int64_t{dtype_size(t.dtype)}, &bytes),
                 std::string(name) + " is too large: its byte extent overflows int64");
  // Only the last dimension must be contiguous; a size-1 dimension has no meaningful stride.
  FLASH4_REQUIRE(c, t.shape[rank - 1] <= 1 || t.stride[rank - 1] == 1,
                 std::string(name) + ".stride[" + std::to_string(rank - 1) + "] = " +
                     std::to_string(t.stride[rank - 1]) + " but the last dimension must be contiguous (stride 1)");
  FLASH4_REQUIRE(c, numel == 0 || t.data != nullptr || !c.buffers(),
                 std::string(name) + ".data is null but " + name + " has " + std::to_string(numel) + " elements");
  // Element loads are typed (a misaligned float load is undefined behaviour on the CPU, a fault on the GPU).
  FLASH4_REQUIRE(c, !c.buffers() || reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0,
                 std::string(name) + ".data is not aligned to its element size (" + std::to_string(dtype_size(t.dtype)) +
                     " bytes for " + dtype_name(t.dtype) + ")");
}

std::string number_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

void check_score_factors(const Checker& c, float softmax_scale, float softcap) {
  const ScoreTransform t = ScoreTransform::make(softmax_scale, softcap);
  const char* multiplied = t.has_softcap() ? "softcap" : "softmax_scale";
  FLASH4_REQUIRE(c, std::isfinite(t.log2_scale),
                 std::string(multiplied) + " = " + number_text(t.has_softcap() ? softcap : softmax_scale) +
                     " is too large: " + multiplied + " * log2(e) overflows float32 (at most " +
                     number_text(std::numeric_limits<float>::max() / kLog2e) + ")");
  FLASH4_REQUIRE(c, std::isfinite(t.tanh_scale),
                 "softmax_scale / softcap overflows float32 (softmax_scale = " + number_text(softmax_scale) +
                     ", softcap = " + number_text(softcap) + "); softcap must be at least softmax_scale / " +
                     number_text(std::numeric_limits<float>::max()));
}

void check_score_options(const Checker& c, const ScoreOptions& o, Problem& p) {
  FLASH4_REQUIRE(c, std::isfinite(o.softmax_scale),
                 "softmax_scale = " + number_text(o.softmax_scale) + " must be finite (0 = 1/sqrt(head_dim))");
  FLASH4_REQUIRE(c, o.softmax_scale >= 0.0f,
                 "softmax_scale = " + number_text(o.softmax_scale) + " must be >= 0 (0 = 1/sqrt(head_dim))");
  FLASH4_REQUIRE(c, std::isfinite(o.softcap) && o.softcap >= 0.0f,
                 "softcap = " + number_text(o.softcap) + " must be finite and >= 0 (0 = off)");
  FLASH4_REQUIRE(c, o.window_left >= -1,
                 "window_left = " + std::to_string(o.window_left) + " must be >= -1 (-1 = unbounded)");
  FLASH4_REQUIRE(c, o.window_right >= -1,
                 "window_right = " + std::to_string(o.window_right) + " must be >= -1 (-1 = unbounded)");

  p.softmax_scale = o.softmax_scale != 0.0f ? o.softmax_scale
                                            : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  p.softcap = o.softcap;
  check_score_factors(c, p.softmax_scale, p.softcap);
  p.causal = o.causal;
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  if (o.causal) p.window_right = o.window_right == -1 ? 0 : std::min<int64_t>(o.window_right, 0);
}

void check_same_device(const Checker& c, const TensorView& t, const char* name, const TensorView& like,
                       const char* like_name) {
  FLASH4_REQUIRE(c, t.device == like.device,
                 std::string(name) + " is on " + device_name(t.device) + " but " + like_name + " is on " +
                     device_name(like.device) + "; all tensors must be on one device");
}

namespace {

// Dimension names of an attention tensor (q, k, v, out and their gradients) in the call's layout.
const char* const* attention_dims(bool packed) { return packed ? kPackedDimNames : kDimNames; }

// The first `count` dimensions (all when -1) of t equal like's.
void check_same_shape(const Checker& c, const TensorView& t, const char* name, const TensorView& like,
                      const char* like_name, const char* const* dims, int count = -1) {
  for (int i = 0; i < (count < 0 ? like.rank : count); ++i) {
    FLASH4_REQUIRE(c, t.shape[i] == like.shape[i],
                   dim_label(name, i, dims) + " = " + std::to_string(t.shape[i]) + " but " + like_name +
                       ".shape[" + std::to_string(i) + "] = " + std::to_string(like.shape[i]) + "; " + name +
                       " must have the shape of " + like_name);
  }
}

// t has like's shape except its last dimension (head_dim), which is last_like's: out and dout take v's head_dim
// and q's other sizes, so that v and out may have a head_dim of their own.
void check_shape_with_head_dim_of(const Checker& c, const TensorView& t, const char* name, const TensorView& like,
                                  const char* like_name, const TensorView& last_like, const char* last_like_name,
                                  const char* const* dims) {
  const int hd = like.rank - 1;
  check_same_shape(c, t, name, like, like_name, dims, hd);
  FLASH4_REQUIRE(c, t.shape[hd] == last_like.shape[hd],
                 dim_label(name, hd, dims) + " = " + std::to_string(t.shape[hd]) + " but " + last_like_name +
                     ".shape[" + std::to_string(hd) + "] = " + std::to_string(last_like.shape[hd]) + "; " + name +
                     "'s head_dim must be " + last_like_name + "'s");
}

void check_same_dtype(const Checker& c, const TensorView& t, const char* name, const TensorView& like,
                      const char* like_name) {
  FLASH4_REQUIRE(c, t.dtype == like.dtype,
                 std::string(name) + ".dtype is " + dtype_name(t.dtype) + " but " + like_name + ".dtype is " +
                     dtype_name(like.dtype) + "; they must match");
}

// Dense: (batch, heads, seqlen_q). Packed: (heads, total_q).
void check_lse(const Checker& c, const TensorView& lse, const char* name, const Problem& p) {
  const bool packed = p.varlen();
  const int rank = packed ? 2 : 3;
  const char* const* dims = packed ? kPackedLseDimNames : kLseDimNames;
  check_tensor(c, lse, name, rank, dims);
  FLASH4_REQUIRE(c, lse.dtype == DType::kFloat32,
                 std::string(name) + ".dtype is " + dtype_name(lse.dtype) + " but must be fp32");
  const int64_t dense[3] = {p.batch, p.heads, p.seqlen_q}, varlen[2] = {p.heads, p.total_q};
  const int64_t* expected = packed ? varlen : dense;
  for (int i = 0; i < rank; ++i) {
    FLASH4_REQUIRE(c, lse.shape[i] == expected[i],
                   dim_label(name, i, dims) + " = " + std::to_string(lse.shape[i]) + " but expected " +
                       std::to_string(expected[i]) + "; lse must be " +
                       (packed ? "(heads, total_q) for a packed batch" : "(batch, heads, seqlen_q)"));
  }
}

// q, k, v: shapes, dtypes and head counts shared by forward and backward. Dense tensors are rank 4 (batch,
// seqlen, heads, head_dim), packed ones rank 3 (total, heads, head_dim). Fills the sizes of `p` (for a packed
// batch, everything but batch and the maxima, which come from the offsets).
void check_qkv(const Checker& c, const TensorView& q, const TensorView& k, const TensorView& v, bool packed,
               Problem& p) {
  const int rank = packed ? 3 : 4, s = rank - 3, hh = rank - 2, hd = rank - 1;  // seqlen, heads, head_dim
  const char* const* dims = attention_dims(packed);
  check_tensor(c, q, "q", rank, dims);
  check_tensor(c, k, "k", rank, dims);
  check_tensor(c, v, "v", rank, dims);
  FLASH4_REQUIRE(c, q.dtype != DType::kInt32,
                 "q.dtype is int32 but must be fp32, fp16 or bf16 (or float8_e4m3fn in the forward)");
  check_same_dtype(c, k, "k", q, "q");
  check_same_dtype(c, v, "v", q, "q");
  check_same_device(c, k, "k", q, "q");
  check_same_device(c, v, "v", q, "q");
  if (!packed) {
    FLASH4_REQUIRE(c, k.shape[0] == q.shape[0],
                   "k.shape[0] (batch) = " + std::to_string(k.shape[0]) +
                       " but q.shape[0] = " + std::to_string(q.shape[0]) + "; q, k, v must share batch");
  }
  FLASH4_REQUIRE(c, k.shape[hd] == q.shape[hd],
                 "k.shape[" + std::to_string(hd) + "] (head_dim) = " + std::to_string(k.shape[hd]) + " but q.shape[" +
                     std::to_string(hd) + "] = " + std::to_string(q.shape[hd]) + "; q and k must share head_dim");
  check_same_shape(c, v, "v", k, "k", dims, hd);  // v's head_dim may differ from k's (checked below)

  p.heads = q.shape[hh];
  p.head_dim = q.shape[hd];
  p.head_dim_v = v.shape[hd];
  p.heads_kv = k.shape[hh];
  if (packed) {
    p.total_q = q.shape[0];
    p.total_k = k.shape[0];
  } else {
    p.batch = q.shape[0];
    p.seqlen_q = q.shape[s];
    p.seqlen_k = k.shape[s];
    p.total_q = p.batch * p.seqlen_q;  // no overflow: q's extent was checked
    p.total_k = p.batch * p.seqlen_k;
    for (const auto& [n, what] : {std::pair{p.seqlen_q, "q"}, std::pair{p.seqlen_k, "k"}}) {
      FLASH4_REQUIRE(c, n <= kMaxSequenceLength,
                     std::string(what) + ".shape[" + std::to_string(s) + "] (seqlen_" + what + ") = " +
                         std::to_string(n) + " exceeds the 2^40 - 1 tokens a sequence may have");
    }
  }
  const std::string heads_kv = "k.shape[" + std::to_string(hh) + "] (heads_kv)";
  FLASH4_REQUIRE(c, p.heads_kv >= 1, heads_kv + " = " + std::to_string(p.heads_kv) + " must be >= 1");
  FLASH4_REQUIRE(c, p.heads % p.heads_kv == 0,
                 "q.shape[" + std::to_string(hh) + "] (heads) = " + std::to_string(p.heads) + " is not a multiple of " +
                     heads_kv + " = " + std::to_string(p.heads_kv) + "; GQA/MQA needs heads % heads_kv == 0");
  FLASH4_REQUIRE(c, p.head_dim % kHeadDimMultiple == 0 && p.head_dim >= kHeadDimMultiple && p.head_dim <= kMaxHeadDim,
                 "q.shape[" + std::to_string(hd) + "] (head_dim) = " + std::to_string(p.head_dim) +
                     " but head_dim must be a multiple of 8 in [8, 256]");
  FLASH4_REQUIRE(c,
                 p.head_dim_v % kHeadDimMultiple == 0 && p.head_dim_v >= kHeadDimMultiple &&
                     p.head_dim_v <= kMaxHeadDim,
                 "v.shape[" + std::to_string(hd) + "] (head_dim) = " + std::to_string(p.head_dim_v) +
                     " but v's head_dim must be a multiple of 8 in [8, 256]");
}

// An enum from the C API or a cast: only the two named scopes mean something.
void check_scope(const Checker& c, Validation scope) {
  const int value = static_cast<int>(scope);
  FLASH4_REQUIRE(c, value == 0 || value == 1,
                 "scope = " + std::to_string(value) + " must be 0 (Validation::kFull) or 1 (kWithoutBuffers)");
}

// Layout, sizes and scalars common to forward and backward.
template <typename Args>
Problem check_problem(const Checker& c, const Args& args) {
  Problem p;
  const bool packed = packed_layout_requested(c, args.cu_seqlens_q, args.cu_seqlens_k);
  check_qkv(c, args.q, args.k, args.v, packed, p);
  check_sequence_args(c, SequenceArgs::of(args), p);
  // Scalars and the mask; resolves the scale default and folds `causal` into the window.
  check_score_options(c, {args.softmax_scale, args.softcap, args.causal, args.window_left, args.window_right}, p);
  return p;
}

}  // namespace

Problem validate(const ForwardArgs& args, Validation scope) {
  const Checker c("flash4::forward", scope == Validation::kFull);
  check_scope(c, scope);
  Problem p = check_problem(c, args);
  const char* const* dims = attention_dims(p.varlen());
  check_tensor(c, args.out, "out", args.q.rank, dims);
  check_fp8_forward(c, args, p);  // out's dtype (q's, or bf16 / fp16 for FP8 q) and the descales
  // An enum from the C API or a cast: only the named modes mean something to the backends.
  const int exp2 = static_cast<int>(args.tuning.exp2);
  FLASH4_REQUIRE(c, exp2 >= 0 && exp2 <= static_cast<int>(Exp2Mode::kPolynomial),
                 "tuning.exp2 = " + std::to_string(exp2) + " must be 0 (auto), 1 (exact) or 2 (polynomial)");
  check_same_device(c, args.out, "out", args.q, "q");
  check_shape_with_head_dim_of(c, args.out, "out", args.q, "q", args.v, "v", dims);
  check_distinct_elements(c, args.out, "out");
  const bool has_lse = present(args.lse);
  if (has_lse) {
    check_lse(c, args.lse, "lse", p);
    check_same_device(c, args.lse, "lse", args.q, "q");
    check_distinct_elements(c, args.lse, "lse");
  }

  const std::pair<const TensorView*, const char*> inputs[] = {
      {&args.q, "q"}, {&args.k, "k"}, {&args.v, "v"}, {&args.cu_seqlens_q, "cu_seqlens_q"},
      {&args.cu_seqlens_k, "cu_seqlens_k"}, {&args.seqused_q, "seqused_q"}, {&args.seqused_k, "seqused_k"},
      {&args.learnable_sink, "learnable_sink"}, {&args.q_descale, "q_descale"}, {&args.k_descale, "k_descale"},
      {&args.v_descale, "v_descale"}};
  for (const auto& [in, name] : inputs) {
    check_no_overlap(c, args.out, "out", *in, name);
    if (has_lse) check_no_overlap(c, args.lse, "lse", *in, name);
  }
  if (has_lse) check_no_overlap(c, args.lse, "lse", args.out, "out");
  return p;
}

Problem validate(const BackwardArgs& args, Validation scope) {
  const Checker c("flash4::backward", scope == Validation::kFull);
  check_scope(c, scope);
  FLASH4_REQUIRE(c, args.q.dtype != DType::kFloat8E4M3,
                 "q.dtype is float8_e4m3fn but the backward takes fp32, fp16 or bf16 (FP8 is forward only)");
  Problem p = check_problem(c, args);
  const char* const* dims = attention_dims(p.varlen());
  // out and dout have q's sizes with v's head_dim; dq, dk, dv the shapes of q, k, v.
  const std::pair<const TensorView*, const char*> like_out[] = {{&args.dout, "dout"}, {&args.out, "out"}};
  const std::tuple<const TensorView*, const char*, const TensorView*, const char*> grads[] = {
      {&args.dq, "dq", &args.q, "q"}, {&args.dk, "dk", &args.k, "k"}, {&args.dv, "dv", &args.v, "v"}};
  for (const auto& [t, name] : like_out) {
    check_tensor(c, *t, name, args.q.rank, dims);
    check_same_dtype(c, *t, name, args.q, "q");
    check_same_device(c, *t, name, args.q, "q");
    check_shape_with_head_dim_of(c, *t, name, args.q, "q", args.v, "v", dims);
  }
  for (const auto& [t, name, like, like_name] : grads) {
    check_tensor(c, *t, name, like->rank, dims);
    check_same_dtype(c, *t, name, *like, like_name);
    check_same_device(c, *t, name, *like, like_name);
    check_same_shape(c, *t, name, *like, like_name, dims);
    check_distinct_elements(c, *t, name);
  }
  check_lse(c, args.lse, "lse", p);
  check_same_device(c, args.lse, "lse", args.q, "q");
  const bool has_dsink = check_dsink(c, args.dsink, args.learnable_sink, args.q, p);
  if (has_dsink) check_distinct_elements(c, args.dsink, "dsink");

  const std::pair<const TensorView*, const char*> outputs[] = {
      {&args.dq, "dq"}, {&args.dk, "dk"}, {&args.dv, "dv"}, {&args.dsink, "dsink"}};
  const std::pair<const TensorView*, const char*> inputs[] = {
      {&args.dout, "dout"}, {&args.q, "q"}, {&args.k, "k"}, {&args.v, "v"}, {&args.out, "out"}, {&args.lse, "lse"},
      {&args.cu_seqlens_q, "cu_seqlens_q"}, {&args.cu_seqlens_k, "cu_seqlens_k"}, {&args.seqused_q, "seqused_q"},
      {&args.seqused_k, "seqused_k"}, {&args.learnable_sink, "learnable_sink"}};
  const int n_outputs = has_dsink ? 4 : 3;
  for (int i = 0; i < n_outputs; ++i) {
    for (const auto& [in, in_name] : inputs) check_no_overlap(c, *outputs[i].first, outputs[i].second, *in, in_name);
    for (int j = i + 1; j < n_outputs; ++j)
      check_no_overlap(c, *outputs[i].first, outputs[i].second, *outputs[j].first, outputs[j].second);
  }
  return p;
}

}  // namespace flash4::detail
