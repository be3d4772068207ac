// Programmatic dependent launch (sm_90+): a kernel launched by launch_kernel(true, ...) may
// become resident while the stream's previous kernel is still running, so its launch and its
// prologue hide behind that kernel's tail (on small graphs a chain of kernels is mostly such
// gaps; measured on H100, Cora attention forward + backward d=64: 20.2 -> 19.1 us, R-MAT
// unchanged). It must call wait_prerequisites() before it touches anything the previous kernel
// writes; a previous kernel that calls allow_dependents() lets it start before its own CTAs
// exit. On older GPUs the launch is an ordinary one and both calls are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/device.h"

namespace jaxsparse_tc {

__device__ __forceinline__ void wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// `dependent`: the launch may overlap the stream's previous kernel (the caller knows that one to
// be a kernel: a memset or copy node before it leaves the launch an ordinary one).
template <class... Params, class... Args>
cudaError_t launch_kernel(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block,
                          size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = dependent && device_is_sm90_or_later() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace jaxsparse_tc
