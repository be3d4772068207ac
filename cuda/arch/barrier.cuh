// Memory fences and named CTA barriers (sm_70+, below every architecture the build targets).
#pragma once

namespace jaxsparse_tc {

// A release/acquire fence at GPU scope: what a split piece's partial needs before its counter
// increment (release) and after the increment that completes the window (acquire). Lighter than
// __threadfence(), which is sequentially consistent (fence.sc).
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Named CTA barrier ID (1-15; 0 is __syncthreads) over `threads` threads (a multiple of 32):
// producers arrive without waiting, after their shared-memory writes (arrive releases them);
// the consumer waits in sync (which acquires them). The ID is an immediate: with an ID in a
// register ptxas reserves all 16 of the CTA's barriers.
template <int ID>
__device__ __forceinline__ void barrier_arrive(int threads) {
  asm volatile("bar.arrive %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}
template <int ID>
__device__ __forceinline__ void barrier_sync(int threads) {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}

}  // namespace jaxsparse_tc
