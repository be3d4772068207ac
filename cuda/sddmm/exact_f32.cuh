// Exact fp32 SDDMM on the window format (sddmm_f32_exact), on CUDA cores: the window kernel for
// float32 with precision "highest" (one nonzero at a time, a warp-wide dot product).
#pragma once
#include <algorithm>
#include <cstdint>

#include "common/format.h"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/sddmm/params.cuh"

namespace jaxsparse_tc {
namespace sddmm {

// Exact fp32 SDDMM on CUDA cores: per nonzero, a warp-wide dot product over d.
__global__ void __launch_bounds__(kWarps * 32) sddmm_f32_exact(const SddmmParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= p.num_items) return;
  const int4 it = p.sched[2 * item];
  const int w = clamp_last(it.x, p.last_window);
  const WindowSpan span = window_span(p, w);  // the item's blocks folded into its window's
  const int b0 = clamp_to(it.y, span.wb, span.wend), b1 = clamp_to(it.z, b0, span.wend);
  const int wb = span.wb;
  const int cb = span.cb, ncols_w = span.ncols;
  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const float* xh = static_cast<const float*>(p.x) + h * p.x_head_stride;
    const float* yh = static_cast<const float*>(p.y) + h * p.y_head_stride;
    float* oh = static_cast<float*>(p.out) + int64_t(h) * p.nnz;
    for (int b = b0; b < b1; ++b) {
      uint64_t bits = load_block_bits(p.bitmap, b);
      const int vbase = __ldg(p.bvp + b);
      int rank = 0;  // of the bit among the block's
      const int colbase = 8 * (b - wb);
      const int ncols = min(8, ncols_w - colbase);
      const int mycol =
          lane < ncols ? clamp_last(__ldg(p.wc + cb + colbase + lane), p.last_col) : 0;
      while (bits) {  // uniform across the warp
        const int k = __ffsll(static_cast<long long>(bits)) - 1;
        bits &= bits - 1;
        const int r = k & 7, c = k >> 3;
        const int col = __shfl_sync(0xffffffffu, mycol, c);
        // A bit past the window's real rows (a corrupt bitmap's) reads the last row.
        const float* xr = xh + std::min<int64_t>(int64_t(w) * kWindowRows + r, p.m - 1) * p.d;
        const float* yr = yh + int64_t(col) * p.d;
        float s = 0.f;
        for (int64_t f = 4 * lane; f < p.d; f += 128) {
          uint32_t xa[4], ya[4];
          load_row<float, 4>(xr, f, p.d, p.vec, xa);
          load_row<float, 4>(yr, f, p.d, p.vec, ya);
#pragma unroll
          for (int e = 0; e < 4; ++e) s = fmaf(__uint_as_float(xa[e]), __uint_as_float(ya[e]), s);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) oh[clamp_sum(vbase, rank, p.last_value)] = s;
        ++rank;
      }
    }
  }
}

}  // namespace sddmm
}  // namespace jaxsparse_tc
