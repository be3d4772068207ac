// Asynchronous global -> shared copies (cp.async, sm_80+) and the transposing shared-memory
// fragment load (ldmatrix). Gathers go through these so a warp keeps many rows in flight
// without holding them in registers.
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
// reads nothing. L1 = true allocates in L1 (.ca: rows gathered again by the same SM, such as
// power-law hub columns, hit there); false goes to L2 only (.cg).
template <bool L1 = false>
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  if constexpr (L1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

// 4-byte variant (src_bytes 0..4), for arrays with only 4-byte alignment.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are pending. Other lanes' copies
// are visible only after a __syncwarp() that follows every lane's wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four transposed 8x8 b16 matrices; lane i gives the row address of matrix i/8, row i%8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

}  // namespace jaxsparse_tc
