// One wgmma backward main-kernel instantiation: bf16, head_dim 128, masked and unmasked.
#include "kernels/sm90/bwd/bwd_sm90_launch.cuh"

template void flash4::sm90::launch_bwd_wgmma<__nv_bfloat16, 128>(const flash4::sm90::bwd::BwdWgmmaParams&, bool, cudaStream_t);
