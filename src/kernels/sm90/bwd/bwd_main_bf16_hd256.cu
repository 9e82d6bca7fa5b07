// One backward main-kernel instantiation: bf16, head_dim 256, masked and unmasked.
#include "kernels/sm90/bwd/bwd_launch.cuh"

template void flash4::sm90::launch_bwd_main<__nv_bfloat16, 256>(const flash4::sm90::BwdParams&, bool, cudaStream_t);
