// The SpMM launch plan (docs/DESIGN.md, "Which kernel runs"): from the shapes and the `kernel`
// attribute, the kernel family and the workspace it needs (plan_spmm); then, for the window
// family, the kernel that the device and X's alignment allow (spmm_launch). Python's workspace
// size (spmm_workspace_bytes) and the handler's launch both come from plan_spmm, which sizes the
// window family's workspace for each kernel spmm_launch may pick.
//
// | kernel attr      | rows: spmm_rows                         | windows (spmm_launch)          |
// |------------------|-----------------------------------------|--------------------------------|
// | 0 auto           | selector or exact fp32, if it fits      | otherwise                      |
// | 1 rows           | always (kResourceExhausted if no fit)   | never                          |
// | 2 windows        | never                                   | always                         |
//
// The selector (plan/select.h, spmm_prefers_tensor_cores) decides between the families under
// auto, from the pattern's features.
//
// Window family: spmm_async on sm_90 with 16-byte X rows (not exact fp32); spmm_f32_exact for
// exact fp32; spmm_tc otherwise (unaligned rows, e.g. fp16 d % 8 != 0; older GPUs).
#pragma once
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "common/format.h"
#include "plan/select.h"
#include "plan/common.h"
#include "plan/row_layout.h"

namespace jaxsparse_tc {

// The SpMM kernels (cuda/spmm/).
enum class SpmmKernel {
  kRows,       // spmm_rows (rows.cuh): CUDA cores on the row view, exact in float32
  kAsync,      // spmm_async (windows_async.cuh): tensor cores, a cp.async gather ring (sm_90)
  kRegisters,  // spmm_tc (windows_registers.cuh): tensor cores, register gathers
  kExactF32,   // spmm_f32_exact (exact_f32.cuh): CUDA cores on the window format
};

// A SpMM's shapes: all the plan reads.
struct SpmmShape {
  int esize;                               // bytes per element of X
  bool exact;                              // float32 with precision "highest"
  PatternFeatures pattern;                 // A's (rows = m)
  int64_t num_items, row_items, d, heads;  // window and row schedule items; X's features
};

// Caps on the workspace. Window kernels: the split windows' fp32 slots (windows past the cap are
// done whole by their first piece: correct, slower). Row kernels: the slots of rows cut into
// several CTA items (past it the plan does not take the row kernels).
constexpr int64_t kWindowWorkspaceBytes = int64_t(128) << 20;
constexpr int64_t kRowWorkspaceBytes = int64_t(256) << 20;

// Window kernels' workspace for `nslab` feature slabs: split windows' fp32 sums (cap slots),
// their block counters, and each window's slot.
struct WindowWorkspace {
  int64_t cap;
  size_t ws_bytes, done_bytes, slot_bytes;
  size_t total() const { return ws_bytes + done_bytes + slot_bytes; }
};

inline WindowWorkspace window_workspace(const SpmmShape& s, int nslab) {
  const int64_t per_slot = s.heads * kWindowRows * s.d * 4 + s.heads * nslab * 4;
  WindowWorkspace w{};
  w.cap = std::min<int64_t>(s.num_items, std::max<int64_t>(1, kWindowWorkspaceBytes / per_slot));
  w.ws_bytes = size_t(w.cap * s.heads * kWindowRows * s.d) * 4;
  w.done_bytes = size_t(w.cap * s.heads * nslab) * 4;
  w.slot_bytes = size_t(std::max<int64_t>(s.pattern.windows, 1)) * 4;
  return w;
}

// Slabs of the window kernels. spmm_tc: 16 * mt features (mt m16 tiles per warp).
inline int tc_mt(int64_t d) {
  return d <= 16 ? 1 : d <= 32 ? 2 : 4;
}
// spmm_async: the narrowest of 32, 64, 128 features covering d, at most 64 for fp32 (256-byte
// rows). 16-bit d > 64 takes one 128-feature slab rather than two of 64 that both decode the
// item's bitmaps, though two would double the warps per SM: one slab is the faster on every
// graph measured but facebook-page-page (docs/DESIGN.md, SpMM table).
inline int async_slab(int esize, int64_t d) {
  return d <= 32 ? 32 : d <= 64 || esize == 4 ? 64 : 128;
}
constexpr int kExactSlab = 128;  // spmm_f32_exact: 4 features per lane
inline int window_slab(const SpmmShape& s, bool async) {
  return s.exact ? kExactSlab : async ? async_slab(s.esize, s.d) : 16 * tc_mt(s.d);
}

struct SpmmPlan {
  bool rows;  // the row kernels; else the window family (spmm_launch picks the kernel)
  // Row kernels: lanes per group, feature slabs, slots of the rows cut into several CTA items,
  // and the slots' fp32 sums (the workspace's first part; their countdowns follow).
  int lanes, row_nslab;
  int64_t row_slots;
  size_t row_ws_bytes;
  int stream_max;          // single CTA items the whole-row streams walk (row_stream_max)
  size_t workspace_bytes;  // the workspace result's size
};

// The plan of a SpMM. The row kernels need a workspace only for rows cut into several CTA items
// (slots <= items - rows: every such row adds at least one item); the window family's is sized
// for either of its slab widths, since which kernel runs depends on the operands' alignment,
// known only at run time.
inline ffi::Error plan_spmm(const SpmmShape& s, int64_t kernel, SpmmPlan& plan) {
  KernelChoice choice;
  if (auto err = kernel_choice("spmm", kernel, choice); err.failure()) return err;
  plan = SpmmPlan{};
  plan.lanes = row_lanes(s.esize, s.d);
  const int64_t row_slab = int64_t(plan.lanes) * (16 / s.esize);
  plan.row_nslab = int((s.d + row_slab - 1) / row_slab);
  plan.row_slots = std::max<int64_t>(s.row_items - s.pattern.rows, 0);
  // 64 entries up to 2^20 nonzeros, where the CTA items' groups share them well
  // (docs/PERFORMANCE.md, "Row kernels: schedules and CTA items": github-musae).
  plan.stream_max = row_stream_max(s.pattern.nnz, int64_t(1) << 20);
  plan.row_ws_bytes = size_t(plan.row_slots * s.heads * s.d) * 4;
  const size_t row_bytes =
      plan.row_ws_bytes + size_t(plan.row_slots * s.heads * plan.row_nslab) * 4;
  const bool rows_fit =
      row_bytes <= size_t(kRowWorkspaceBytes) && s.d * int64_t(s.esize) <= INT32_MAX;
  if (choice == KernelChoice::kRows && !rows_fit)
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "spmm: the row kernels' workspace for very long rows would exceed its cap");
  // auto: the selector's family (plan/select.h), and the row kernels for exact fp32, which
  // they compute with one FMA per nonzero at many warps per SM, faster than the tf32 tensor-core
  // kernel (docs/DESIGN.md, SpMM table).
  plan.rows = rows_fit && (choice == KernelChoice::kRows ||
                           (choice == KernelChoice::kAuto &&
                            (s.exact || !spmm_prefers_tensor_cores(s.pattern, s.d, s.esize))));
  if (plan.rows) {
    plan.workspace_bytes = row_bytes;
  } else {
    auto nslab = [&](bool async) {
      const int64_t slab = window_slab(s, async);
      return int((s.d + slab - 1) / slab);
    };
    plan.workspace_bytes = std::max(window_workspace(s, nslab(false)).total(),
                                    window_workspace(s, nslab(true)).total());
  }
  return ffi::Error::Success();
}

// What the handler launches: the plan's family, refined for the window family by what only the
// launch knows (the device's architecture, the operands' alignment).
struct SpmmLaunch {
  SpmmKernel kernel;
  int slab;   // features per slab (row kernels: lanes x 16 bytes)
  int nslab;  // slabs covering d
  bool vec;   // rows may be accessed with the kernel's full-width vector loads and stores
  WindowWorkspace window;  // window kernels: the workspace's layout (within plan_spmm's size)
};

// sm90: the device is sm_90 or later. x_aligned16 / out_aligned16: X / out are 16-byte aligned.
inline SpmmLaunch spmm_launch(const SpmmShape& s, const SpmmPlan& plan, bool sm90, bool x_aligned16,
                              bool out_aligned16) {
  SpmmLaunch l{};
  const bool rows16 = (s.d * s.esize) % 16 == 0;
  if (plan.rows) {
    l.kernel = SpmmKernel::kRows;
    l.slab = plan.lanes * (16 / s.esize);
    l.nslab = plan.row_nslab;
    l.vec = rows16 && x_aligned16 && out_aligned16;
    return l;
  }
  // The pipelined kernel wherever its 16-byte copies apply: fewer instructions per gathered row
  // than register gathers, and faster (docs/DESIGN.md, SpMM table). Its shared-memory ring is
  // sized for sm_90; its epilogue stores 4 features at a time.
  const bool async = !s.exact && sm90 && rows16 && x_aligned16 && out_aligned16 &&
                     s.d * int64_t(s.esize) <= INT32_MAX;
  l.kernel = async ? SpmmKernel::kAsync : s.exact ? SpmmKernel::kExactF32 : SpmmKernel::kRegisters;
  l.slab = window_slab(s, async);
  l.nslab = int((s.d + l.slab - 1) / l.slab);
  // A thread's features (exact fp32: 4; register gathers: 2 * mt = slab / 8) in whole vectors.
  l.vec = out_aligned16 && s.d % (s.exact ? 4 : l.slab / 8) == 0;
  l.window = window_workspace(s, l.nslab);
  return l;
}

}  // namespace jaxsparse_tc
