// One backward main-kernel instantiation: bf16, head_dim 64, masked and unmasked.
#include "kernels/sm90/bwd/bwd_launch.cuh"

template void flash4::sm90::launch_bwd_main<__nv_bfloat16, 64>(const flash4::sm90::BwdParams&, bool, cudaStream_t);
