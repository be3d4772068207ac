// CUDA-core SDDMM on the row view (sddmm_rows, row_view.cuh): the kernel for sparse blocks and
// exact float32, where d * itemsize <= 1 KB.
#pragma once
#include <algorithm>
#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/row_view.cuh"
#include "cuda/sddmm/params.cuh"

namespace jaxsparse_tc {
namespace sddmm {

// A group of L lanes takes a work item's entries (values belong to single entries, so the
// groups sharing a CTA item need no combining) and holds the row's X features in registers (NS
// slabs of L*E, E = 16 bytes of T per lane). Per batch of U entries each lane issues U gathers
// of Y, forms U partial dot products, and reduce_many sums them over the group with ~1 shuffle
// per entry; lane li then writes entry li / (L / U)'s value. fp32 is computed exactly (no tf32).
// The whole warp runs each loop to its longest group's count, so every shuffle takes the full
// mask: with a group's mask, each shuffle cost five more instructions of convergence checks.
// Gathers are predicated loads.

// dot[u] = <x, y_u> over the lane's NS slabs of E features (fp32 FMAs, slab by slab): the
// batch's dot products of both row paths (row_dots, row_stream).
template <class T, int E, int U, int NS>
__device__ __forceinline__ void batch_dots(const float (&xf)[NS][E],
                                           const uint32_t (&yw)[U][NS][Words<T, E>::N],
                                           float (&dot)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    dot[u] = 0.f;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      float y[E];
      unpack_words<T, E>(yw[u][s], y);
#pragma unroll
      for (int k = 0; k < E; ++k) dot[u] = fmaf(xf[s][k], y[k], dot[u]);
    }
  }
}

// Values of entries [b, e) of row `row` (bounds uniform over the group; every lane of the warp
// calls it together, empty ranges included), U * NS gathers per lane per batch.
template <class T, class O, int L, int NS, int U, bool VEC>
__device__ __forceinline__ void row_dots(const SddmmParams& p, const RowView& rv, int h, int row,
                                         int b, int e, int li) {
  constexpr int E = kRowVec<T>, NW = Words<T, E>::N;
  const T* yh = static_cast<const T*>(p.y) + h * p.y_head_stride;
  O* oh = static_cast<O*>(p.out) + int64_t(h) * p.nnz;
  float xf[NS][E];
  LaneRows<T, E, VEC> y[NS];  // the lane's slice of Y, per slab
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t f = (int64_t(s) * L + li) * E;
    y[s] = LaneRows<T, E, VEC>(yh, f, p.d);
    uint32_t xw[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) xw[i] = 0u;
    if (y[s].active && b < e)
      load_row<T, E>(static_cast<const T*>(p.x) + h * p.x_head_stride + int64_t(row) * p.d, f, p.d,
                     VEC, xw);
    unpack_words<T, E>(xw, xf[s]);
  }

  const int n = e - b, nmax = __reduce_max_sync(kFullWarp, n);
  for (int kc = 0; kc < nmax; kc += L) {
    const int cnt = min(L, n - kc);  // this group's entries in the chunk (may be <= 0)
    const int2 en = clamp_entry(rv, ldg8_if(li < cnt, rv.entries + b + kc + li));
    for (int j = 0; j < min(L, nmax - kc); j += U) {
      uint32_t yw[U][NS][NW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = __shfl_sync(kFullWarp, en.x, j + u, L);
        const bool ok = j + u < cnt;
#pragma unroll
        for (int s = 0; s < NS; ++s) y[s].gather(ok && y[s].active, c, yw[u][s]);
      }
      float dot[U];
      batch_dots<T, E, U, NS>(xf, yw, dot);
      const float v = reduce_many<L, U>(dot, kFullWarp, li);
      const int mine = j + li / (L / U);
      const int pos = __shfl_sync(kFullWarp, en.y, mine, L);
      if (li % (L / U) == 0 && mine < cnt) oh[pos] = from_f32<O>(v);
    }
  }
}

// Whole rows of a large graph as one stream per group: the group walks items first,
// first + stride, ... (below last), one batch of U entries per step. While a batch's gathers are in
// flight it loads the next batch's entries (of the same row, or the first of the next item, whose
// schedule entry was loaded when the current item began), and the next row's X slice is
// requested once the row's last batch is summed, so it travels with that row's first gathers.
// A batch thus waits on its own gathers alone, where one row per group waited on the schedule,
// then on the entries and X, then on the gathers (three round trips for rmat20's ~8 entries).
// Empty rows come last (pattern.row_schedule), so a group stops at its first empty item. The
// loop runs while any group of the warp has work, so reduce_many's shuffles take the full mask.
template <class T, class O, int L, int NS, int U, bool VEC>
__device__ __forceinline__ void row_stream(const SddmmParams& p, const RowView& rv, int h, int item,
                                           int items, int stride, int li) {
  constexpr int E = kRowVec<T>, NW = Words<T, E>::N, G = L / U;  // G: lanes per summed entry
  O* oh = static_cast<O*>(p.out) + int64_t(h) * p.nnz;
  LaneRows<T, E, VEC> x[NS], y[NS];  // the lane's slice of X and of Y, per slab
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t f = (int64_t(s) * L + li) * E;
    x[s] = LaneRows<T, E, VEC>(static_cast<const T*>(p.x) + h * p.x_head_stride, f, p.d);
    y[s] = LaneRows<T, E, VEC>(static_cast<const T*>(p.y) + h * p.y_head_stride, f, p.d);
  }
  int4 it = item < items ? row_item(rv, item) : make_int4(0, 0, 0, kWholeRowSlot);
  while (item < items &&
         !streamed(it.w, it.z - it.y, p.stream_max)) {  // skip the CTA items the CTAs walk
    item += stride;
    if (item < items) it = row_item(rv, item);
  }
  bool live = item < items && it.y < it.z;
  int row = it.x, k = it.y, end = it.z;
  int4 next = live && item + stride < items ? row_item(rv, item + stride) : make_int4(0, 0, 0, 0);
  uint32_t xw[NS][NW];
#pragma unroll
  for (int s = 0; s < NS; ++s) x[s].gather(live && x[s].active, row, xw[s]);
  int2 en[U];
  int n = load_entries<U>(rv, k, live ? end : k, en);
  while (__any_sync(kFullWarp, live)) {
    uint32_t yw[U][NS][NW];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int s = 0; s < NS; ++s) y[s].gather(u < n && y[s].active, en[u].x, yw[u][s]);
    int pos = 0;  // entry li / G's format position (lane li % G == 0 writes it)
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (li / G == u) pos = en[u].y;
    const bool write = li % G == 0 && li / G < n;
    const bool row_done = k + U >= end;
    if (row_done) {
      item += stride;
      row = next.x;
      k = next.y;
      end = next.z;
      live = live && item < items && k < end;
      if (live && item + stride < items) next = row_item(rv, item + stride);
    } else {
      k += U;
    }
    n = load_entries<U>(rv, k, live ? end : k, en);
    float xf[NS][E], dot[U];
#pragma unroll
    for (int s = 0; s < NS; ++s) unpack_words<T, E>(xw[s], xf[s]);
    batch_dots<T, E, U, NS>(xf, yw, dot);
    const float v = reduce_many<L, U>(dot, kFullWarp, li);
    if (write) oh[pos] = from_f32<O>(v);
    if (row_done) {
#pragma unroll
      for (int s = 0; s < NS; ++s) x[s].gather(live && x[s].active, row, xw[s]);
    }
  }
}

// CTA items (the schedule's prefix; on large graphs those the streams do not take) first,
// CTA-strided, group g taking the g-th of the CTA's equal shares of the entries, at least
// p.min_share each (cta_min_share; groups left without a share go on to their whole rows), with
// half the gathers per batch (so the whole-row path, which holds most entries, keeps 64
// registers without spills); then the whole rows.
// SMALL (graphs under kSddmmStreamNnz nonzeros, plan/sddmm.h, whose time is their longest chain):
// no register cap, CTA items take all U gathers per batch, and a group takes one whole row.
// Otherwise a group walks p.stream whole rows as one stream (row_stream). VEC: rows are 16-byte
// aligned.
template <class T, class O, int L, int NS, bool SMALL, bool VEC>
__global__ void __launch_bounds__(kRowThreads, SMALL     ? 1
                                               : NS == 1 ? 4
                                                         : 3)
    sddmm_rows(const SddmmParams p, const RowView rv) {
  constexpr int NG = kRowThreads / L;
  // Gathers per lane per batch: U * NS (half without VEC: element loads need more registers).
  constexpr int U0 = (VEC ? 8 : 4) / NS, U = U0 < L ? U0 : L;
  constexpr int US =
      U / 2 > 0 ? U / 2 : 1;  // the stream's: its next batch's entries take registers
  const int li = threadIdx.x % L, g = threadIdx.x / L;
  const int h = blockIdx.y;
  for (int64_t c = blockIdx.x; c < rv.num_items; c += gridDim.x) {
    const int4 it = row_item(rv, c);
    if (it.w == kWholeRowSlot) break;
    if constexpr (!SMALL) {
      if (streamed(it.w, it.z - it.y, p.stream_max)) break;  // the streams walk it
    }
    const int2 share = cta_share(it.y, it.z, NG, g, p.min_share);
    row_dots<T, O, L, NS, (SMALL || U == 1 ? U : U / 2), VEC>(p, rv, h, it.x, share.x, share.y, li);
  }
  if constexpr (!SMALL) {
    // Items c * NG + g + j * gridDim.x * NG, j < p.stream: strided over the schedule, so every
    // group's rows are a like mix of long and short (the schedule puts long rows first; blocks
    // of consecutive items gave the first CTAs all the longest rows: 2.6x slower on rmat17 at
    // 16).
    const int64_t stride = int64_t(gridDim.x) * NG;
    row_stream<T, O, L, NS, US, VEC>(p, rv, h, int(blockIdx.x) * NG + g,
                                     int(std::min<int64_t>(rv.num_items, stride * p.stream)),
                                     int(stride), li);
  } else {
    const int3 it = whole_row_or_empty(rv, int64_t(blockIdx.x) * NG + g);
    row_dots<T, O, L, NS, U, VEC>(p, rv, h, it.x, it.y, it.z, li);
  }
}

}  // namespace sddmm
}  // namespace jaxsparse_tc
