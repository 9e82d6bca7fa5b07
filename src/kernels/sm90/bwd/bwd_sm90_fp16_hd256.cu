// One wgmma backward main-kernel instantiation: fp16, head_dim 256, masked and unmasked.
#include "kernels/sm90/bwd/bwd_sm90_hd256_launch.cuh"

template void flash4::sm90::launch_bwd_wgmma_hd256<__half>(const flash4::sm90::bwd::BwdWgmmaParams&, bool, cudaStream_t);
