// Tensor-core SpMM with register gathers (spmm_tc): FlashSparse's swap-and-transpose,
// C^T = X^T A^T, for fp16, bf16 and fp32 as tf32. The 8-row window is the MMA's n=8 operand (B),
// gathered X rows the m=16 operand (A), so a block is 8 rows x 8 condensed columns with no
// padding rows. One warp owns one schedule item and a slab of 16*MT features (MT m16 tiles).
// Feature remapping: MMA row g of tile i is feature 2*MT*g + 2i and row g+8 is 2*MT*g + 2i + 1,
// so each thread's A operands are 2*MT consecutive features of one X row: one 16-byte load per
// gathered row (MT=4, fp16), 8 lanes covering a contiguous 128-byte segment, and the C fragment
// maps back to the same contiguous features, so stores are 16 bytes wide too.
#pragma once
#include <cstdint>

#include "common/format.h"
#include "cuda/arch/mma.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/spmm/params.cuh"

namespace jaxsparse_tc {
namespace spmm {

// One step of spmm_tc: NB blocks (bits, value base, the thread's two column indices per block,
// -1 = no column) into acc, KB blocks per MMA. Every gather of the step is issued before the
// first MMA, so NB/KB MMAs' loads are in flight per warp.
template <class T, int MT, int KB, int NB>
__device__ __forceinline__ void spmm_step(const T* xh, const T* vh, const SpmmParams& p, int64_t f,
                                          const uint64_t (&bits)[NB], const int (&vbase)[NB],
                                          const int (&col)[NB][2], int g, float (&acc)[MT][4]) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int E = 2 * MT;
  constexpr int NW = Words<T, E>::N;
  const int t = threadIdx.x & 3;
  uint32_t xw[NB][2][NW];  // [block][column j][words]
  float bv[NB][2];
#pragma unroll
  for (int kb = 0; kb < NB; ++kb)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // fp16: columns 2t, 2t+1 (k pairs); tf32: columns t, t+4.
      const int c = kTf32 ? t + 4 * j : 2 * t + j;
      const int off = bit_value_offset(bits[kb], c * 8 + g);  // A(row g, column c)
      bv[kb][j] = off >= 0 ? to_f32<T>(vh[clamp_sum(vbase[kb], off, p.last_value)]) : 0.f;
      if (col[kb][j] >= 0 && f < p.d) {
        load_row<T, E>(xh + int64_t(col[kb][j]) * p.d, f, p.d, p.vec, xw[kb][j]);
      } else {
#pragma unroll
        for (int i = 0; i < NW; ++i) xw[kb][j][i] = 0u;
      }
    }
#pragma unroll
  for (int s = 0; s < NB; s += KB) {
    if constexpr (kTf32) {
      const uint32_t bw[2] = {to_tf32(bv[s][0]), to_tf32(bv[s][1])};
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint32_t a[4] = {to_tf32(__uint_as_float(xw[s][0][2 * i])),
                               to_tf32(__uint_as_float(xw[s][0][2 * i + 1])),
                               to_tf32(__uint_as_float(xw[s][1][2 * i])),
                               to_tf32(__uint_as_float(xw[s][1][2 * i + 1]))};
        mma_1688_tf32(acc[i], a, bw);
      }
    } else {
      uint32_t bw[2];
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
        bw[kb] = raw16(from_f32<T>(bv[s + kb][0])) | (raw16(from_f32<T>(bv[s + kb][1])) << 16);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint32_t a[4] = {pack_lo(xw[s][0][i], xw[s][1][i]), pack_hi(xw[s][0][i], xw[s][1][i]),
                               pack_lo(xw[s + 1][0][i], xw[s + 1][1][i]),
                               pack_hi(xw[s + 1][0][i], xw[s + 1][1][i])};
        mma_16816(acc[i], a, bw, T{});
      }
    }
  }
}

constexpr int kStageBlocks = 32;  // blocks whose metadata a warp stages in shared memory at once

// Tensor-core SpMM with register gathers (the window kernel where spmm_async does not apply).
// T = __half / __nv_bfloat16 (m16n8k16, two blocks per MMA) or float (tf32 m16n8k8, one block
// per MMA). MT = m16 tiles per warp: the slab is 16*MT features. The warp first copies a chunk's
// bitmaps, value offsets and column indices to shared memory with coalesced loads, so each
// step's gathers wait on a shared read instead of a dependent global load of the column index;
// a step issues the gathers of two MMAs before the first one. MINB: 4 for 16-bit types (a
// 128-register cap, 16 warps/SM: the fastest setting measured on H100, rmat17 fp16 d=128 0.239
// ms against 0.286 uncapped at 141 registers); tf32 gained nothing from the cap.
template <class T, int MT, int MINB>
__global__ void __launch_bounds__(kWarps * 32, MINB) spmm_tc(const SpmmParams p) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int E = 2 * MT;          // consecutive features per thread
  constexpr int KB = kTf32 ? 1 : 2;  // blocks per MMA
  constexpr int NB = KB * 2;         // blocks per step (two MMAs in flight)
  __shared__ int s_cols[kWarps][kStageBlocks * 8];
  __shared__ uint64_t s_bits[kWarps][kStageBlocks];
  __shared__ int s_vptr[kWarps][kStageBlocks];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wid = threadIdx.x >> 5;
  Unit wi;
  if (!warp_item(p, kWarps, wi)) return;
  const int w = wi.w, b0 = wi.b0, b1 = wi.b1, slab = wi.slab, slot = wi.slot;
  const int wb = wi.wb, cb = wi.cb, ncols_w = wi.ncols;
  const int64_t f = int64_t(slab) * 16 * MT + int64_t(E) * g;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const T* xh = static_cast<const T*>(p.x) + h * p.x_head_stride;
    const T* vh = static_cast<const T*>(p.values) + h * p.v_head_stride;
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    for (int c0 = b0; c0 < b1; c0 += kStageBlocks) {
      const int c1 = min(b1, c0 + kStageBlocks);
      __syncwarp();  // the previous chunk's readers are done
      if (c0 + lane < c1) {
        s_bits[wid][lane] = load_block_bits(p.bitmap, c0 + lane);
        s_vptr[wid][lane] = __ldg(p.bvp + c0 + lane);
      }
      const int col_lo = 8 * (c0 - wb), col_hi = min(8 * (c1 - wb), ncols_w);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int i = k * 32 + lane;
        s_cols[wid][i] =
            col_lo + i < col_hi ? clamp_last(__ldg(p.wc + cb + col_lo + i), p.last_col) : -1;
      }
      __syncwarp();
      for (int b = c0; b < c1; b += NB) {
        uint64_t bits[NB];
        int vbase[NB], col[NB][2];
#pragma unroll
        for (int kb = 0; kb < NB; ++kb) {
          const int lb = b + kb - c0;
          const bool in = b + kb < c1;
          bits[kb] = in ? s_bits[wid][lb] : 0ull;
          vbase[kb] = in ? s_vptr[wid][lb] : 0;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int c = kTf32 ? t + 4 * j : 2 * t + j;
            col[kb][j] = in ? s_cols[wid][lb * 8 + c] : -1;
          }
        }
        spmm_step<T, MT, KB, NB>(xh, vh, p, f, bits, vbase, col, g, acc);
      }
    }
    // C fragment: c0/c1 = feature f+2i at rows 2t/2t+1, c2/c3 = feature f+2i+1.
    const int rows[2] = {2 * t, 2 * t + 1};
    float v[2][E];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      v[0][2 * i] = acc[i][0];
      v[0][2 * i + 1] = acc[i][2];
      v[1][2 * i] = acc[i][1];
      v[1][2 * i + 1] = acc[i][3];
    }
    finish<T, 2, E>(p, h, w, slab, f, rows, v, slot, b1 - b0, wi.wend - wb);
  }
}

}  // namespace spmm
}  // namespace jaxsparse_tc
