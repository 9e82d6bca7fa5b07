// The C API (flash4/c_api.h): converts the plain-C structs to the C++ ones and exceptions to status codes.
#include "flash4/c_api.h"

#include <cstdint>
#include <new>
#include <string>

#include "flash4/api.h"
#include "flash4/kvcache.h"

namespace flash4 {
namespace {

// The C enums are documented as the C++ values; these keep the two from drifting apart.
static_assert(FLASH4_STATUS_OK == static_cast<int>(Status::kOk) &&
              FLASH4_STATUS_INVALID_ARGUMENT == static_cast<int>(Status::kInvalidArgument) &&
              FLASH4_STATUS_NOT_SUPPORTED == static_cast<int>(Status::kNotSupported) &&
              FLASH4_STATUS_CUDA_ERROR == static_cast<int>(Status::kCudaError) &&
              FLASH4_STATUS_INTERNAL == static_cast<int>(Status::kInternal));
static_assert(FLASH4_FLOAT32 == static_cast<int>(DType::kFloat32) &&
              FLASH4_FLOAT16 == static_cast<int>(DType::kFloat16) &&
              FLASH4_BFLOAT16 == static_cast<int>(DType::kBFloat16) &&
              FLASH4_INT32 == static_cast<int>(DType::kInt32) &&
              FLASH4_FLOAT8_E4M3 == static_cast<int>(DType::kFloat8E4M3));
static_assert(FLASH4_DEVICE_CPU == static_cast<int>(DeviceKind::kCpu) &&
              FLASH4_DEVICE_CUDA == static_cast<int>(DeviceKind::kCuda));
static_assert(FLASH4_EXP2_AUTO == static_cast<int>(Exp2Mode::kAuto) &&
              FLASH4_EXP2_EXACT == static_cast<int>(Exp2Mode::kExact) &&
              FLASH4_EXP2_POLYNOMIAL == static_cast<int>(Exp2Mode::kPolynomial));

thread_local std::string g_last_error;

// Runs fn and turns what it throws into a status, keeping the message for flash4_last_error.
template <typename Fn>
int c_api_call(Fn fn) {
  try {
    fn();
    return FLASH4_STATUS_OK;
  } catch (const Error& e) {
    g_last_error = e.what();
    return static_cast<int>(e.status());
  } catch (const std::bad_alloc&) {
    g_last_error = "flash4: out of host memory";
  } catch (const std::exception& e) {
    g_last_error = std::string("flash4: ") + e.what();
  } catch (...) {
    g_last_error = "flash4: unknown exception";
  }
  return FLASH4_STATUS_INTERNAL;
}

void require_args(const void* args, const char* entry_point) {
  if (args == nullptr) throw Error(Status::kInvalidArgument, std::string(entry_point) + ": args is null");
}

// Enum values are carried over unchecked: validation rejects values outside the enums with a message.
TensorView to_view(const flash4_tensor& t) {
  TensorView v;
  v.data = t.data;
  v.dtype = static_cast<DType>(t.dtype);
  v.device = Device{static_cast<DeviceKind>(t.device_kind), t.device_index};
  v.rank = t.rank;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

flash4_tensor to_c(const TensorView& v) {
  flash4_tensor t{};
  t.data = v.data;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.device_kind = static_cast<int32_t>(v.device.kind);
  t.device_index = v.device.index;
  t.rank = v.rank;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = v.shape[i];
    t.stride[i] = v.stride[i];
  }
  return t;
}

// The packed-batch and sink fields, spelled alike in both argument structs of both APIs.
template <typename C, typename Cpp>
void sequences_to_cpp(const C& a, Cpp& b) {
  b.cu_seqlens_q = to_view(a.cu_seqlens_q);
  b.cu_seqlens_k = to_view(a.cu_seqlens_k);
  b.seqused_q = to_view(a.seqused_q);
  b.seqused_k = to_view(a.seqused_k);
  b.max_seqlen_q = a.max_seqlen_q;
  b.max_seqlen_k = a.max_seqlen_k;
  b.learnable_sink = to_view(a.learnable_sink);
}

ForwardArgs to_cpp(const flash4_forward_args& a) {
  ForwardArgs f;
  f.q = to_view(a.q);
  f.k = to_view(a.k);
  f.v = to_view(a.v);
  f.out = to_view(a.out);
  f.lse = to_view(a.lse);
  f.softmax_scale = a.softmax_scale;
  f.causal = a.causal != 0;
  f.window_left = a.window_left;
  f.window_right = a.window_right;
  f.softcap = a.softcap;
  f.tuning.exp2 = static_cast<Exp2Mode>(a.exp2_mode);
  f.tuning.conditional_rescale = a.conditional_rescale != 0;
  sequences_to_cpp(a, f);
  f.q_descale = to_view(a.q_descale);
  f.k_descale = to_view(a.k_descale);
  f.v_descale = to_view(a.v_descale);
  return f;
}

BackwardArgs to_cpp(const flash4_backward_args& a) {
  BackwardArgs b;
  b.dout = to_view(a.dout);
  b.q = to_view(a.q);
  b.k = to_view(a.k);
  b.v = to_view(a.v);
  b.out = to_view(a.out);
  b.lse = to_view(a.lse);
  b.dq = to_view(a.dq);
  b.dk = to_view(a.dk);
  b.dv = to_view(a.dv);
  b.softmax_scale = a.softmax_scale;
  b.causal = a.causal != 0;
  b.window_left = a.window_left;
  b.window_right = a.window_right;
  b.softcap = a.softcap;
  b.deterministic = a.deterministic != 0;
  sequences_to_cpp(a, b);
  b.dsink = to_view(a.dsink);
  return b;
}

KvCacheArgs to_cpp(const flash4_kvcache_args& a) {
  KvCacheArgs c;
  c.q = to_view(a.q);
  c.k_cache = to_view(a.k_cache);
  c.v_cache = to_view(a.v_cache);
  c.k = to_view(a.k);
  c.v = to_view(a.v);
  c.rotary_cos = to_view(a.rotary_cos);
  c.rotary_sin = to_view(a.rotary_sin);
  c.cache_seqlens = to_view(a.cache_seqlens);
  c.cache_seqlen = a.cache_seqlen;
  c.cache_batch_idx = to_view(a.cache_batch_idx);
  c.cache_leftpad = to_view(a.cache_leftpad);
  c.block_table = to_view(a.block_table);
  c.out = to_view(a.out);
  c.lse = to_view(a.lse);
  c.learnable_sink = to_view(a.learnable_sink);
  c.cu_seqlens_q = to_view(a.cu_seqlens_q);
  c.max_seqlen_q = a.max_seqlen_q;
  c.softmax_scale = a.softmax_scale;
  c.causal = a.causal != 0;
  c.window_left = a.window_left;
  c.window_right = a.window_right;
  c.softcap = a.softcap;
  c.rotary_interleaved = a.rotary_interleaved != 0;
  c.num_splits = a.num_splits;
  return c;
}

// A not-supported verdict becomes a status, like the errors.
void require_support(const Support& s, const char* entry_point) {
  if (!s.ok) throw Error(Status::kNotSupported, std::string(entry_point) + ": " + s.reason);
}

}  // namespace
}  // namespace flash4

extern "C" {

void flash4_forward_args_init(flash4_forward_args* args) {
  if (args == nullptr) return;
  const flash4::ForwardArgs d;
  const flash4_tensor empty = flash4::to_c(flash4::TensorView{});
  *args = flash4_forward_args{};
  for (flash4_tensor* t : {&args->q, &args->k, &args->v, &args->out}) *t = empty;
  args->lse = empty;
  args->lse.rank = 3;
  args->softmax_scale = d.softmax_scale;
  args->causal = d.causal;
  args->window_left = d.window_left;
  args->window_right = d.window_right;
  args->softcap = d.softcap;
  for (flash4_tensor* t : {&args->cu_seqlens_q, &args->cu_seqlens_k, &args->seqused_q, &args->seqused_k,
                           &args->learnable_sink, &args->q_descale, &args->k_descale, &args->v_descale})
    *t = empty;
  args->exp2_mode = static_cast<int32_t>(d.tuning.exp2);
  args->conditional_rescale = d.tuning.conditional_rescale;
}

void flash4_backward_args_init(flash4_backward_args* args) {
  if (args == nullptr) return;
  const flash4::BackwardArgs d;
  const flash4_tensor empty = flash4::to_c(flash4::TensorView{});
  *args = flash4_backward_args{};
  for (flash4_tensor* t : {&args->dout, &args->q, &args->k, &args->v, &args->out, &args->dq, &args->dk, &args->dv})
    *t = empty;
  args->lse = empty;
  args->lse.rank = 3;
  args->softmax_scale = d.softmax_scale;
  args->causal = d.causal;
  args->window_left = d.window_left;
  args->window_right = d.window_right;
  args->softcap = d.softcap;
  args->deterministic = d.deterministic;
  for (flash4_tensor* t : {&args->cu_seqlens_q, &args->cu_seqlens_k, &args->seqused_q, &args->seqused_k,
                           &args->learnable_sink, &args->dsink})
    *t = empty;
}

void flash4_kvcache_args_init(flash4_kvcache_args* args) {
  if (args == nullptr) return;
  const flash4::KvCacheArgs d;
  const flash4_tensor empty = flash4::to_c(flash4::TensorView{});
  *args = flash4_kvcache_args{};
  for (flash4_tensor* t : {&args->q, &args->k_cache, &args->v_cache, &args->k, &args->v, &args->out})
    *t = empty;
  for (flash4_tensor* t : {&args->rotary_cos, &args->rotary_sin, &args->cache_seqlens, &args->cache_batch_idx,
                           &args->cache_leftpad, &args->block_table, &args->learnable_sink, &args->cu_seqlens_q})
    *t = empty;
  args->lse = empty;
  args->lse.rank = 3;
  args->cache_seqlen = d.cache_seqlen;
  args->max_seqlen_q = d.max_seqlen_q;
  args->softmax_scale = d.softmax_scale;
  args->causal = d.causal;
  args->window_left = d.window_left;
  args->window_right = d.window_right;
  args->softcap = d.softcap;
  args->rotary_interleaved = d.rotary_interleaved;
  args->num_splits = d.num_splits;
}

flash4_tensor flash4_tensor_contiguous(void* data, int32_t dtype, int32_t device_kind, int32_t device_index,
                                       int32_t rank, const int64_t* shape) {
  flash4_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device_kind = device_kind;
  t.device_index = device_index;
  t.rank = rank;
  if (shape == nullptr || rank < 1 || rank > 4) return t;  // validation reports the bad rank or shape
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride;
    // Saturates instead of overflowing (undefined behaviour): validation then refuses the tensor as too large.
    if (__builtin_mul_overflow(stride, shape[i], &stride)) stride = INT64_MAX;
  }
  return t;
}

int flash4_can_implement_forward(const flash4_forward_args* args) {
  return flash4::c_api_call([&] {
    flash4::require_args(args, "flash4_can_implement_forward");
    flash4::require_support(flash4::can_implement(flash4::to_cpp(*args)), "flash4_can_implement_forward");
  });
}

int flash4_can_implement_backward(const flash4_backward_args* args) {
  return flash4::c_api_call([&] {
    flash4::require_args(args, "flash4_can_implement_backward");
    flash4::require_support(flash4::can_implement(flash4::to_cpp(*args)), "flash4_can_implement_backward");
  });
}

int flash4_can_implement_kvcache(const flash4_kvcache_args* args) {
  return flash4::c_api_call([&] {
    flash4::require_args(args, "flash4_can_implement_kvcache");
    flash4::require_support(flash4::can_implement(flash4::to_cpp(*args)), "flash4_can_implement_kvcache");
  });
}

int flash4_forward(const flash4_forward_args* args, void* stream) {
  return flash4::c_api_call([&] {
    flash4::require_args(args, "flash4_forward");
    flash4::forward(flash4::to_cpp(*args), stream);
  });
}

int flash4_backward(const flash4_backward_args* args, void* stream) {
  return flash4::c_api_call([&] {
    flash4::require_args(args, "flash4_backward");
    flash4::backward(flash4::to_cpp(*args), stream);
  });
}

int flash4_forward_kvcache(const flash4_kvcache_args* args, void* stream) {
  return flash4::c_api_call([&] {
    flash4::require_args(args, "flash4_forward_kvcache");
    flash4::forward_kvcache(flash4::to_cpp(*args), stream);
  });
}

int flash4_cuda_available(int32_t device_index) {
  try {
    return flash4::cuda_available(device_index) ? 1 : 0;
  } catch (...) {  // no exception may cross into C
    return 0;
  }
}

const char* flash4_last_error(void) { return flash4::g_last_error.c_str(); }

const char* flash4_status_string(int status) { return flash4::status_name(static_cast<flash4::Status>(status)); }

const char* flash4_version(void) { return flash4::version(); }

}  // extern "C"
