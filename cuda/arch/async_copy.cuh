// Asynchronous global -> shared copies (cp.async, sm_80+) and the transposing shared-memory
// fragment load (ldmatrix, sm_75+). Gathers go through these so a warp keeps many rows in flight
// without holding them in registers. Compiled for an older architecture they trap.
#pragma once
#include <cstdint>

namespace jaxsparse_tc {

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// base + row * row_bytes as one 32x32 -> 64-bit multiply-add (gather addresses are most of a
// gathering loop's instructions; 64-bit index math costs several).
__device__ __forceinline__ const void* row_address(const void* base, int row, int row_bytes) {
  uint64_t a;
  asm("mad.wide.s32 %0, %1, %2, %3;\n" : "=l"(a) : "r"(row), "r"(row_bytes), "l"(base));
  return reinterpret_cast<const void*>(a);
}

// Copies src_bytes (0..16) of src to 16 bytes at dst, zero-filling the rest; src_bytes = 0
// reads nothing. Allocates in L1 (.ca), so rows gathered again by the same SM, such as power-law
// hub columns, hit there (measured on H100, rmat17 fp16 SpMM: 16.3M L2 read sectors in 4.5M
// requests against 24.5M in 10.8M with .cg, which bypasses L1).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#endif
}

// 4-byte variant (src_bytes 0..4), for arrays with only 4-byte alignment.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are pending. Other lanes' copies
// are visible only after a __syncwarp() that follows every lane's wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four transposed 8x8 b16 matrices; lane i gives the row address of matrix i/8, row i%8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#endif
}

}  // namespace jaxsparse_tc
