// Tensor-core fragments for the swap-and-transpose scheme (FlashSparse): the 8-row window is
// the MMA's n=8 operand, gathered dense rows the m=16 one. Thin wrappers over mma.sync and
// movmatrix so the kernels read as math; layouts are the PTX ISA's (groupID g = lane/4,
// t = lane%4):
//   m16n8k16 f16/bf16  A: {g,2t..2t+1} {g+8,2t..} {g,2t+8..} {g+8,2t+8..}
//                      B: {k=2t..,n=g} {k=2t+8..,n=g}
//   m16n8k8  tf32      A: {g,t} {g+8,t} {g,t+4} {g+8,t+4}
//                      B: {k=t,n=g} {k=t+4,n=g}
//   C (both, fp32)     {g,2t} {g,2t+1} {g+8,2t} {g+8,2t+1}
// mma.sync m16n8k16 / m16n8k8.tf32 and cvt.rna.tf32 need sm_80, movmatrix sm_75: compiled for
// an older architecture they trap.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace jaxsparse_tc {

// D += A * B, fp16 inputs, fp32 accumulation.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2], __half) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// D += A * B, bf16 inputs, fp32 accumulation.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2], __nv_bfloat16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// D += A * B, tf32 inputs (already rounded with to_tf32), fp32 accumulation.
__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4],
                                              const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Round-to-nearest fp32 -> tf32 (truncation would bias every product low).
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
  return r;
}

// The transpose of an 8x8 b16 matrix held one word per lane (a C fragment half to a B fragment).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  __trap();
#else
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
#endif
  return y;
}

// Two 16-bit lanes from two words: lo halves (lo(a), lo(b)) and hi halves (hi(a), hi(b)).
// The column remapping keeps feature pairs in one word; these re-pair them along k.
__device__ __forceinline__ uint32_t pack_lo(uint32_t a, uint32_t b) {
  return __byte_perm(a, b, 0x5410);
}
__device__ __forceinline__ uint32_t pack_hi(uint32_t a, uint32_t b) {
  return __byte_perm(a, b, 0x7632);
}

}  // namespace jaxsparse_tc
