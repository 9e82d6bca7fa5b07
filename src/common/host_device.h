// FLASH4_HD marks helpers compiled for both the host (CPU path, tests) and the device (kernels).
#pragma once
#if defined(__CUDACC__)
#define FLASH4_HD __host__ __device__ __forceinline__
#else
#define FLASH4_HD inline
#endif
