/* The C API compiled as C: a tiny causal forward on the CPU with a known answer, and a bad input that returns
 * FLASH4_STATUS_INVALID_ARGUMENT with a message naming the argument. Exit code 0 on success. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flash4/c_api.h"

enum { kSeq = 8, kHeads = 2, kHeadsKv = 1, kDim = 16 };

static int failures = 0;

static void expect(int condition, const char* what) {
  if (!condition) {
    fprintf(stderr, "test_c_api: FAILED: %s (last error: %s)\n", what, flash4_last_error());
    ++failures;
  }
}

/* A decode step through the KV-cache entry point: one query token per head attends to a cache of 5 keys after
 * one new key is appended at position 5. All scores are equal, so out is the mean of the 6 values and lse =
 * score + log 6. The same cache paged (pages of 4 rows, in the pool's reverse order) gives the same answer; an
 * append past the cache's end is refused by name with the cache untouched. */
static void kvcache_decode(void) {
  enum { kCacheRows = 8, kKeys = 5, kPage = 4 };
  static float q[kHeads * kDim], k_new[kHeadsKv * kDim], v_new[kHeadsKv * kDim], out[kHeads * kDim];
  static float lse[kHeads], k_cache[kCacheRows * kHeadsKv * kDim], v_cache[kCacheRows * kHeadsKv * kDim];
  static float k_pool[3 * kPage * kHeadsKv * kDim], v_pool[3 * kPage * kHeadsKv * kDim];
  static int seqlens[1] = {kKeys}, table[2] = {2, 1};
  const int64_t q_shape[4] = {1, 1, kHeads, kDim}, new_shape[4] = {1, 1, kHeadsKv, kDim};
  const int64_t cache_shape[4] = {1, kCacheRows, kHeadsKv, kDim}, pool_shape[4] = {3, kPage, kHeadsKv, kDim};
  const int64_t lse_shape[3] = {1, kHeads, 1}, one[1] = {1}, table_shape[2] = {1, 2};
  const double score = 0.25 * kDim / sqrt((double)kDim), want_out = (kKeys * 0.25 + 1.0) / (kKeys + 1);
  flash4_kvcache_args args;
  int i, h, status;
  for (i = 0; i < kHeads * kDim; ++i) q[i] = 0.5f;
  for (i = 0; i < kHeadsKv * kDim; ++i) k_new[i] = 0.5f, v_new[i] = 1.0f;
  for (i = 0; i < kCacheRows * kHeadsKv * kDim; ++i) /* rows past the keys hold a sentinel */
    k_cache[i] = i < kKeys * kHeadsKv * kDim ? 0.5f : -7.0f, v_cache[i] = i < kKeys * kHeadsKv * kDim ? 0.25f : -7.0f;

  flash4_kvcache_args_init(&args);
  expect(args.cache_seqlen == -1 && args.num_splits == 0 && args.rotary_interleaved == 1, "KV-cache defaults");
  args.q = flash4_tensor_contiguous(q, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, q_shape);
  args.k_cache = flash4_tensor_contiguous(k_cache, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, cache_shape);
  args.v_cache = flash4_tensor_contiguous(v_cache, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, cache_shape);
  args.k = flash4_tensor_contiguous(k_new, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, new_shape);
  args.v = flash4_tensor_contiguous(v_new, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, new_shape);
  args.cache_seqlens = flash4_tensor_contiguous(seqlens, FLASH4_INT32, FLASH4_DEVICE_CPU, 0, 1, one);
  args.out = flash4_tensor_contiguous(out, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, q_shape);
  args.lse = flash4_tensor_contiguous(lse, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, lse_shape);
  args.causal = 1;
  expect(flash4_can_implement_kvcache(&args) == FLASH4_STATUS_OK, "can_implement on a valid KV-cache call");
  status = flash4_forward_kvcache(&args, NULL);
  expect(status == FLASH4_STATUS_OK, "KV-cache decode step with an append");
  for (h = 0; status == FLASH4_STATUS_OK && h < kHeads; ++h) {
    expect(fabs(out[h * kDim] - want_out) < 1e-6, "KV-cache out value");
    expect(fabs(lse[h] - (score + log(kKeys + 1.0))) < 1e-5, "KV-cache lse value");
  }
  expect(v_cache[kKeys * kHeadsKv * kDim] == 1.0f && k_cache[kKeys * kHeadsKv * kDim] == 0.5f, "appended row");
  expect(v_cache[(kKeys + 1) * kHeadsKv * kDim] == -7.0f, "rows past the append untouched");

  /* Paged: sequence position j lives in page table[j / 4], row j % 4; pool page 0 is unused. */
  for (i = 0; i < 3 * kPage * kHeadsKv * kDim; ++i) k_pool[i] = -7.0f, v_pool[i] = -7.0f;
  for (i = 0; i < kKeys * kHeadsKv * kDim; ++i) {
    const int per_page = kPage * kHeadsKv * kDim, at = table[i / per_page] * per_page + i % per_page;
    k_pool[at] = 0.5f, v_pool[at] = 0.25f;
  }
  memset(out, 0, sizeof out);
  args.k_cache = flash4_tensor_contiguous(k_pool, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, pool_shape);
  args.v_cache = flash4_tensor_contiguous(v_pool, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, pool_shape);
  args.block_table = flash4_tensor_contiguous(table, FLASH4_INT32, FLASH4_DEVICE_CPU, 0, 2, table_shape);
  status = flash4_forward_kvcache(&args, NULL);
  expect(status == FLASH4_STATUS_OK, "paged KV-cache decode step with an append");
  for (h = 0; status == FLASH4_STATUS_OK && h < kHeads; ++h)
    expect(fabs(out[h * kDim] - want_out) < 1e-6, "paged KV-cache out value");
  expect(v_pool[(1 * kPage + 1) * kHeadsKv * kDim] == 1.0f, "appended row in page table[1], row 1");

  /* Appending one key to a full contiguous cache: refused, named, nothing written. */
  args.k_cache = flash4_tensor_contiguous(k_cache, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, cache_shape);
  args.v_cache = flash4_tensor_contiguous(v_cache, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, cache_shape);
  {
    flash4_kvcache_args fresh;
    flash4_kvcache_args_init(&fresh);
    args.block_table = fresh.block_table; /* absent again */
  }
  seqlens[0] = kCacheRows;
  out[0] = -1.0f;
  status = flash4_forward_kvcache(&args, NULL);
  expect(status == FLASH4_STATUS_INVALID_ARGUMENT, "an append past the cache is an invalid argument");
  expect(strstr(flash4_last_error(), "cache_seqlens") != NULL, "the message names cache_seqlens");
  expect(out[0] == -1.0f && v_cache[(kCacheRows - 1) * kHeadsKv * kDim] == -7.0f, "nothing written on an error");
}

int main(void) {
  /* All-equal inputs: every output equals v's value and the LSE of row i is the (constant) score + log(i + 1). */
  static float q[kSeq * kHeads * kDim], k[kSeq * kHeadsKv * kDim], v[kSeq * kHeadsKv * kDim];
  static float out[kSeq * kHeads * kDim], lse[kHeads * kSeq];
  const int64_t q_shape[4] = {1, kSeq, kHeads, kDim}, kv_shape[4] = {1, kSeq, kHeadsKv, kDim};
  const int64_t lse_shape[3] = {1, kHeads, kSeq};
  flash4_forward_args args;
  int i, h, status;
  for (i = 0; i < kSeq * kHeads * kDim; ++i) q[i] = 0.5f;
  for (i = 0; i < kSeq * kHeadsKv * kDim; ++i) k[i] = 0.5f, v[i] = 0.25f;

  flash4_forward_args_init(&args);
  args.q = flash4_tensor_contiguous(q, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, q_shape);
  args.k = flash4_tensor_contiguous(k, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, kv_shape);
  args.v = flash4_tensor_contiguous(v, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, kv_shape);
  args.out = flash4_tensor_contiguous(out, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, q_shape);
  args.lse = flash4_tensor_contiguous(lse, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, lse_shape);
  args.causal = 1;

  expect(flash4_can_implement_forward(&args) == FLASH4_STATUS_OK, "can_implement on a valid CPU problem");
  status = flash4_forward(&args, NULL);
  expect(status == FLASH4_STATUS_OK, "forward on a valid CPU problem");
  if (status == FLASH4_STATUS_OK) {
    const double score = 0.25 * kDim / sqrt((double)kDim);
    for (i = 0; i < kSeq; ++i)
      for (h = 0; h < kHeads; ++h) {
        expect(fabs(lse[h * kSeq + i] - (score + log(i + 1.0))) < 1e-4, "lse value");
        expect(fabs(out[(i * kHeads + h) * kDim] - 0.25f) < 1e-6, "out value");
      }
  }

  /* heads (2) not a multiple of heads_kv (3): rejected, outputs untouched, the message names the argument. */
  {
    const int64_t bad_kv_shape[4] = {1, kSeq, 3, kDim};
    float before = out[0];
    out[0] = -1.0f;
    args.k = flash4_tensor_contiguous(k, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, bad_kv_shape);
    args.v = args.k;
    status = flash4_forward(&args, NULL);
    expect(status == FLASH4_STATUS_INVALID_ARGUMENT, "forward with heads % heads_kv != 0 is an invalid argument");
    expect(strstr(flash4_last_error(), "heads_kv") != NULL, "the message names heads_kv");
    expect(out[0] == -1.0f, "nothing is written on an error");
    out[0] = before;
  }
  /* A packed batch of the same tokens in segments of 3 and 5 with a sink s per head: row i of a segment sees
   * i + 1 equal keys, so lse = log((i + 1) e^score + e^s) and out = v (i + 1) e^score / e^lse. */
  {
    static int cu[3] = {0, 3, 8};
    static float sink[kHeads] = {1.0f, -2.0f};
    const int64_t packed_q[3] = {kSeq, kHeads, kDim}, packed_kv[3] = {kSeq, kHeadsKv, kDim};
    const int64_t packed_lse[2] = {kHeads, kSeq}, cu_shape[1] = {3}, sink_shape[1] = {kHeads};
    const double score = 0.25 * kDim / sqrt((double)kDim);
    flash4_forward_args_init(&args);
    args.q = flash4_tensor_contiguous(q, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, packed_q);
    args.k = flash4_tensor_contiguous(k, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, packed_kv);
    args.v = flash4_tensor_contiguous(v, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, packed_kv);
    args.out = flash4_tensor_contiguous(out, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, packed_q);
    args.lse = flash4_tensor_contiguous(lse, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 2, packed_lse);
    args.cu_seqlens_q = flash4_tensor_contiguous(cu, FLASH4_INT32, FLASH4_DEVICE_CPU, 0, 1, cu_shape);
    args.cu_seqlens_k = args.cu_seqlens_q;
    args.max_seqlen_q = args.max_seqlen_k = 5;
    args.learnable_sink = flash4_tensor_contiguous(sink, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 1, sink_shape);
    args.causal = 1;
    status = flash4_forward(&args, NULL);
    expect(status == FLASH4_STATUS_OK, "packed forward with a sink");
    for (i = 0; status == FLASH4_STATUS_OK && i < kSeq; ++i) {
      const int row = i < 3 ? i : i - 3; /* position inside its segment */
      for (h = 0; h < kHeads; ++h) {
        const double want_lse = log((row + 1) * exp(score) + exp((double)sink[h]));
        expect(fabs(lse[h * kSeq + i] - want_lse) < 1e-4, "packed lse value");
        expect(fabs(out[(i * kHeads + h) * kDim] - 0.25 * (row + 1) * exp(score - want_lse)) < 1e-5,
               "packed out value");
      }
    }
    args.max_seqlen_q = 4; /* shorter than the second segment */
    status = flash4_forward(&args, NULL);
    expect(status == FLASH4_STATUS_INVALID_ARGUMENT, "max_seqlen_q below a segment is an invalid argument");
    expect(strstr(flash4_last_error(), "max_seqlen_q") != NULL, "the message names max_seqlen_q");
  }
  kvcache_decode();
  expect(flash4_forward(NULL, NULL) == FLASH4_STATUS_INVALID_ARGUMENT, "null args");
  expect(flash4_forward_kvcache(NULL, NULL) == FLASH4_STATUS_INVALID_ARGUMENT, "null KV-cache args");
  expect(strcmp(flash4_status_string(FLASH4_STATUS_NOT_SUPPORTED), "not supported") == 0, "status string");
  expect(strlen(flash4_version()) > 0, "version");

  if (failures == 0) printf("test_c_api: flash4 %s C API passed\n", flash4_version());
  return failures == 0 ? 0 : 1;
}
