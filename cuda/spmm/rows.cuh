// CUDA-core SpMM on the row view (spmm_rows, row_view.cuh): the kernel for sparse blocks and
// exact float32.
#pragma once
#include <cstdint>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/row_view.cuh"
#include "cuda/spmm/params.cuh"

namespace jaxsparse_tc {
namespace spmm {

// A group of L lanes owns a slab of L*E features (E = 16 bytes of T per lane) of a work item; every
// lane of the group reads a batch's U entries itself (load_entries), then issues U gathers before
// their U FMAs, so each lane keeps U 16-byte loads in flight with <= 64 registers (U = 4): 32 warps
// per SM, which is what the gather-bound case needs (the tensor-core kernel's 8 warps/SM drew half
// the L2 rate XLA's segment_sum draws). fp32 is computed exactly (no tf32). A row longer than a
// piece is a CTA item: the CTA's groups split its entries and their sums meet in shared memory, so
// a graph without very long rows takes one launch and no workspace; on large graphs the whole-row
// streams also walk the single CTA items of up to p.stream_max entries (row_stream_max). Only a
// row cut into several CTA items (slot >= 0) adds the CTAs' sums into a workspace slot, where a
// countdown (set by row_split_prep) elects the CTA that writes the row.

struct RowSplit {
  float* ws;   // [slots, heads, d] fp32 partial sums of rows cut into several CTA items
  int* count;  // [slots, heads, nslab] CTA items still to add
  int slots;   // 0: no workspace
};

// An item's workspace slot, or -1: a slot past the workspace (a corrupt pattern's) makes the item
// an ordinary CTA item, whose CTA writes the row.
__device__ __forceinline__ int row_slot(const RowSplit& rs, int slot) {
  return unsigned(slot) < unsigned(rs.slots) ? slot : -1;
}

// Counts each slotted row's items into its countdowns (zeroed before; slotted items are a prefix).
__global__ void row_split_prep(const RowView rv, const RowSplit rs, int per_slot) {
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < rv.num_items;
       s += int64_t(gridDim.x) * blockDim.x) {
    const int w = rv.sched[s].w;
    if (w < 0) return;
    const int slot = row_slot(rs, w);
    if (slot < 0) continue;
    for (int j = 0; j < per_slot; ++j) atomicAdd(rs.count + int64_t(slot) * per_slot + j, 1);
  }
}

// Issues the gathers of the first n entries: the lane's E features of each entry's X row and the
// entry's raw value. Invalid entries read zeros.
template <class T, int E, bool VEC, int U>
__device__ __forceinline__ void gather_entries(const LaneRows<T, E, VEC>& x, const T* vh,
                                               const int2 (&en)[U], int n,
                                               uint32_t (&xw)[U][Words<T, E>::N],
                                               uint32_t (&vr)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = u < n;
    vr[u] = load_raw_if<T>(ok, reinterpret_cast<const T*>(reinterpret_cast<const char*>(vh) +
                                                          row_offset(en[u].y, sizeof(T))));
    x.gather(ok, en[u].x, xw[u]);
  }
}

// acc += value * row for each gathered entry (exact float32 math; zeros add nothing).
template <class T, int E, int U>
__device__ __forceinline__ void add_products(const uint32_t (&xw)[U][Words<T, E>::N],
                                             const uint32_t (&vr)[U], float (&acc)[E]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float a = raw_to_f32<T>(vr[u]);
    float x[E];
    unpack_words<T, E>(xw[u], x);
#pragma unroll
    for (int k = 0; k < E; ++k) acc[k] = fmaf(a, x[k], acc[k]);
  }
}

// U = 4 gathers in flight per lane under a 64-register cap: 32 warps/SM. (8 in flight took ~105
// registers, 16 warps/SM, and was slower everywhere: measured on H100, fp16 d=128, rmat17 173.2
// us against 142.7, rmat20 805.4 against 596.2. More warps were slower too: U = 4 under a
// 48-register cap, 40 warps/SM, rmat20 605.8 us against 467.9, rmat17 101.3 against 88.4; U = 2
// at 48 warps/SM, 560.8 and 97.0.) VEC: rows are 16-byte aligned (SpmmParams::vec).
template <class T, int L, bool VEC>
__global__ void __launch_bounds__(kRowThreads, 4)
    spmm_rows(const SpmmParams p, const RowView rv, const RowSplit rs) {
  constexpr int E = kRowVec<T>, NG = kRowThreads / L, F = L * E, NW = Words<T, E>::N;
  constexpr int U = 4;
  constexpr int U1 = 2;           // CTA items: fewer gathers per lane, no spills (64 registers)
  __shared__ float part[NG * F];  // CTA items: each group's sums over the slab's F features
  __shared__ int last;
  const int li = threadIdx.x % L, g = threadIdx.x / L;  // lane in group, group in CTA
  const int slab = blockIdx.y, h = blockIdx.z;
  const int64_t f0 = int64_t(slab) * F, f = f0 + int64_t(li) * E;
  const LaneRows<T, E, VEC> x(static_cast<const T*>(p.x) + h * p.x_head_stride, f, p.d);
  const bool active = x.active;
  const T* vh = opaque(static_cast<const T*>(p.values) + h * p.v_head_stride);

  // CTA items (the schedule's prefix, up to the first the streams walk), CTA-strided: group g
  // takes the g-th of NG equal shares of the entries; thread t then sums feature f0 + t over the
  // groups.
  for (int64_t c = blockIdx.x; c < rv.num_items; c += gridDim.x) {
    const int4 it = row_item(rv, c);
    if (streamed(it.w, it.z - it.y, p.stream_max)) break;  // the streams walk it
    const int2 share = cta_share(it.y, it.z, NG, g, 1);
    float acc[E];
#pragma unroll
    for (int k = 0; k < E; ++k) acc[k] = 0.f;
    int2 en[U1];
    int n = load_entries<U1>(rv, share.x, share.y, en);
    for (int k = share.x; k < share.y; k += U1) {
      uint32_t xw[U1][NW], vr[U1];
      gather_entries<T, E, VEC, U1>(x, vh, en, active ? n : 0, xw, vr);
      n = load_entries<U1>(rv, k + U1, share.y, en);
      add_products<T, E, U1>(xw, vr, acc);
    }
#pragma unroll
    for (int k = 0; k < E; ++k) part[g * F + li * E + k] = acc[k];
    __syncthreads();
    T* out = static_cast<T*>(p.out) + (int64_t(h) * p.m + it.x) * p.d;
    const int slot = row_slot(rs, it.w);
    float* ws = slot >= 0 ? rs.ws + (int64_t(slot) * p.heads + h) * p.d : nullptr;
    for (int t = threadIdx.x; t < F && f0 + t < p.d; t += kRowThreads) {
      float s = 0.f;
      for (int q = 0; q < NG; ++q) s += part[q * F + t];
      if (ws)
        atomicAdd(ws + f0 + t, s);
      else
        out[f0 + t] = from_f32<T>(s);
    }
    if (ws) {  // the fences order this CTA's sums before its count, the last CTA's reads after
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0)
        last = atomicSub(rs.count + (int64_t(slot) * p.heads + h) * p.nslab + slab, 1) == 1;
      __syncthreads();
      if (last) {
        __threadfence();
        for (int t = threadIdx.x; t < F && f0 + t < p.d; t += kRowThreads)
          out[f0 + t] = from_f32<T>(__ldcg(ws + f0 + t));
      }
    }
    __syncthreads();  // part and last are reused
  }

  // Whole rows (and the single CTA items streamed()): groups stride over the items after the
  // CTAs' prefix (persistent where the grid is capped). A group walks its items as one stream of
  // batches of U entries: while a batch's gathers are in flight it loads the next batch's entries,
  // from the same row or the first of its next item (whose schedule entry was loaded when the
  // current item began), so no batch waits on a metadata round trip, not even an item's first. Item
  // indices fit in int: a row's entries are addressed by int (format.h).
  const int items = int(rv.num_items), stride = int(gridDim.x) * NG;
  int item = int(blockIdx.x) * NG + g;
  int4 it = item < items ? row_item(rv, item) : make_int4(0, 0, 0, kWholeRowSlot);
  while (item < items && !streamed(it.w, it.z - it.y, p.stream_max)) {
    item += stride;
    if (item < items) it = row_item(rv, item);
  }
  if (item >= items) return;
  int row = it.x, end = it.z;      // the current item
  int3 next = make_int3(0, 0, 0);  // the next item's row, begin, end (empty past the last)
  if (item + stride < items) {
    const int4 n = row_item(rv, item + stride);
    next = make_int3(n.x, n.y, n.z);
  }
  float acc[E];
#pragma unroll
  for (int k = 0; k < E; ++k) acc[k] = 0.f;
  int k = it.y;
  int2 en[U];
  int n = load_entries<U>(rv, k, end, en);
  while (true) {
    uint32_t xw[U][NW], vr[U];
    gather_entries<T, E, VEC, U>(x, vh, en, active ? n : 0, xw, vr);
    const bool row_done = k + U >= end;
    k = row_done ? next.y : k + U;
    n = load_entries<U>(rv, k, row_done ? next.z : end, en);
    add_products<T, E, U>(xw, vr, acc);
    if (row_done) {
      if (active)
        store_row<T, E>(static_cast<T*>(p.out) + (int64_t(h) * p.m + row) * p.d, f, p.d, VEC, acc);
#pragma unroll
      for (int q = 0; q < E; ++q) acc[q] = 0.f;
      item += stride;
      if (item >= items) break;
      row = next.x;
      end = next.z;
      next = make_int3(0, 0, 0);
      if (item + stride < items) {
        const int4 n = row_item(rv, item + stride);
        next = make_int3(n.x, n.y, n.z);
      }
    }
  }
}

}  // namespace spmm
}  // namespace jaxsparse_tc
