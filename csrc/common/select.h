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
// graph size (the measured dense-community graphs of 2^18 and 2^19 nodes in communities of 64
// reached 4.2 and ran the tensor-core kernels 2.5-2.7x faster than the row kernels; below 2^19
// nonzeros this is the cost model's, not a measurement).
constexpr double kDenseReuse = 4.0;

// The rules below are fit on the H100 grid of docs/DESIGN.md ("The kernel selector": 5 real
// graphs, R-MAT 17/16 and 20/8, each in its own and in affinity order, d 32..256, fp16 and fp32,
// plus three graphs of dense communities in affinity order at every d and a fourth at d = 128;
// python -m benchmarks.bench_kernels), where they pick the faster kernel (within 3%) in 134 of
// 134 SpMM and 126 of 134 SDDMM configurations.

// Large graphs whose gathered rows are reused: a window's condensed column serves >= `reuse`
// nonzeros on average, on a graph of >= 2^19 nonzeros (enough to fill the device; smaller ones
// keep X in L2, where the row kernels' repeated gathers cost little: on facebook-page-page, reuse
// 2.0 and 342k nonzeros, they ran 1.2-1.3x faster on the grid, within 7% either way since the
// window kernel's gather loop was thinned).
inline bool large_with_reuse(const PatternFeatures& f, double reuse) {
  return f.nnz >= (int64_t(1) << 19) && row_reuse(f) >= reuse;
}

// SpMM: the tensor-core kernels on large graphs at reuse >= 1.5: DD (0.76-0.90x the row
// kernels' time in both orders) and the dense-community graphs (reuse 1.9-4.2, 0.35-0.65x);
// the row kernels below it (R-MAT 17/16 at reuse 1.2: 1.14-1.9x; github-musae at 1.3). Rows of
// 64 bytes (fp16 d = 32) need reuse >= 2.5, since a slab of the window kernel does little work
// per gathered row there: DD at 2.3 ran 48 against the row kernels' 38 us, communities at 2.8
// and 4.2 ran 78-79 against 104-152.
inline bool spmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  if (d * esize <= 64) return large_with_reuse(f, 2.5);
  return row_reuse(f) >= kDenseReuse || large_with_reuse(f, 1.5);
}

// SDDMM: the row kernel (a lane group per row, dot products of d features) is slow on narrow
// rows, the tensor-core one on wide rows of large, unstructured graphs. Measured:
// - small graphs (< 2^17 nonzeros, pubmed): tensor cores up to 256-byte fp16 rows (0.48-0.92x),
//   128-byte fp32 rows;
// - large graphs with reuse (DD, dense communities): tensor cores for 256-512-byte rows at reuse
//   >= 1.5, for rows of 128 bytes and more at reuse >= 1.8 (DD 0.70-0.94x; communities
//   0.41-0.97x, one miss: 1024-byte rows at reuse 1.9, 1.05x);
// - long rows (>= 12 per row) otherwise: tensor cores up to 256-byte rows below 2^20 nonzeros
//   (facebook, github: 0.58-0.92x), only up to 128-byte fp16 rows above (R-MAT 17/16:
//   0.55-0.89x, 1.14-1.9x past it);
// - otherwise the row kernels (proteins, R-MAT 20/8: the tensor-core kernel 1.1-1.9x slower).
inline bool sddmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  const int64_t row_bytes = d * esize;
  if (row_reuse(f) >= kDenseReuse) return true;
  if (f.nnz < (int64_t(1) << 17)) return row_bytes <= (esize == 2 ? 256 : 128);
  if ((large_with_reuse(f, 1.5) && row_bytes >= 256 && row_bytes <= 512) ||
      (large_with_reuse(f, 1.8) && row_bytes >= 128))
    return true;
  if (derived_features(f).mean_row_length >= 12.0)
    return f.nnz < (int64_t(1) << 20) ? row_bytes <= 256 : (esize == 2 && row_bytes <= 128);
  return false;
}

// Whether the attention backward prefers the fused tensor-core kernels to the composed one (a
// per-edge pass and three SpMMs), where both can run (16-bit, d = dv in {32, 64, 128}). Measured
// (H100, H=4, fp16, fwd+bwd, affinity order): d = 64, fused on all six graphs (0.55-0.98x the
// composed time); d = 128, fused where blocks are fuller (>= 10 nonzeros per block) on graphs of
// 2^18 nonzeros and more (DD 3402 against 4215 us, facebook 371 / 499, github 812 / 839), composed
// elsewhere (R-MAT 17/16 at 9.5 per block: 2596 against 2839; proteins 388 / 408).
inline bool attention_backward_prefers_fused(const PatternFeatures& f, int64_t d, int /*esize*/) {
  if (d <= 64 || f.nnz < kSmallGraphNnz) return true;
  return f.nnz >= (int64_t(1) << 18) && derived_features(f).nnz_per_block >= 10.0;
}

}  // namespace jaxsparse_tc
