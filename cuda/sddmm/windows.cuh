// Tensor-core SDDMM on the window format (sddmm_tc): swap-and-transpose again. For a pair of
// blocks of one window the MMA computes S^T (16 condensed columns x 8 window rows) = Y_cols
// (16 x d) . X_w^T (d x 8): the gathered Y rows are the m=16 operand, the window's 8 X rows the
// n=8 one, k runs over features. Features are remapped inside each 32-feature chunk so that every
// thread's operand elements are consecutive in memory: thread t of a group reads features
// 8t..8t+7 of the chunk (one 16-byte load for 16-bit types), for its Y rows and its X row alike
// (the same permutation on both sides of the dot product leaves it unchanged). A warp owns a
// schedule item (or one of `sub` equal parts of it) and all of d; nothing is combined across
// warps (every output value belongs to one block), so items can be cut anywhere. A warp walks
// its blocks serially, two dependent memory round trips per pair, so on small graphs (few items)
// the longest item is the kernel's time: there the launch cuts each item into parts (plan/sddmm.h).
#pragma once
#include <cstdint>

#include "common/format.h"
#include "cuda/arch/mma.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/sddmm/params.cuh"

namespace jaxsparse_tc {
namespace sddmm {

// T: operand type; O: value type out (T, or float: the fp32 accumulator unrounded).
template <class T, class O = T>
__global__ void __launch_bounds__(kWarps * 32) sddmm_tc(const SddmmParams p) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int NW = Words<T, 8>::N;  // 4 words (16-bit) or 8 (fp32) per 8 features
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t unit = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t item = unit / p.sub;
  if (item >= p.num_items) return;
  const int4 it = p.sched[2 * item];
  const int w = clamp_last(it.x, p.last_window);
  const WindowSpan span = window_span(p, w);  // the item's blocks folded into its window's
  const int ib = clamp_to(it.y, span.wb, span.wend), ie = clamp_to(it.z, ib, span.wend);
  const int share = ((ie - ib + p.sub - 1) / p.sub + 1) & ~1;  // even: whole block pairs
  const int b0 = ib + int(unit % p.sub) * share, b1 = min(ie, b0 + share);
  if (b0 >= b1) return;
  const int wb = span.wb;
  const int cb = span.cb, ncols_w = span.ncols;
  const int64_t xrow = int64_t(w) * kWindowRows + g;  // this thread's X row (B operand)
  const bool xrow_ok = xrow < p.m;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const T* xh = static_cast<const T*>(p.x) + h * p.x_head_stride + xrow * p.d;
    const T* yh = static_cast<const T*>(p.y) + h * p.y_head_stride;
    O* oh = static_cast<O*>(p.out) + int64_t(h) * p.nnz;
    for (int b = b0; b < b1; b += 2) {
      // Rows of the m=16 operand: column g of block b (rows 0..7) and of block b+1 (8..15).
      const T* yrow[2];
      uint64_t bits[2];
      int vbase[2];
#pragma unroll
      for (int kb = 0; kb < 2; ++kb) {
        const int blk = b + kb;
        const bool in = blk < b1;
        bits[kb] = in ? load_block_bits(p.bitmap, blk) : 0ull;
        vbase[kb] = in ? __ldg(p.bvp + blk) : 0;
        const int c = 8 * (blk - wb) + g;
        yrow[kb] = in && c < ncols_w
                       ? yh + int64_t(clamp_last(__ldg(p.wc + cb + c), p.last_col)) * p.d
                       : nullptr;
      }
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4  // d=128: every chunk's gathers in flight together
      for (int64_t q = 0; q < p.d; q += 32) {
        const int64_t f = q + 8 * t;
        uint32_t ya[NW], yb[NW], xw[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i) ya[i] = yb[i] = xw[i] = 0u;
        const bool fin = f < p.d;
        if (fin && yrow[0]) load_row<T, 8>(yrow[0], f, p.d, p.vec, ya);
        if (fin && yrow[1]) load_row<T, 8>(yrow[1], f, p.d, p.vec, yb);
        if (fin && xrow_ok) load_row<T, 8>(xh, f, p.d, p.vec, xw);
        if constexpr (kTf32) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {  // k-steps of 8: features 8t+2j, 8t+2j+1
            const uint32_t a[4] = {
                to_tf32(__uint_as_float(ya[2 * j])), to_tf32(__uint_as_float(yb[2 * j])),
                to_tf32(__uint_as_float(ya[2 * j + 1])), to_tf32(__uint_as_float(yb[2 * j + 1]))};
            const uint32_t bb[2] = {to_tf32(__uint_as_float(xw[2 * j])),
                                    to_tf32(__uint_as_float(xw[2 * j + 1]))};
            mma_1688_tf32(acc, a, bb);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 2; ++j) {  // k-steps of 16: features 8t+4j .. 8t+4j+3
            const uint32_t a[4] = {ya[2 * j], yb[2 * j], ya[2 * j + 1], yb[2 * j + 1]};
            const uint32_t bb[2] = {xw[2 * j], xw[2 * j + 1]};
            mma_16816(acc, a, bb, T{});
          }
        }
      }
      // c0/c1: block b, column g, rows 2t/2t+1; c2/c3: block b+1.
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int off = bit_value_offset(bits[kb], g * 8 + 2 * t + rr);
          if (off >= 0) oh[clamp_sum(vbase[kb], off, p.last_value)] = from_f32<O>(acc[2 * kb + rr]);
        }
    }
  }
}

}  // namespace sddmm
}  // namespace jaxsparse_tc
