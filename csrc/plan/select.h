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

// From this reuse on (block-dense patterns: a full 8x8 block's gathered rows serve 8 nonzeros
// each) tensor cores on any graph size. No grid graph reaches it (the densest, 4.6); on the small
// dense-community graphs at reuse 4.4 the row kernels still won SpMM, so the threshold sits above
// the measured range, from the cost model.
constexpr double kBlockDenseReuse = 6.0;

// Graphs of 2^20 nonzeros and more: the SDDMM's float32 tensor cores from reuse 3 (below it
// the row kernels won float32 on dense500k-imdb at reuse 3.2-4.1).
constexpr int64_t kLargeGraphNnz = int64_t(1) << 20;

// Graphs of 2^18 nonzeros and more: the SpMM's tensor cores from reuse 3 (dense500k-imdb, 500k
// nonzeros, at reuse 3.2 in its own order and 4.1 in affinity order). Below it the window
// kernels lost SpMM at reuse 3-4.4 on the 200k-edge imdb graphs (but for imdb-multi's 256- and
// 512-byte rows in its own order): ~50-70 blocks per SM, too few to hide a window's chain of
// dependent loads.
constexpr int64_t kSpmmWindowNnz = int64_t(1) << 18;

// The rules below are fit on the H200 grid of docs/DESIGN.md, "The kernel selector" (both kernel
// families forced on each configuration; the commands, the hit rates and the misses are there).

// SpMM: the row kernels walk rows in row order where windows reuse their columns
// (pattern.row_order), so that neighbouring rows share X rows in L1 and L2, and are faster than
// the tensor-core kernel (or within 6%) on every suite graph up to reuse 2.3 (DD in affinity
// order), at every width and dtype. Tensor cores from kSpmmWindowNnz nonzeros from reuse 3 for
// 16-bit rows of 128 bytes and more (from 4 for narrower ones), from 3.5 in float32 (tf32); on
// any graph from kBlockDenseReuse.
inline bool spmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  const double reuse = row_reuse(f);
  if (reuse >= kBlockDenseReuse) return true;
  if (f.nnz < kSpmmWindowNnz) return false;
  if (esize == 2) return reuse >= 4.0 || (reuse >= 3.0 && d * esize >= 128);
  return reuse >= 3.5;
}

// SDDMM: the row kernel (a lane group per row, dot products of d features) is slow on narrow
// rows, the tensor-core one on wide rows of unstructured graphs and in float32. Tensor cores:
// - 16-bit from reuse 2.5 on any graph (and from kBlockDenseReuse);
// - float32 rows of up to 512 bytes on large graphs from reuse 3 (and from kBlockDenseReuse);
// - on small graphs (< 2^17 nonzeros, whose row kernel gives each lane group one row:
//   plan/sddmm.h) for rows of up to 64 bytes;
// - 16-bit rows of 256 bytes and more from reuse 2 on graphs of 2^19 nonzeros and more;
// - on long rows (>= 12 per row) below 2^22 nonzeros: rows of up to 64 bytes, and from reuse
//   1.8 16-bit rows and float32 rows of up to 128 bytes;
// - otherwise the row kernels.
inline bool sddmm_prefers_tensor_cores(const PatternFeatures& f, int64_t d, int esize) {
  const int64_t row_bytes = d * esize;
  const double reuse = row_reuse(f);
  if (esize == 2 && reuse >= 2.5) return true;
  if (reuse >= kBlockDenseReuse || (f.nnz >= kLargeGraphNnz && reuse >= 3.0))
    return esize == 2 || row_bytes <= 512;
  if (f.nnz < (int64_t(1) << 17)) return row_bytes <= 64;
  if (esize == 2 && f.nnz >= (int64_t(1) << 19) && reuse >= 2.0 && row_bytes >= 256) return true;
  if (derived_features(f).mean_row_length >= 12.0 && f.nnz < (int64_t(1) << 22))
    return row_bytes <= 64 || (reuse >= 1.8 && (esize == 2 || row_bytes <= 128));
  return false;
}

// Whether the attention backward prefers the fused tensor-core kernels to the composed one (a
// per-edge pass and three SpMMs), where both can run (16-bit, d = dv in {32, 64, 128}): fused at
// d <= 64 and on graphs under kSmallGraphNnz nonzeros; at d = 128 fused where blocks are full
// enough (>= 14.5 nonzeros per block: the dense communities at any size, facebook in affinity
// order at 15.0), composed on sparser blocks (proteins in affinity order at 14.1, the R-MAT
// graphs, pubmed, github). The misses (H200 grid): DD at d = 32, composed 1.11-1.18x faster, and
// proteins in the caller's order at d = 32 (1.08x); DD is the suite's only large graph of rows
// this short (5 per row), so no clause was added for it.
inline bool attention_backward_prefers_fused(const PatternFeatures& f, int64_t d, int /*esize*/) {
  if (d <= 64 || f.nnz < kSmallGraphNnz) return true;
  return derived_features(f).nnz_per_block >= 14.5;
}

}  // namespace jaxsparse_tc
