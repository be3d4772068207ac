// SpMM kernels' parameters and the pieces the window kernels share: the unit of work a warp
// decodes from a schedule item, and the split-window epilogue.
//
// Split windows (schedule items with split=1): each piece adds its fp32 partial into a
// per-window workspace slot with atomics; the piece that completes the window's block count
// (a per-slot counter) converts the slot into the output. A prep kernel zeroes the slots first.
// Slot = index of the window's first piece in the schedule (split items are the schedule's
// prefix); windows whose slot would exceed the workspace cap fall back to their first piece
// computing the whole window alone (correct, slower).
#pragma once
#include <cstdint>

#include "common/format.h"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace spmm {

constexpr int kWarps = 4;  // warps per CTA

struct SpmmParams : KernelPattern {
  const void* values;
  const void* x;
  void* out;
  int64_t nnz, n, m, d;
  int64_t v_head_stride, x_head_stride;  // 0 where the operand broadcasts over heads
  int nslab, heads;
  int stream_max;  // row kernels: single CTA items the streams walk (row_stream_max)
  bool vec;        // rows may be accessed with full-width vector loads/stores
  float* ws;       // [cap, heads, 8, d] fp32 partial sums of split windows
  int* done;       // [cap, heads, nslab] blocks accumulated so far
  int* slot_of;    // [W] workspace slot of each split window (-1: no slot)
  int64_t cap;
};

// The first block of schedule item `it`'s window that the kernels see (decode_unit), and whether
// the item starts there (its window's first piece).
__device__ __forceinline__ bool first_piece(const SpmmParams& p, int4 it, int& w) {
  w = clamp_last(it.x, p.last_window);
  const WindowSpan span = window_span(p, w);
  return clamp_to(it.y, span.wb, span.wend) == span.wb;
}

// Zeroes the workspace slot and counters of each split window and records its slot.
__global__ void split_prep(SpmmParams p) {
  const int64_t slot_floats = int64_t(p.heads) * 8 * p.d;
  for (int64_t s = blockIdx.x; s < p.num_items; s += gridDim.x) {
    const int4 it = p.sched[2 * s];
    if (!it.w) return;  // split items are the schedule's prefix
    int w;
    if (!first_piece(p, it, w)) continue;
    const int64_t slot = s < p.cap ? s : -1;
    if (threadIdx.x == 0) p.slot_of[w] = int(slot);
    if (slot < 0) continue;
    float* ws = p.ws + slot * slot_floats;
    for (int64_t i = threadIdx.x; i < slot_floats; i += blockDim.x) ws[i] = 0.f;
    int* done = p.done + slot * p.heads * p.nslab;
    for (int64_t i = threadIdx.x; i < int64_t(p.heads) * p.nslab; i += blockDim.x) done[i] = 0;
  }
}

// Split-window election, called by the whole warp after it added its partials to the slot:
// counts the piece's blocks and tells whether this piece completed the window (it then converts
// the slot into the output; the fences order the partials before the count and the reads after).
__device__ __forceinline__ bool last_piece(const SpmmParams& p, int slot, int h, int slab,
                                           int nblocks, int window_blocks) {
  __threadfence();
  __syncwarp();
  int old = 0;
  if ((threadIdx.x & 31) == 0)
    old = atomicAdd(p.done + (int64_t(slot) * p.heads + h) * p.nslab + slab, nblocks);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old + nblocks != window_blocks) return false;
  __threadfence();
  return true;
}

// Writes a thread's results: R window rows (rows[r] in 0..7) x E consecutive features at f.
// Non-split items store directly; split pieces accumulate into the workspace and the last one
// converts the window's slot.
template <class T, int R, int E>
__device__ __forceinline__ void finish(const SpmmParams& p, int h, int w, int slab, int64_t f,
                                       const int (&rows)[R], float (&v)[R][E], int slot,
                                       int nblocks, int window_blocks) {
  T* out = static_cast<T*>(p.out) + int64_t(h) * p.m * p.d;
  if (slot < 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = int64_t(w) * kWindowRows + rows[r];
      if (row < p.m && f < p.d) store_row<T, E>(out + row * p.d, f, p.d, p.vec, v[r]);
    }
    return;
  }
  float* ws = p.ws + (int64_t(slot) * p.heads + h) * kWindowRows * p.d;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (f + e < p.d) atomicAdd(ws + rows[r] * p.d + f + e, v[r][e]);
  if (!last_piece(p, slot, h, slab, nblocks, window_blocks)) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = int64_t(w) * kWindowRows + rows[r];
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) s[e] = f + e < p.d ? __ldcg(ws + rows[r] * p.d + f + e) : 0.f;
    if (row < p.m && f < p.d) store_row<T, E>(out + row * p.d, f, p.d, p.vec, s);
  }
}

// A unit of work: schedule item (window w, blocks [b0, b1)) for head h and feature slab; its
// split-window slot (-1: stores directly); the window's blocks [wb, wend) and its condensed
// columns wc[cb .. cb + ncols).
struct Unit {
  int w, b0, b1, h, slab, slot, wb, wend, cb, ncols;
};

// Decodes schedule item `item`, its fields folded into the arrays (window_span; blocks into the
// window's). False where the unit has nothing to do: a split piece whose window got no workspace
// slot (the window's first piece then does the whole window). A split window's slot comes from
// slot_of, which split_prep writes only for windows it saw start: one outside [0, cap) (a
// corrupt pattern's) counts as none.
__device__ __forceinline__ bool decode_unit(const SpmmParams& p, int64_t item, int h, int slab,
                                            Unit& u) {
  const int4 s = p.sched[2 * item];
  u.w = clamp_last(s.x, p.last_window);
  const WindowSpan span = window_span(p, u.w);
  u.wb = span.wb;
  u.wend = span.wend;
  u.cb = span.cb;
  u.ncols = span.ncols;
  u.b0 = clamp_to(s.y, u.wb, u.wend);
  u.b1 = clamp_to(s.z, u.b0, u.wend);
  u.h = h;
  u.slab = slab;
  u.slot = -1;
  if (s.w) {
    const int slot = p.slot_of[u.w];
    u.slot = slot >= 0 && slot < p.cap ? slot : -1;
    if (u.slot < 0) {
      if (u.b0 != u.wb) return false;
      u.b1 = u.wend;
    }
  }
  return true;
}

// The unit of a warp of a one-warp-per-(item, slab) launch (heads loop in the kernel: h = 0).
__device__ __forceinline__ bool warp_item(const SpmmParams& p, int warps_per_cta, Unit& u) {
  const int64_t gw = int64_t(blockIdx.x) * warps_per_cta + (threadIdx.x >> 5);
  if (gw >= p.num_items * p.nslab) return false;
  return decode_unit(p, gw / p.nslab, 0, int(gw % p.nslab), u);
}

}  // namespace spmm
}  // namespace jaxsparse_tc
