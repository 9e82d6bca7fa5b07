// Programmatic dependent launch (sm_90): a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization
// may start while the kernel before it on the stream is still running, so its launch latency hides behind that
// kernel's tail. It must wait (grid_dependency_wait) before it reads what that kernel wrote.
#pragma once

namespace flash4::sm90 {

// Blocks until every prerequisite grid has completed and its memory writes are visible to this thread. A no-op
// when the kernel was launched without the attribute.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the dependent grid launch once every CTA of this grid has called it (or exited); its CTAs then wait in
// grid_dependency_wait, so calling this early only moves the dependent's launch, never its reads.
__device__ __forceinline__ void grid_dependency_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" :::);
}

}  // namespace flash4::sm90
