/* flash4 C API: plain-C structs and int status codes over the C++ API (flash4/api.h), for C programs and
 * foreign-function interfaces (ctypes, other languages). Shapes, layouts, masking and defaults are those of
 * flash4/api.h. Every entry point returns a flash4_status; on failure nothing is written to the outputs and
 * flash4_last_error() gives the message (kept per thread until the next failure on that thread). */
#ifndef FLASH4_C_API_H
#define FLASH4_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return values of the entry points (the values of flash4::Status). */
typedef enum flash4_status {
  FLASH4_STATUS_OK = 0,
  FLASH4_STATUS_INVALID_ARGUMENT = 1, /* a bad shape, dtype, stride, pointer or value */
  FLASH4_STATUS_NOT_SUPPORTED = 2,    /* valid input that the device cannot run */
  FLASH4_STATUS_CUDA_ERROR = 3,
  FLASH4_STATUS_INTERNAL = 4
} flash4_status;

/* Values of flash4_tensor.dtype (those of flash4::DType). */
typedef enum flash4_dtype {
  FLASH4_FLOAT32 = 0,
  FLASH4_FLOAT16 = 1,
  FLASH4_BFLOAT16 = 2,
  FLASH4_INT32 = 3, /* index tensors only: cu_seqlens, seqused */
  FLASH4_FLOAT8_E4M3 = 4 /* float8_e4m3fn: the forward's q, k, v (out bf16 or fp16), see flash4/api.h */
} flash4_dtype;

/* Values of flash4_tensor.device_kind (those of flash4::DeviceKind). */
typedef enum flash4_device_kind { FLASH4_DEVICE_CPU = 0, FLASH4_DEVICE_CUDA = 1 } flash4_device_kind;

/* Values of flash4_forward_args.exp2_mode (those of flash4::Exp2Mode). */
typedef enum flash4_exp2_mode {
  FLASH4_EXP2_AUTO = 0,
  FLASH4_EXP2_EXACT = 1,
  FLASH4_EXP2_POLYNOMIAL = 2
} flash4_exp2_mode;

/* A non-owning strided view, as flash4::TensorView. Fields are fixed-width so foreign callers can mirror the
 * layout; enum-valued fields hold the values above. */
typedef struct flash4_tensor {
  void* data;
  int32_t dtype;        /* flash4_dtype */
  int32_t device_kind;  /* flash4_device_kind */
  int32_t device_index; /* CUDA ordinal; ignored for the CPU */
  int32_t rank;         /* 4 attention tensors, 3 lse (packed: 3 and 2), 2 FP8 descales, 1 index / per-head */
  int64_t shape[4];
  int64_t stride[4]; /* in elements; the last dimension must be contiguous */
} flash4_tensor;

/* flash4::ForwardArgs. Boolean fields are 0 or 1. Start from flash4_forward_args_init for the defaults. */
typedef struct flash4_forward_args {
  flash4_tensor q, k, v, out; /* v and out may have a head_dim of their own (head_dim_v, see flash4/api.h) */
  flash4_tensor lse;   /* optional: data NULL and shape all 0 to skip */
  float softmax_scale; /* 0 means 1/sqrt(head_dim) */
  int32_t causal;
  int32_t window_left, window_right; /* -1 = unbounded */
  float softcap;                     /* 0 = off */
  int32_t exp2_mode;                 /* flash4_exp2_mode */
  int32_t conditional_rescale;
  /* Packed (variable-length) batches and the learnable sink, as in flash4/api.h; all optional (zeroed by init). */
  flash4_tensor cu_seqlens_q, cu_seqlens_k; /* int32 (batch + 1); both set = packed layout */
  flash4_tensor seqused_q, seqused_k;       /* int32 (batch) */
  int64_t max_seqlen_q, max_seqlen_k;
  flash4_tensor learnable_sink; /* fp32 (heads) */
  flash4_tensor q_descale, k_descale, v_descale; /* FP8 only, optional: fp32 (batch, heads_kv) */
} flash4_forward_args;

/* flash4::BackwardArgs. Start from flash4_backward_args_init for the defaults. */
typedef struct flash4_backward_args {
  flash4_tensor dout, q, k, v, out, lse; /* lse as produced by the forward (required) */
  flash4_tensor dq, dk, dv;              /* outputs, same shapes and dtypes as q, k, v (dout like out) */
  float softmax_scale;
  int32_t causal;
  int32_t window_left, window_right;
  float softcap;
  int32_t deterministic;
  flash4_tensor cu_seqlens_q, cu_seqlens_k; /* as in flash4_forward_args */
  flash4_tensor seqused_q, seqused_k;
  int64_t max_seqlen_q, max_seqlen_k;
  flash4_tensor learnable_sink;
  flash4_tensor dsink; /* optional output, fp32 (heads): the sink's gradient (needs learnable_sink) */
} flash4_backward_args;

/* flash4::KvCacheArgs (flash4/kvcache.h, which gives the shapes and semantics): new queries attend to a key /
 * value cache, after k, v (when given) are appended to it in place. Start from flash4_kvcache_args_init. */
typedef struct flash4_kvcache_args {
  flash4_tensor q;
  flash4_tensor k_cache, v_cache; /* contiguous, or a page pool with block_table; written when k, v are given */
  flash4_tensor k, v;             /* optional new keys and values */
  flash4_tensor rotary_cos, rotary_sin; /* optional, with k only */
  flash4_tensor cache_seqlens;          /* optional int32 (batch) */
  int64_t cache_seqlen;                 /* used without cache_seqlens; -1 = the whole cache */
  flash4_tensor cache_batch_idx;        /* optional int32 (batch), contiguous caches only */
  flash4_tensor cache_leftpad;          /* optional int32 (batch), contiguous caches only */
  flash4_tensor block_table;            /* optional int32 (batch, max_pages): a paged cache */
  flash4_tensor out;
  flash4_tensor lse;            /* optional */
  flash4_tensor learnable_sink; /* optional fp32 (heads) */
  flash4_tensor cu_seqlens_q;   /* optional int32 (batch + 1): packed queries */
  int64_t max_seqlen_q;         /* with cu_seqlens_q */
  float softmax_scale;          /* 0 means 1/sqrt(head_dim) */
  int32_t causal;
  int32_t window_left, window_right; /* -1 = unbounded */
  float softcap;                     /* 0 = off */
  int32_t rotary_interleaved;
  int32_t num_splits; /* 0 = automatic, else 1 .. 128 */
} flash4_kvcache_args;

/* The defaults of the C++ structs: empty tensors, scale 0 (default), no mask, no softcap, exp2 auto,
 * conditional rescale on, non-deterministic backward; for the KV cache the whole cache (cache_seqlen -1),
 * interleaved rotary pairs and an automatic split count. */
void flash4_forward_args_init(flash4_forward_args* args);
void flash4_backward_args_init(flash4_backward_args* args);
void flash4_kvcache_args_init(flash4_kvcache_args* args);

/* A contiguous (row-major) view of rank 1 to 4 with the given shape (shape[rank] values are read). */
flash4_tensor flash4_tensor_contiguous(void* data, int32_t dtype, int32_t device_kind, int32_t device_index,
                                       int32_t rank, const int64_t* shape);

/* flash4::can_implement: OK, NOT_SUPPORTED (the reason in flash4_last_error) or INVALID_ARGUMENT. */
int flash4_can_implement_forward(const flash4_forward_args* args);
int flash4_can_implement_backward(const flash4_backward_args* args);

int flash4_can_implement_kvcache(const flash4_kvcache_args* args);

/* flash4::forward / backward / forward_kvcache; stream is a cudaStream_t (NULL = default stream), ignored on the
 * CPU. */
int flash4_forward(const flash4_forward_args* args, void* stream);
int flash4_backward(const flash4_backward_args* args, void* stream);
int flash4_forward_kvcache(const flash4_kvcache_args* args, void* stream);

/* 1 when a CUDA device usable by flash4 (sm_90) is present and the library was built with CUDA, else 0. */
int flash4_cuda_available(int32_t device_index);

/* The message of the last failed call on this thread ("" when none); valid until the next failure on it. */
const char* flash4_last_error(void);

/* "ok", "invalid argument", ... for a flash4_status value. */
const char* flash4_status_string(int status);

/* Version string, e.g. "0.1.0". */
const char* flash4_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASH4_C_API_H */
