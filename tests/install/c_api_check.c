/* The installed C header compiled as C: a forward through flash4/c_api.h with all-equal inputs, whose every
 * output equals v's value. Called from main.cpp. */
#include <math.h>
#include <stdio.h>

#include <flash4/c_api.h>

int install_check_c_api(void) {
  enum { kSeq = 4, kHeads = 1, kDim = 8 };
  static float q[kSeq * kHeads * kDim], k[kSeq * kHeads * kDim], v[kSeq * kHeads * kDim], out[kSeq * kHeads * kDim];
  const int64_t shape[4] = {1, kSeq, kHeads, kDim};
  flash4_forward_args args;
  int i;
  for (i = 0; i < kSeq * kHeads * kDim; ++i) q[i] = 0.5f, k[i] = 0.5f, v[i] = 0.25f;
  flash4_forward_args_init(&args);
  args.q = flash4_tensor_contiguous(q, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, shape);
  args.k = flash4_tensor_contiguous(k, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, shape);
  args.v = flash4_tensor_contiguous(v, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, shape);
  args.out = flash4_tensor_contiguous(out, FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, shape);
  if (flash4_forward(&args, NULL) != FLASH4_STATUS_OK) {
    fprintf(stderr, "install check: C API forward failed: %s\n", flash4_last_error());
    return 1;
  }
  for (i = 0; i < kSeq * kHeads * kDim; ++i) {
    if (fabsf(out[i] - 0.25f) > 1e-6f) {
      fprintf(stderr, "install check: C API forward gave a wrong result at %d\n", i);
      return 1;
    }
  }
  return 0;
}
