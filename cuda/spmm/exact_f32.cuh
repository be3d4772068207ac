// Exact fp32 SpMM on the window format (spmm_f32_exact), on CUDA cores: the window kernel for
// float32 with precision "highest" where the row kernels do not run.
#pragma once
#include <cstdint>

#include "common/format.h"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/spmm/params.cuh"

namespace jaxsparse_tc {
namespace spmm {

// Exact fp32 SpMM on CUDA cores: a warp owns an item and 128 features (4 per lane).
__global__ void __launch_bounds__(kWarps * 32) spmm_f32_exact(const SpmmParams p) {
  const int lane = threadIdx.x & 31;
  Unit wi;
  if (!warp_item(p, kWarps, wi)) return;
  const int w = wi.w, b0 = wi.b0, b1 = wi.b1, slab = wi.slab, slot = wi.slot;
  const int wb = wi.wb, cb = wi.cb, ncols_w = wi.ncols;
  const int64_t f = int64_t(slab) * 128 + 4 * lane;
  const bool active = f < p.d;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const float* xh = static_cast<const float*>(p.x) + h * p.x_head_stride;
    const float* vh = static_cast<const float*>(p.values) + h * p.v_head_stride;
    float acc[8][4] = {};
    for (int b = b0; b < b1; ++b) {
      const uint64_t bits = load_block_bits(p.bitmap, b);
      const int vbase = __ldg(p.bvp + b);
      const int cnt = __popcll(bits);
      // The block's values and column indices, one per lane, shared by shuffles.
      const float v_lo = lane < cnt ? vh[clamp_sum(vbase, lane, p.last_value)] : 0.f;
      const float v_hi = lane + 32 < cnt ? vh[clamp_sum(vbase, lane + 32, p.last_value)] : 0.f;
      const int colbase = 8 * (b - wb);
      const int ncols = min(8, ncols_w - colbase);
      const int mycol =
          lane < ncols ? clamp_last(__ldg(p.wc + cb + colbase + lane), p.last_col) : 0;
      for (int c = 0; c < ncols; ++c) {
        const int col = __shfl_sync(0xffffffffu, mycol, c);
        uint32_t xw[4] = {0u, 0u, 0u, 0u};
        if (active) load_row<float, 4>(xh + int64_t(col) * p.d, f, p.d, p.vec, xw);
        const uint32_t byte = uint32_t(bits >> (8 * c)) & 0xffu;
        int idx = __popcll(bits & ((1ull << (8 * c)) - 1ull));
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          if ((byte >> r) & 1u) {  // uniform across the warp
            const float lo = __shfl_sync(0xffffffffu, v_lo, idx & 31);
            const float hi = __shfl_sync(0xffffffffu, v_hi, idx & 31);
            const float a = idx < 32 ? lo : hi;
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][e] = fmaf(a, __uint_as_float(xw[e]), acc[r][e]);
            ++idx;
          }
        }
      }
    }
    const int rows[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    finish<float, 8, 4>(p, h, w, slab, f, rows, acc, slot, b1 - b0, wi.wend - wb);
  }
}

}  // namespace spmm
}  // namespace jaxsparse_tc
