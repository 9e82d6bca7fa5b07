// setmaxnreg: move registers between warpgroups of a warp-specialized kernel (the producer needs few, the
// consumers' accumulators need many). Only honoured when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)) and each role is one branch of an if/else.
#pragma once

namespace flash4::sm90 {

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256);
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256);
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

}  // namespace flash4::sm90
