// The kernel selector (docs/DESIGN.md, "Which kernel runs"): one pure host function per choice
// between kernel families, from cheap features of the pattern and the dense operands' width and
// element size. The CUDA launch plans (plan/spmm.h, plan/sddmm.h) call them; the CPU
// extension answers with them too (kernel_choices, behind jaxsparse_tc.kernel_plan and the
// attention backward's dispatch), so a choice can be asked on a machine without a GPU. The plans
// keep what is a constraint rather than a preference: exact float32, the row kernels' width and
// workspace, the tensor-core kernels' shapes.
#pragma once
#include <cstdint>

#include "common/format.h"

namespace jaxsparse_tc {

// What the selector reads of one orientation of a pattern: lengths of its arrays
// (docs/FORMAT.md), so that a handler has them from its buffers' shapes and Python from the
// arrays' shapes, without a pass over the pattern.
struct PatternFeatures {
  int64_t rows;            // m
  int64_t nnz;             // nonzeros (values' length)
  int64_t windows;         // 8-row windows (window_col_ptr's length - 1)
  int64_t blocks;          // 8x8 blocks (block_bitmap's rows)
  int64_t condensed_cols;  // distinct columns summed over the windows (window_cols' length)
};

// Ratios of the features; 0 where the denominator is 0.
struct DerivedFeatures {
  double nnz_per_block;    // 64 x block fill: what a tensor-core block pays for, used
  double cols_per_window;  // condensed columns per window: dense rows a window gathers
  double mean_row_length;  // nonzeros per row
};

inline DerivedFeatures derived_features(const PatternFeatures& f) {
  auto ratio = [](int64_t a, int64_t b) { return b > 0 ? double(a) / double(b) : 0.0; };
  return {ratio(f.nnz, f.blocks), ratio(f.condensed_cols, f.windows), ratio(f.nnz, f.rows)};
}

// Rows of X that one gathered row serves: nonzeros per condensed column. The tensor-core kernels
// gather a window's dense rows once per condensed column and pay for whole 8x8 blocks; the
// CUDA-core row kernels gather once per nonzero, with many more warps per SM.
inline double row_reuse(const PatternFeatures& f) {
  return f.condensed_cols > 0 ? double(f.nnz) / double(f.condensed_cols) : 0.0;
}

// From this reuse a window's gathered rows serve four or more nonzeros each: tensor cores on any
// graph size. Measured on dense communities at reuse 4.2 (the grids below); below 2^19 nonzeros
// the threshold is the cost model's, not a measurement.
constexpr double kDenseReuse = 4.0;

// The rules below are fit on the H100 grids of docs/DESIGN.md, "The kernel selector" (both kernel
// families forced on each configuration; the commands, the figures per rule and the hit rates are
// there).

// Large graphs (>= 2^19 nonzeros: enough to fill the device) whose window's condensed columns
// serve >= `reuse` nonzeros each on average.
inline bool large_with_reuse(const PatternFeatures& f, double reuse) {
  return f.nnz >= (int64_t(1) << 19) && row_reuse(f) >= reuse;
}

// SpMM: the row kernels walk rows in row order where windows reuse their columns
// (pattern.row_order), so that neighbouring rows share X rows in L1 and L2, and are faster than
// the tensor-core kernel on most real graphs. Tensor cores take 16-bit rows of 256 bytes and more
// on large graphs from reuse 1.8, where their two-block stages pay, and any row from reuse 4.
// tf32 tensor cores do not beat the exact row kernels below reuse 4.
inline bool spmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  if (row_reuse(f) >= kDenseReuse) return true;
  return esize == 2 && d * esize >= 256 && large_with_reuse(f, 1.8);
}

// SDDMM: the row kernel (a lane group per row, dot products of d features) is slow on narrow
// rows, the tensor-core one on wide rows of large, unstructured graphs and in float32. Tensor
// cores:
// - from reuse 4, except float32 rows of more than 512 bytes;
// - on small graphs (< 2^17 nonzeros, whose row kernel gives each lane group one row:
//   plan/sddmm.h) for rows of up to 64 bytes;
// - on large 16-bit graphs from reuse 2 for rows of 128 bytes and more, from reuse 2.5 for any
//   row;
// - on long rows (>= 12 per row): below 2^20 nonzeros for rows of up to 64 bytes or from reuse
//   1.8; above, for 16-bit rows of up to 128 bytes;
// - otherwise the row kernels.
inline bool sddmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  const int64_t row_bytes = d * esize;
  if (row_reuse(f) >= kDenseReuse) return esize == 2 || row_bytes <= 512;
  if (f.nnz < (int64_t(1) << 17)) return row_bytes <= 64;
  if (esize == 2 && ((large_with_reuse(f, 2.0) && row_bytes >= 128) || large_with_reuse(f, 2.5)))
    return true;
  if (derived_features(f).mean_row_length >= 12.0) {
    if (f.nnz < (int64_t(1) << 20)) return row_bytes <= 64 || row_reuse(f) >= 1.8;
    return esize == 2 && row_bytes <= 128;
  }
  return false;
}

// Whether the attention backward prefers the fused tensor-core kernels to the composed one (a
// per-edge pass and three SpMMs), where both can run (16-bit, d = dv in {32, 64, 128}): fused at
// d <= 64 and on graphs under kSmallGraphNnz nonzeros; at d = 128 fused where blocks are fuller
// (>= 10 nonzeros per block) on graphs of 2^18 nonzeros and more, composed elsewhere. The one
// measured miss (DD at d = 128, composed faster) was not taken as grounds for a new clause.
inline bool attention_backward_prefers_fused(const PatternFeatures& f, int64_t d, int /*esize*/) {
  if (d <= 64 || f.nnz < kSmallGraphNnz) return true;
  return f.nnz >= (int64_t(1) << 18) && derived_features(f).nnz_per_block >= 10.0;
}

}  // namespace jaxsparse_tc
