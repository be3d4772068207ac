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

// The block-fill rule: the tensor-core window kernels where blocks hold more than a quarter of
// their 64 entries, the CUDA-core row kernels otherwise. The row kernels gather the same dense
// rows as the window kernels (one per condensed column) but pay only for the nonzeros, with many
// more warps per SM; the tensor-core kernels pay for all 64 entries of a block. The graphs
// measured all sit near fill 1/8 (Cora 0.124, R-MAT ~1/8), where the row kernels won on H100
// (fp16 d=128: SpMM rmat17 141 us against 166 for the tensor-core kernel, rmat20 643 against
// 773; SDDMM rmat17 123 against 137, rmat20 573 against 723).
inline bool blocks_fill_tensor_cores(const PatternFeatures& f) {
  return !(double(f.nnz) <= 0.25 * 64.0 * double(f.blocks));
}

// Whether the SpMM prefers the tensor-core window kernels to the CUDA-core row kernels.
// d: features of X; esize: bytes per element.
inline bool spmm_prefers_tensor_cores(const PatternFeatures& f, int64_t /*d*/, int /*esize*/) {
  return blocks_fill_tensor_cores(f);
}

// Whether the SDDMM prefers the tensor-core window kernels to the CUDA-core row kernels.
inline bool sddmm_prefers_tensor_cores(const PatternFeatures& f, int64_t /*d*/, int /*esize*/) {
  return blocks_fill_tensor_cores(f);
}

// Whether the attention backward prefers the fused tensor-core kernels to the composed one (a
// per-edge pass and three SpMMs), where both can run (16-bit, d = dv in {32, 64, 128}). At
// d = 128 on large graphs the composed backward measured faster (H100, H=4, fwd+bwd: rmat17 2759
// against 3383 us, rmat20 15888 against 19438 us).
inline bool attention_backward_prefers_fused(const PatternFeatures& f, int64_t d, int /*esize*/) {
  return d <= 64 || f.nnz < kSmallGraphNnz;
}

}  // namespace jaxsparse_tc
