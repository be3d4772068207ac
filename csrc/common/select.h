// The kernel selector (docs/DESIGN.md, "Which kernel runs"): one pure host function per choice
// between kernel families, from cheap features of the pattern and the dense operands' width and
// element size. The CUDA launch plans (cuda/spmm/plan.h, cuda/sddmm/plan.h) call them; the CPU
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

// Past this reuse a window's gathered rows serve four or more nonzeros each: tensor cores on any
// graph size (a graph of dense communities at reuse 4.2 ran the tensor-core SpMM in 0.47-0.79x
// the row kernels' time at every width, fp16 and fp32; below 2^19 nonzeros this is the cost
// model's, not a measurement).
constexpr double kDenseReuse = 4.0;

// The rules below are fit on the H100 grid of docs/DESIGN.md ("The kernel selector": the
// schedules in their current order, pattern.py; 5 real graphs and R-MAT 17/16 in affinity order,
// DD and facebook-page-page in their own at d = 128, three graphs of dense communities; d 32, 128
// and 256, fp16 and fp32; python -m benchmarks.bench_kernels), where they pick the faster kernel
// (within 3%) in 55 of 58 SDDMM configurations; the SpMM rule was refit on a grid of its own
// after the tensor-core SpMM's two-block stages (39 of 39).

// Large graphs (>= 2^19 nonzeros: enough to fill the device) whose window's condensed columns
// serve >= `reuse` nonzeros each on average.
inline bool large_with_reuse(const PatternFeatures& f, double reuse) {
  return f.nnz >= (int64_t(1) << 19) && row_reuse(f) >= reuse;
}

// SpMM: the row kernels walk rows in row order where windows reuse their columns
// (pattern.row_order), so that neighbouring rows share X rows in L1 and L2, and are faster than
// the tensor-core kernel on most real graphs (H100, affinity order, d = 64-256: tensor cores
// take 1.0-2.9x the row kernels' time on pubmed, proteins, github-musae, R-MAT 17/16 and
// facebook-page-page). Tensor cores take 16-bit rows of 256 bytes and more on large graphs from
// reuse 1.8, where their two-block stages pay (fp16 d = 128: communities at reuse 1.9 0.88x, at
// 2.8 0.59x; DD at 2.3 0.93x, 0.99x at d = 256; github-musae at 1.3 1.2x), and reuse >= 4 at
// any width. tf32 tensor cores do not beat the exact row kernels below reuse 4 (DD 0.98-1.05x,
// the others 1.1-1.8x).
inline bool spmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  if (row_reuse(f) >= kDenseReuse) return true;
  return esize == 2 && d * esize >= 256 && large_with_reuse(f, 1.8);
}

// SDDMM: the row kernel (a lane group per row, dot products of d features) is slow on narrow
// rows, the tensor-core one on wide rows of large, unstructured graphs and in float32. Measured:
// - reuse >= 4: tensor cores (0.56-0.82x), except 1 KB float32 rows (1.18x);
// - small graphs (< 2^17 nonzeros, pubmed), whose row kernel gives each lane group one row
//   (sddmm/plan.h): tensor cores for 64-byte rows (0.67-0.71x); past them the row kernel
//   (0.58-0.90x; 128-byte fp16 rows tie, 1.02x / 0.99x);
// - large graphs with reuse, 16-bit: tensor cores from reuse 2 for rows of 128 bytes and more
//   (DD 0.89-0.92x), from 2.5 for any row (communities at 2.8: 0.80-0.84x); the row kernels at
//   reuse 1.9 (communities, 1.02-1.13x) and in float32 (1.04-1.96x);
// - long rows (>= 12 per row) otherwise: below 2^20 nonzeros tensor cores for 64-byte rows, at
//   any width from reuse 1.8 (facebook-page-page: 0.38-0.93x, one miss, 1.04x for 512-byte
//   fp32 rows; github-musae: 0.62x at 64 bytes, 1.03-1.55x past them, since the streams walk
//   its rows a little past the row piece); above, 16-bit rows up to 128 bytes (R-MAT 17/16:
//   0.67x; 1.21-1.53x past them);
// - otherwise the row kernels (proteins, DD in float32, R-MAT 20/8).
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
// per-edge pass and three SpMMs), where both can run (16-bit, d = dv in {32, 64, 128}). Measured
// (H100, H=4, fp16, fwd+bwd, affinity order, with the current schedules): d = 64, fused on all
// six graphs (0.40-0.98x the composed time); d = 128, fused where blocks are fuller (>= 10
// nonzeros per block) on graphs of 2^18 nonzeros and more (facebook 376 against 511 us, github
// 828 / 842), composed elsewhere (R-MAT 17/16 at 9.5 per block: 2627 against 2842; proteins
// 376 / 400). One miss: DD at d = 128, whose composed backward runs the row kernels in locality
// order and took 2995 us against the fused 3215 (before the schedule change the fused one won,
// 3402 against 4215); one graph was not taken as grounds for a new clause.
inline bool attention_backward_prefers_fused(const PatternFeatures& f, int64_t d, int /*esize*/) {
  if (d <= 64 || f.nnz < kSmallGraphNnz) return true;
  return f.nnz >= (int64_t(1) << 18) && derived_features(f).nnz_per_block >= 10.0;
}

}  // namespace jaxsparse_tc
