// Device pieces shared by the tensor-core attention kernels (forward_tc.cuh: the forward,
// backward_tc.cuh: the backward). Their common tile (forward_tc.cuh's header comment): one warp
// owns one (window, head), the window's 8 rows are the MMA's n=8 side, and a pair of 8x8 blocks
// (16 condensed columns) is the m=16 side. In the "row layout" thread (g, t) holds
// features [t*D/4, (t+1)*D/4) of one row: the window's row g (B operand), or the gathered rows
// of condensed columns g and g+8 (A operand of an SDDMM over the features).
#pragma once
#include <cstdint>

#include "common/format.h"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace attention {

constexpr int kAttnWarps = 4;  // warps per CTA (a grouped schedule's group of items)
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kAttnWarps == kGroupItems, "a CTA holds one group of a grouped schedule");

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return raw16(from_f32<T>(lo)) | (raw16(from_f32<T>(hi)) << 16);
}

// Work items per head of a launch: a grouped schedule's are padded to whole groups, so that the
// warps of a CTA take one aligned group of one head's items.
__host__ __device__ __forceinline__ int64_t items_per_head(int64_t num_items, bool grouped) {
  return grouped ? (num_items + kGroupItems - 1) / kGroupItems * kGroupItems : num_items;
}

// The (item, head) of a launch's warp `unit`, head-major: the GPU works through one head's
// windows at a time, so the K and V rows it gathers are one head's (a quarter of the bytes at
// H = 4), which keeps hub rows in L2 (measured on H100, forward d=128: rmat17 836 us against 927
// with a window's heads adjacent, rmat20 4346 against 4816); a grouped schedule's CTA is then one
// head's group of items. False past the launch's items (a grouped schedule pads each head's items
// to whole groups).
__device__ __forceinline__ bool unit_item(int64_t unit, int64_t num_items, int64_t heads,
                                          bool grouped, int64_t& item, int64_t& h) {
  const int64_t per_head = items_per_head(num_items, grouped);
  if (unit >= per_head * heads) return false;
  item = unit % per_head;
  h = unit / per_head;
  return item < num_items;
}

// A schedule item as the attention kernels read it (docs/FORMAT.md): window w, blocks
// [b_first, b_end), condensed columns from c_first (the window's end column c_end). A split
// window's piece p is item first + p of `pieces`; first < 0 where the warp covers its whole
// window. `local`: the pieces are warps of this CTA (grouped schedule, merged in shared memory).
struct AttnItem {
  int w, b_first, b_end, c_first, c_end, first, pieces;  // int: fewer registers across the loop
  bool local;
};

// Reads item `item` of `num_items`, its fields folded into the pattern's bounds (bounds.cuh):
// blocks into [0, B], columns into [0, C], so a pair's blocks and columns (c_first + 8 (b -
// b_first) + j, below c_end) stay inside the arrays (no window pointer is loaded for that: the
// item's fields are what the first gathers wait on). Split pieces that can be merged neither in
// the CTA nor in one of the `cap` workspace slots fall back to their first piece doing the whole
// window; the others then have nothing to do (returns false).
// A merge needs its pieces to agree, whatever the schedule holds: a workspace merge takes slots
// [first, first + pieces), which must hold this item and fit the cap; a CTA merge (named barrier
// of `pieces` warps, led by the first piece's) needs every piece's item to be a split item that
// names the same first and pieces, inside this CTA's group and the schedule. Each piece checks
// all of them, so the pieces of a group reach the same verdict and no barrier waits for a warp
// that does not come. A grouped schedule's warp loads its whole group (kGroupItems items of 8
// words, a word per lane) in one load, so the check costs no second round trip. The calling warp
// must be converged (its early exits are per warp).
__device__ __forceinline__ bool read_item(const int4* sched, const int32_t* wbp, int64_t item,
                                          int64_t num_items, bool grouped, int64_t cap,
                                          const PatternBounds& pb, AttnItem& it) {
  static_assert(kGroupItems * 8 == 32, "a group's items are one word per lane");
  int4 s0, s1;
  bool agree = false;  // grouped: the items the pieces name agree with this one
  if (grouped) {
    const int lane = int(threadIdx.x) & 31;
    const int64_t group = item / kGroupItems * kGroupItems, word = group * 8 + lane;
    const int v = word < num_items * 8 ? reinterpret_cast<const int32_t*>(sched)[word] : 0;
    const int own = int(item - group) * 8;
    s0 = make_int4(__shfl_sync(~0u, v, own), __shfl_sync(~0u, v, own + 1),
                   __shfl_sync(~0u, v, own + 2), __shfl_sync(~0u, v, own + 3));
    s1 = make_int4(__shfl_sync(~0u, v, own + 4), __shfl_sync(~0u, v, own + 5),
                   __shfl_sync(~0u, v, own + 6), __shfl_sync(~0u, v, own + 7));
    // lane 8j + f holds word f of the group's item j: split flag (3), first (6), pieces (7)
    const int64_t j = group + lane / 8;
    const int f = lane % 8;
    const bool named = j >= s1.z && j < int64_t(s1.z) + s1.w;
    const bool ok = !named || (f == 3 ? v != 0 : f == 6 ? v == s1.z : f == 7 ? v == s1.w : true);
    agree = __all_sync(~0u, ok);
  } else {
    s0 = sched[2 * item];
    s1 = sched[2 * item + 1];
  }
  const int b_first = clamp_to(s0.y, 0, pb.num_blocks), c_first = clamp_to(s1.x, 0, pb.num_cols);
  it = {clamp_last(s0.x, pb.last_window),
        b_first,
        clamp_to(s0.z, b_first, pb.num_blocks),
        c_first,
        clamp_to(s1.y, c_first, pb.num_cols),
        -1,
        1,
        false};
  if (s0.w) {
    const int64_t first = s1.z, pieces = s1.w;  // 64-bit sums: any int32 fields
    const bool holds = first >= 0 && first <= item && item < first + pieces;
    it.first = s1.z;
    it.pieces = s1.w;
    it.local = agree && holds && pieces <= kGroupItems &&
               first % kGroupItems + pieces <= kGroupItems && first + pieces <= num_items;
    if (!it.local && (!holds || first + pieces > cap)) {
      if (item != first) return false;
      it.first = -1;
      it.b_end = clamp_to(wbp[it.w + 1], b_first, pb.num_blocks);
    }
  }
  // At most a block per 8 of the columns left to the window's end (a valid item has no more), so
  // that a corrupt block end walks no further than its window's columns; none where there are no
  // rows to gather.
  const int blocks = (it.c_end - it.c_first + kBlockCols - 1) / kBlockCols;
  it.b_end = it.b_first + min(it.b_end - it.b_first, blocks);
  if (pb.last_col < 0) it.b_end = it.b_first;
  return true;
}

// The bitmaps of blocks b0, b0 + 1 and the condensed columns g and g+8 of the pair (row layout
// gathers; -1 past the window's end). The columns are kept as loaded and folded into the gathered
// table where they are used (gathered_row_words): a fold here runs right after the load and makes
// the next pair's prefetch wait for it (22% of the forward's stall samples on H100, R-MAT 2^20).
// (Repeating the window's last column past the end instead, which spares the zero rows' register
// clears, made R-MAT's forward 9% slower on H100.)
struct PairRows {
  uint64_t bits0, bits1;
  int32_t col[2];
};

__device__ __forceinline__ PairRows pair_rows(const uint32_t* bitmap, const int32_t* wc,
                                              const AttnItem& it, int64_t b0, int g) {
  PairRows pr;
  pr.bits0 = load_block_bits(bitmap, b0);
  pr.bits1 = b0 + 1 < it.b_end ? load_block_bits(bitmap, b0 + 1) : 0ull;
  const int64_t cbase = it.c_first + 8 * (b0 - it.b_first);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t c = cbase + 8 * i + g;
    pr.col[i] = c < it.c_end ? wc[c] : -1;
  }
  return pr;
}

// Whether a pair's tile element e is a nonzero (C layout: column g + 8 (e / 2), row 2t + e % 2).
__device__ __forceinline__ bool tile_bit(const PairRows& pr, int g, int t, int e) {
  return ((e < 2 ? pr.bits0 : pr.bits1) >> (g * 8 + 2 * t + (e & 1))) & 1ull;
}

// A nonzero's index in the orientation's value order, folded into [0, last_value] (bias and dbias
// only: the mask needs none of this load).
__device__ __forceinline__ int64_t tile_value(const PairRows& pr, const int32_t* bvp, int64_t b0,
                                              int g, int t, int e, int last_value) {
  const uint64_t bits = e < 2 ? pr.bits0 : pr.bits1;
  const int kb = g * 8 + 2 * t + (e & 1);
  return clamp_sum(bvp[e < 2 ? b0 : b0 + 1], __popcll(bits & ((1ull << kb) - 1ull)), last_value);
}

// Row-layout words (D/8 per thread: features t*D/4 ..) of row `row` of `base`, zeros for row < 0.
template <class T, int D>
__device__ __forceinline__ void row_words(const T* base, int64_t row, int t, uint32_t (&w)[D / 8]) {
  if (row >= 0) {
    load_row<T, D / 4>(base + row * D, int64_t(t) * (D / 4), D, true, w);
  } else {
#pragma unroll
    for (int x = 0; x < D / 8; ++x) w[x] = 0u;
  }
}

// row_words of a column read from the pattern (PairRows::col): folded into [0, last_col] here,
// where it is used; zeros for col < 0 (past the window's end, or a corrupt entry).
template <class T, int D>
__device__ __forceinline__ void gathered_row_words(const T* base, int col, int last_col, int t,
                                                   uint32_t (&w)[D / 8]) {
  row_words<T, D>(base, col >= 0 ? clamp_last(col, last_col) : -1, t, w);
}

// C[16 cols x 8 rows] = A_rows[16 x D] B^T[D x 8], both in the row layout: a0/a1 the gathered
// rows of columns g and g+8, b the window's row g, whose word pair s (k-step s) b(s) returns.
// C: (col g, rows 2t, 2t+1), (col g+8, ...).
template <class T, int D, class RowPairs>
__device__ __forceinline__ void tile_dots_of(float (&c)[4], const uint32_t (&a0)[D / 8],
                                             const uint32_t (&a1)[D / 8], RowPairs b) {
  c[0] = c[1] = c[2] = c[3] = 0.f;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const uint32_t a[4] = {a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1]};
    const uint2 w = b(s);
    const uint32_t bb[2] = {w.x, w.y};
    mma_16816(c, a, bb, T{});
  }
}

// b in registers (the row layout's words).
template <class T, int D>
__device__ __forceinline__ void tile_dots(float (&c)[4], const uint32_t (&a0)[D / 8],
                                          const uint32_t (&a1)[D / 8], const uint32_t (&b)[D / 8]) {
  tile_dots_of<T, D>(c, a0, a1, [&](int s) { return make_uint2(b[2 * s], b[2 * s + 1]); });
}

// b's word pairs in shared memory (pair s of lane l at b[s * 32 + l]).
template <class T, int D>
__device__ __forceinline__ void tile_dots(float (&c)[4], const uint32_t (&a0)[D / 8],
                                          const uint32_t (&a1)[D / 8], const uint2* b, int lane) {
  tile_dots_of<T, D>(c, a0, a1, [=](int s) { return b[s * 32 + lane]; });
}

// The window's barrier of a grouped schedule: named barrier 1 + the warp of the window's first
// piece (a CTA may hold two windows); `wait`: the first piece's sync, else the others' arrive.
__device__ __forceinline__ void window_barrier(int lead, int threads, bool wait) {
  switch (lead) {
    case 0: wait ? barrier_sync<1>(threads) : barrier_arrive<1>(threads); break;
    case 1: wait ? barrier_sync<2>(threads) : barrier_arrive<2>(threads); break;
    case 2: wait ? barrier_sync<3>(threads) : barrier_arrive<3>(threads); break;
    default: wait ? barrier_sync<4>(threads) : barrier_arrive<4>(threads); break;
  }
}

}  // namespace attention
}  // namespace jaxsparse_tc
