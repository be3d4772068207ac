// The SDDMM launch plan (docs/DESIGN.md, "Which kernel runs"): from the shapes and the `kernel`
// attribute, the kernel and its launch shape. The SDDMM has no workspace.
//
// | kernel attr   | rows: sddmm_rows (d * itemsize <= 1 KB)   | windows                          |
// |---------------|-------------------------------------------|----------------------------------|
// | 0 auto        | selector or exact fp32, where d fits      | otherwise                        |
// | 1 rows        | always (InvalidArgument past 1 KB)        | never                            |
// | 2 windows   | never                                     | always: sddmm_f32_exact for      |
// |               |                                           | exact fp32, sddmm_tc otherwise   |
//
// The selector (plan/select.h, sddmm_prefers_tensor_cores) decides between the families under
// auto, from the pattern's features.
#pragma once
#include <cstdint>

#include "plan/select.h"
#include "plan/common.h"
#include "plan/row_layout.h"

namespace jaxsparse_tc {

// The SDDMM kernels (cuda/sddmm/).
enum class SddmmKernel {
  kRows,         // sddmm_rows (rows.cuh): CUDA cores on the row view, exact in float32
  kTensorCores,  // sddmm_tc (windows.cuh): tensor cores on the windows
  kExactF32,     // sddmm_f32_exact (exact_f32.cuh): CUDA cores on the windows
};

// An SDDMM's shapes: all the plan reads.
struct SddmmShape {
  int esize;                // bytes per element of X and Y
  bool exact;               // float32 with precision "highest"
  PatternFeatures pattern;  // the sampled pattern's (rows = m)
  int64_t num_items, heads, d;
};

struct SddmmPlan {
  SddmmKernel kernel;
  // Row kernels: lanes per group and slabs of lanes x 16 bytes (1 or 2) holding a row of X.
  int lanes, slabs;
  // Graphs under kSddmmStreamNnz nonzeros, whose time is their longest chain: one whole row per
  // lane group, no register cap. Larger graphs: `stream` whole rows per group (4, strided over
  // the schedule) as one stream of batches (docs/DESIGN.md, SDDMM table).
  bool small;
  int stream;
  int min_share;   // fewest entries of a CTA item one group takes (row_layout.h)
  int stream_max;  // single CTA items the streams walk like whole rows (row_stream_max)
  // sddmm_tc: warps per schedule item, each taking an equal, even share of its blocks. A launch
  // of under 16384 items x heads has too few warps to fill the device, and its longest item is
  // its time: 8 warps per item (docs/DESIGN.md, SDDMM table: Cora).
  int sub;
};

// Graphs under this many nonzeros take one whole row per lane group: streams of 4 rows per group
// leave most of the GPU's groups idle where rows are few, and from 2^17 nonzeros the streams are
// the faster at d = 128 (docs/PERFORMANCE.md, "Row kernels: schedules and CTA items": pubmed,
// proteins).
constexpr int64_t kSddmmStreamNnz = int64_t(1) << 17;

// The row kernels hold at most two slabs of 32 lanes x 16 bytes of X per lane.
constexpr int64_t kSddmmRowBytes = 32 * 16 * 2;

inline ffi::Error plan_sddmm(const SddmmShape& s, int64_t kernel, SddmmPlan& plan) {
  KernelChoice choice;
  if (auto err = kernel_choice("sddmm", kernel, choice); err.failure()) return err;
  plan = SddmmPlan{};
  const bool rows_fit = s.d * s.esize <= kSddmmRowBytes;
  if (choice == KernelChoice::kRows && !rows_fit)
    return ffi::Error::InvalidArgument(
        "sddmm: d * itemsize is past the row kernels' width (1024 bytes)");
  // auto: the selector's family (plan/select.h), and the row kernels for exact fp32.
  const bool rows =
      rows_fit && (choice == KernelChoice::kRows ||
                   (choice == KernelChoice::kAuto &&
                    (s.exact || !sddmm_prefers_tensor_cores(s.pattern, s.d, s.esize))));
  if (rows) {
    plan.kernel = SddmmKernel::kRows;
    const bool two = s.d > 32 * (16 / s.esize);
    plan.lanes = two ? 32 : row_lanes(s.esize, s.d);
    plan.slabs = two ? 2 : 1;
    plan.small = s.pattern.nnz < kSddmmStreamNnz;
    plan.stream = plan.small ? 0 : 4;
    plan.min_share = cta_min_share(s.pattern.nnz);
    // 128 entries from 2^19 nonzeros: a CTA walks an item of 65-128 entries with 2-4 of its
    // groups (docs/PERFORMANCE.md, "Row kernels: schedules and CTA items": github-musae).
    plan.stream_max = row_stream_max(s.pattern.nnz, int64_t(1) << 19);  // 0 where small
  } else if (s.exact) {
    plan.kernel = SddmmKernel::kExactF32;
  } else {
    plan.kernel = SddmmKernel::kTensorCores;
    plan.sub = s.num_items * s.heads < 16384 ? 8 : 1;
  }
  return ffi::Error::Success();
}

// Whether the kernel may load a thread's features as whole vectors: the row kernels' 16-byte
// rows (d * itemsize a multiple of 16, X and Y aligned), sddmm_tc's 8 features per thread,
// sddmm_f32_exact's 4.
inline bool sddmm_vec(const SddmmShape& s, const SddmmPlan& plan, bool x_aligned16,
                      bool y_aligned16) {
  switch (plan.kernel) {
    case SddmmKernel::kRows: return (s.d * s.esize) % 16 == 0 && x_aligned16 && y_aligned16;
    case SddmmKernel::kExactF32: return s.d % 4 == 0;
    default: return s.d % 8 == 0;
  }
}

}  // namespace jaxsparse_tc
