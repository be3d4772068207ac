// The attention launch plans (docs/DESIGN.md, "Which kernel runs"): the forward's kernel and the
// workspaces of the forward and of the fused backward, from the shapes and the attributes
// `grouped` and `merge_split_windows`; and which backward runs (plan_attention_backward). Python's
// workspace sizes (attention_workspace_bytes, attention_grads_workspace_bytes) and the handlers'
// launches come from the same functions; Python asks plan_attention_backward at trace time
// (jaxsparse_tc/_src/attention.py `_backward`, through the CPU extension's
// attention_backward_plan), and both backward handlers check their operands with it.
//
// Forward: attn_fwd_tc for 16-bit operands with d = dv in {32, 64, 128}, attn_fwd_scalar
// otherwise (and attn_jvp_scalar for the jvp). Split windows (long windows cut into pieces) are
// merged inside a CTA where the schedule is grouped, through workspace slots otherwise; with
// merge_split_windows = 0 a split window is done whole by its first piece (as are windows past the
// workspace's cap).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ops.h"
#include "plan/common.h"
#include "plan/row_layout.h"
#include "plan/select.h"

namespace jaxsparse_tc {

// Cap on each kernel's split-window workspace (past it, windows are done whole by their first
// piece: correct, slower).
constexpr int64_t kAttentionSplitBytes = int64_t(128) << 20;

// Head dims (d = dv) of the tensor-core kernels, forward and fused backward; each is a template
// instance of their launches (attention/forward.cu, attention/backward_fused.cu). The CPU
// extension exports them (ATTENTION_TC_D).
inline constexpr int kAttentionTcD[] = {32, 64, 128};

// Whether the tensor-core kernels take these operands (16-bit, d = dv in kAttentionTcD).
inline bool attention_tc_shape(int esize, int64_t d, int64_t dv) {
  if (esize != 2 || d != dv) return false;
  for (const int tc_d : kAttentionTcD)
    if (d == tc_d) return true;
  return false;
}

// Whether the composed backward's kernel (attention/backward_composed.cu) takes rows of d and dv
// elements of esize bytes: a warp's 32 lanes load 16 bytes each of a row, so at most 512 bytes.
// Wider rows take the backward composed from SDDMMs.
inline bool attention_bwd_row_fits(int esize, int64_t d, int64_t dv) {
  return std::max(d, dv) * esize <= 32 * 16;
}

// The backward's plan: the fused tensor-core backward (attention_grads, backward_fused.cu) or the
// composed one (a per-edge pass, then three SpMMs), and the composed one's edge pass.
// attention_backward 0 (auto): fused where the tensor-core kernels take the operands
// (attention_tc_shape) and the selector prefers them (attention_backward_prefers_fused);
// 1 (fused): wherever those kernels take the operands; 2 (composed): never fused.
// The composed backward's edge pass is attention_bwd's row kernel (backward_composed.cu) where its
// rows fit (attention_bwd_row_fits), else two SDDMMs. Whether the platform has these kernels at
// all (the CPU has neither) is the caller's to know.
struct AttentionBwdShape {
  int esize;                // bytes per element of Q, K, V
  int64_t d, dv;            // head dims of Q and K, of V
  PatternFeatures pattern;  // A's (read under auto only)
};

struct AttentionBwdPlan {
  bool fused;        // the tensor-core backward; else the composed one
  bool edge_kernel;  // composed: the edge pass is attention_bwd's kernel; else two SDDMMs
};

// `choice`: the AttentionBackward code (common/ops.h); an unknown one is an InvalidArgument.
inline ffi::Error plan_attention_backward(const AttentionBwdShape& s, int64_t choice,
                                          AttentionBwdPlan& plan) {
  if (choice < 0 || choice >= code_count(kAttentionBackwardCodes))
    return ffi::Error::InvalidArgument(
        "attention backward: attention_backward must be 0 (auto), 1 (fused) or 2 (composed); "
        "got " +
        std::to_string(choice));
  const auto backward = static_cast<AttentionBackward>(choice);
  plan = AttentionBwdPlan{};
  plan.fused = attention_tc_shape(s.esize, s.d, s.dv) &&
               (backward == AttentionBackward::kFused ||
                (backward == AttentionBackward::kAuto &&
                 attention_backward_prefers_fused(s.pattern, s.d, s.esize)));
  plan.edge_kernel = !plan.fused && attention_bwd_row_fits(s.esize, s.d, s.dv);
  return ffi::Error::Success();
}

// The forward's plan: its kernel, and its workspace: per slot (the schedule's first `cap` items)
// and head, 8 rows of unnormalised O, then of (running max, sum), then a piece counter.
struct AttentionFwdPlan {
  bool tc;       // attn_fwd_tc (else attn_fwd_scalar)
  bool grouped;  // attn_fwd_tc: split windows merge inside CTAs (grouped schedule)
  int64_t cap;   // workspace slots (0: none)
  size_t o_bytes, done_offset, total_bytes;  // O, then (max, sum), then counters
};

inline AttentionFwdPlan plan_attention_fwd(int esize, int64_t d, int64_t dv, int64_t heads,
                                           int64_t num_items, bool grouped,
                                           bool merge_split_windows) {
  AttentionFwdPlan l{};
  l.tc = attention_tc_shape(esize, d, dv) && num_items > 0;
  const bool merge = l.tc && merge_split_windows;
  l.grouped = merge && grouped;
  const int64_t slot_bytes = heads * 8 * (dv + 2) * 4 + heads * 4;
  if (merge && !grouped && heads > 0)
    l.cap = std::min<int64_t>(num_items, kAttentionSplitBytes / slot_bytes);
  l.o_bytes = size_t(l.cap * heads * 8 * dv) * 4;
  l.done_offset = l.o_bytes + size_t(l.cap * heads * 8) * 8;
  l.total_bytes = l.done_offset + size_t(l.cap * heads) * 4;
  return l;
}

// The fused backward's workspace: the row stats [H, m] float2, then each kernel's split slots
// (A's: dQ, A^T's: dK and dV) and their counters, adjacent so that one memset zeroes both.
// Grouped schedules (and merge_split_windows = 0) have no slots: their split pieces merge in the
// CTA, or the first piece does the whole window.
struct AttentionGradsPlan {
  int64_t cap_a, cap_t;
  size_t ws_a, ws_t, done_a, done_t, total;  // byte offsets; the row stats at 0
  bool grouped_a, grouped_t;
};

inline AttentionGradsPlan plan_attention_grads(int64_t d, int64_t heads, int64_t m, int64_t items_a,
                                               int64_t items_t, bool grouped_a, bool grouped_t,
                                               bool merge_split_windows) {
  const bool merge = merge_split_windows;
  auto cap = [&](int64_t items, bool grouped, int na) -> int64_t {
    if (!merge || grouped) return 0;
    return std::min<int64_t>(items, kAttentionSplitBytes / (heads * (8 * na * d * 4 + 4)));
  };
  auto round16 = [](size_t x) { return (x + 15) / 16 * 16; };
  AttentionGradsPlan l{};
  l.grouped_a = merge && grouped_a;
  l.grouped_t = merge && grouped_t;
  l.cap_a = heads > 0 ? cap(items_a, grouped_a, 1) : 0;
  l.cap_t = heads > 0 ? cap(items_t, grouped_t, 2) : 0;
  l.ws_a = round16(size_t(heads * m) * 8);
  l.ws_t = l.ws_a + size_t(l.cap_a * heads * 8 * d) * 4;
  l.done_a = l.ws_t + size_t(l.cap_t * heads * 16 * d) * 4;
  l.done_t = l.done_a + size_t(l.cap_a * heads) * 4;
  l.total = l.done_t + size_t(l.cap_t * heads) * 4;
  return l;
}

// Whether the tensor-core kernels (forward and fused backward) load a block pair's columns one
// pair ahead, so that a pair waits on one round trip (its K and V rows) rather than two: where the
// pattern has kSmallGraphNnz condensed columns (K/V row gathers per head) or more; smaller
// patterns run slower with it (docs/DESIGN.md, Attention table).
inline bool attention_prefetch(int64_t num_cols) {
  return num_cols >= kSmallGraphNnz;
}

// Entries per batch of the composed backward's edge pass (attention_bwd_edges): large graphs take
// 2 (64 registers, 32 warps/SM), small ones 4 (their time is their longest chain of batches);
// docs/DESIGN.md, Attention table.
inline int attention_bwd_unroll(int64_t nnz) {
  return nnz < kSmallGraphNnz ? 4 : 2;
}

}  // namespace jaxsparse_tc
