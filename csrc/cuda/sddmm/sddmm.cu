// CUDA SDDMM: out[h, idx(i, j)] = <X_h[i], Y_h[j]> at A's nonzeros, in format order.
//
// Tensor-core path: swap-and-transpose again. For a pair of blocks of one window the MMA
// computes S^T (16 condensed columns x 8 window rows) = Y_cols (16 x d) . X_w^T (d x 8): the
// gathered Y rows are the m=16 operand, the window's 8 X rows the n=8 one, k runs over
// features. Features are remapped inside each 32-feature chunk so that every thread's operand
// elements are consecutive in memory: thread t of a group reads features 8t..8t+7 of the chunk
// (one 16-byte load for 16-bit types), for its Y rows and its X row alike (the same
// permutation on both sides of the dot product leaves it unchanged). A warp owns a schedule
// item (or one of `sub` equal parts of it) and all of d; nothing is combined across warps
// (every output value belongs to one block), so items can be cut anywhere. A warp walks its
// blocks serially, two dependent memory round trips per pair, so on small graphs (few items)
// the longest item is the kernel's time: there the launch cuts each item into parts.
//
// CUDA-core path (sddmm_rows, on the pattern's row view): the default where blocks are sparse
// and for exact fp32 (precision attr 1). sddmm_f32_exact (exact fp32 on the window format, one
// nonzero at a time, warp-wide dot product) serves past the row kernels' width.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/common/ffi_cuda.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/cuda_common.cuh"
#include "common/format.h"
#include "cuda/arch/mma.cuh"
#include "cuda/common/row_view.cuh"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = 4;

struct SddmmParams : KernelPattern {
  const void* x;
  const void* y;
  void* out;
  int64_t nnz, m, n, d;
  int64_t x_head_stride, y_head_stride;  // 0 where the operand broadcasts over heads
  int heads;
  int sub;   // warps per schedule item (each takes an equal, even share of its blocks)
  int min_share;  // row kernels: fewest entries of a CTA item one group takes (cta_min_share)
  int stream;     // row kernels on large graphs: whole rows per group's stream (0: one)
  bool vec;  // d % 8 == 0: every thread's 8 features are in range together, 16-byte aligned
};

// Warps per item: enough that a small launch still fills the device (each part >= 2 blocks).
int sddmm_sub_items(int64_t num_items, int64_t heads) {
  const int forced = env_int("JAXSPARSE_TC_SDDMM_SUB", 0);  // tests: force a value
  if (forced > 0) return std::min(forced, kSplitBlocks / 2);
  return num_items * heads < 16384 ? 8 : 1;
}

// T: operand type; O: value type out (T, or float: the fp32 accumulator unrounded).
template <class T, class O = T>
__global__ void __launch_bounds__(kWarps * 32) sddmm_tc(const SddmmParams p) {
  constexpr bool kTf32 = sizeof(T) == 4;
  constexpr int NW = Words<T, 8>::N;  // 4 words (16-bit) or 8 (fp32) per 8 features
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t unit = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t item = unit / p.sub;
  if (item >= p.num_items) return;
  const int4 it = p.sched[2 * item];
  const int w = it.x;
  const int share = ((it.z - it.y + p.sub - 1) / p.sub + 1) & ~1;  // even: whole block pairs
  const int b0 = it.y + int(unit % p.sub) * share, b1 = min(it.z, b0 + share);
  if (b0 >= b1) return;
  const int wb = p.wbp[w];
  const int cb = p.wcp[w], ncols_w = p.wcp[w + 1] - cb;
  const int64_t xrow = int64_t(w) * kWindowRows + g;  // this thread's X row (B operand)
  const bool xrow_ok = xrow < p.m;

  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const T* xh = static_cast<const T*>(p.x) + h * p.x_head_stride + xrow * p.d;
    const T* yh = static_cast<const T*>(p.y) + h * p.y_head_stride;
    O* oh = static_cast<O*>(p.out) + int64_t(h) * p.nnz;
    for (int b = b0; b < b1; b += 2) {
      // Rows of the m=16 operand: column g of block b (rows 0..7) and of block b+1 (8..15).
      const T* yrow[2];
      uint64_t bits[2];
      int vbase[2];
#pragma unroll
      for (int kb = 0; kb < 2; ++kb) {
        const int blk = b + kb;
        const bool in = blk < b1;
        bits[kb] = in ? load_block_bits(p.bitmap, blk) : 0ull;
        vbase[kb] = in ? __ldg(p.bvp + blk) : 0;
        const int c = 8 * (blk - wb) + g;
        yrow[kb] = in && c < ncols_w ? yh + int64_t(__ldg(p.wc + cb + c)) * p.d : nullptr;
      }
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4  // d=128: every chunk's gathers in flight together
      for (int64_t q = 0; q < p.d; q += 32) {
        const int64_t f = q + 8 * t;
        uint32_t ya[NW], yb[NW], xw[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i) ya[i] = yb[i] = xw[i] = 0u;
        const bool fin = f < p.d;
        if (fin && yrow[0]) load_row<T, 8>(yrow[0], f, p.d, p.vec, ya);
        if (fin && yrow[1]) load_row<T, 8>(yrow[1], f, p.d, p.vec, yb);
        if (fin && xrow_ok) load_row<T, 8>(xh, f, p.d, p.vec, xw);
        if constexpr (kTf32) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {  // k-steps of 8: features 8t+2j, 8t+2j+1
            const uint32_t a[4] = {to_tf32(__uint_as_float(ya[2 * j])),
                                   to_tf32(__uint_as_float(yb[2 * j])),
                                   to_tf32(__uint_as_float(ya[2 * j + 1])),
                                   to_tf32(__uint_as_float(yb[2 * j + 1]))};
            const uint32_t bb[2] = {to_tf32(__uint_as_float(xw[2 * j])),
                                    to_tf32(__uint_as_float(xw[2 * j + 1]))};
            mma_1688_tf32(acc, a, bb);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 2; ++j) {  // k-steps of 16: features 8t+4j .. 8t+4j+3
            const uint32_t a[4] = {ya[2 * j], yb[2 * j], ya[2 * j + 1], yb[2 * j + 1]};
            const uint32_t bb[2] = {xw[2 * j], xw[2 * j + 1]};
            mma_16816(acc, a, bb, T{});
          }
        }
      }
      // c0/c1: block b, column g, rows 2t/2t+1; c2/c3: block b+1.
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int off = bit_value_offset(bits[kb], g * 8 + 2 * t + rr);
          if (off >= 0) oh[vbase[kb] + off] = from_f32<O>(acc[2 * kb + rr]);
        }
    }
  }
}

// Exact fp32 SDDMM on CUDA cores: per nonzero, a warp-wide dot product over d.
__global__ void __launch_bounds__(kWarps * 32) sddmm_f32_exact(const SddmmParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= p.num_items) return;
  const int4 it = p.sched[2 * item];
  const int w = it.x, b0 = it.y, b1 = it.z;
  const int wb = p.wbp[w];
  const int cb = p.wcp[w], ncols_w = p.wcp[w + 1] - cb;
  for (int h = blockIdx.y; h < p.heads; h += gridDim.y) {
    const float* xh = static_cast<const float*>(p.x) + h * p.x_head_stride;
    const float* yh = static_cast<const float*>(p.y) + h * p.y_head_stride;
    float* oh = static_cast<float*>(p.out) + int64_t(h) * p.nnz;
    for (int b = b0; b < b1; ++b) {
      uint64_t bits = load_block_bits(p.bitmap, b);
      int idx = __ldg(p.bvp + b);
      const int colbase = 8 * (b - wb);
      const int ncols = min(8, ncols_w - colbase);
      const int mycol = lane < ncols ? __ldg(p.wc + cb + colbase + lane) : 0;
      while (bits) {  // uniform across the warp
        const int k = __ffsll(static_cast<long long>(bits)) - 1;
        bits &= bits - 1;
        const int r = k & 7, c = k >> 3;
        const int col = __shfl_sync(0xffffffffu, mycol, c);
        const float* xr = xh + (int64_t(w) * kWindowRows + r) * p.d;
        const float* yr = yh + int64_t(col) * p.d;
        float s = 0.f;
        for (int64_t f = 4 * lane; f < p.d; f += 128) {
          uint32_t xa[4], ya[4];
          load_row<float, 4>(xr, f, p.d, p.vec, xa);
          load_row<float, 4>(yr, f, p.d, p.vec, ya);
#pragma unroll
          for (int e = 0; e < 4; ++e) s = fmaf(__uint_as_float(xa[e]), __uint_as_float(ya[e]), s);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) oh[idx] = s;
        ++idx;
      }
    }
  }
}

// ---- CUDA-core SDDMM on the row view (row_view.cuh), the default for sparse blocks ----------
// A group of L lanes takes a work item's entries (values belong to single entries, so the
// groups sharing a CTA item need no combining) and holds the row's X features in registers (NS
// slabs of L*E, E = 16 bytes of T per lane). Per batch of U entries each lane issues U gathers
// of Y, forms U partial dot products, and reduce_many sums them over the group with ~1 shuffle
// per entry; lane li then writes entry li / (L / U)'s value. fp32 is computed exactly (no tf32).
// The whole warp runs each loop to its longest group's count, so every shuffle takes the full
// mask: with a group's mask, each shuffle cost five more instructions of convergence checks
// (NOTES session 11). Gathers are predicated loads.

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
      load_row<T, E>(static_cast<const T*>(p.x) + h * p.x_head_stride + int64_t(row) * p.d, f,
                     p.d, VEC, xw);
    unpack_words<T, E>(xw, xf[s]);
  }

  const int n = e - b, nmax = __reduce_max_sync(kFullWarp, n);
  for (int kc = 0; kc < nmax; kc += L) {
    const int cnt = min(L, n - kc);  // this group's entries in the chunk (may be <= 0)
    const int2 en = ldg8_if(li < cnt, rv.entries + b + kc + li);
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
// Rows come longest first, so a group stops at its first empty item. The loop runs while any
// group of the warp has work, so reduce_many's shuffles take the full mask.
template <class T, class O, int L, int NS, int U, bool VEC>
__device__ __forceinline__ void row_stream(const SddmmParams& p, const RowView& rv, int h,
                                           int item, int items, int stride, int li) {
  constexpr int E = kRowVec<T>, NW = Words<T, E>::N, G = L / U;  // G: lanes per summed entry
  O* oh = static_cast<O*>(p.out) + int64_t(h) * p.nnz;
  LaneRows<T, E, VEC> x[NS], y[NS];  // the lane's slice of X and of Y, per slab
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t f = (int64_t(s) * L + li) * E;
    x[s] = LaneRows<T, E, VEC>(static_cast<const T*>(p.x) + h * p.x_head_stride, f, p.d);
    y[s] = LaneRows<T, E, VEC>(static_cast<const T*>(p.y) + h * p.y_head_stride, f, p.d);
  }
  int4 it = item < items ? rv.sched[item] : make_int4(0, 0, 0, kWholeRow);
  while (item < items && it.w != kWholeRow) {  // skip the CTA items (the schedule's prefix)
    item += stride;
    if (item < items) it = rv.sched[item];
  }
  bool live = item < items && it.y < it.z;
  int row = it.x, k = it.y, end = it.z;
  int4 next = live && item + stride < items ? rv.sched[item + stride] : make_int4(0, 0, 0, 0);
  uint32_t xw[NS][NW];
#pragma unroll
  for (int s = 0; s < NS; ++s) x[s].gather(live && x[s].active, row, xw[s]);
  int2 en[U];
  int n = load_entries<U>(rv.entries, k, live ? end : k, en);
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
      if (live && item + stride < items) next = rv.sched[item + stride];
    } else {
      k += U;
    }
    n = load_entries<U>(rv.entries, k, live ? end : k, en);
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

// CTA items (the schedule's prefix) first, CTA-strided, group g taking the g-th of the CTA's
// equal shares of the entries, at least p.min_share each (cta_min_share; groups left without a
// share go on to their whole rows), with half the gathers per batch (so the whole-row path,
// which holds most entries, keeps 64 registers without spills); then the whole rows, one per
// group, or with STREAM p.stream per group as one stream (row_stream).
// SMALL (graphs under kSmallGraphNnz nonzeros, whose time is their longest chain): no register
// cap, and CTA items take all U gathers per batch. VEC: rows are 16-byte aligned.
template <class T, class O, int L, int NS, bool SMALL, bool VEC, bool STREAM>
__global__ void __launch_bounds__(kRowThreads, SMALL ? 1 : NS == 1 ? 4 : 3)
    sddmm_rows(const SddmmParams p, const RowView rv) {
  constexpr int NG = kRowThreads / L;
  // Gathers per lane per batch: U * NS (half without VEC: element loads need more registers).
  constexpr int U0 = (VEC ? 8 : 4) / NS, U = U0 < L ? U0 : L;
  constexpr int US = U / 2 > 0 ? U / 2 : 1;  // the stream's: its next batch's entries take registers
  const int li = threadIdx.x % L, g = threadIdx.x / L;
  const int h = blockIdx.y;
  for (int64_t c = blockIdx.x; c < rv.num_items; c += gridDim.x) {
    const int4 it = rv.sched[c];
    if (it.w == kWholeRow) break;
    const int2 share = cta_share(it.y, it.z, NG, g, p.min_share);
    row_dots<T, O, L, NS, (SMALL || U == 1 ? U : U / 2), VEC>(p, rv, h, it.x, share.x, share.y,
                                                              li);
  }
  if constexpr (STREAM) {
    // Items c * NG + g + j * gridDim.x * NG, j < p.stream: strided over the schedule, so every
    // group's rows are a like mix of long and short (rows come longest first; blocks of
    // consecutive items gave the first CTAs all the longest rows: 2.6x slower on rmat17 at 16).
    const int64_t stride = int64_t(gridDim.x) * NG;
    row_stream<T, O, L, NS, US, VEC>(
        p, rv, h, int(blockIdx.x) * NG + g,
        int(std::min<int64_t>(rv.num_items, stride * p.stream)), int(stride), li);
  } else {
    const int3 it = whole_row_or_empty(rv, int64_t(blockIdx.x) * NG + g);
    row_dots<T, O, L, NS, U, VEC>(p, rv, h, it.x, it.y, it.z, li);
  }
}

// Row kernels hold at most two slabs of 32 lanes x 16 bytes of X per lane: d * sizeof(T) <= 1 KB.
// The grid covers the whole rows (NG per CTA, p.stream per group with STREAM) and the CTA items
// (row_ctas).
template <class T, class O, int L, int NS, bool SMALL, bool VEC, bool STREAM>
void launch_rows_k(const SddmmParams& p, const RowView& rv, cudaStream_t stream) {
  constexpr auto kernel = sddmm_rows<T, O, L, NS, SMALL, VEC, STREAM>;
  const int64_t grid = row_ctas(rv.num_items, int64_t(kRowThreads / L) * (STREAM ? p.stream : 1),
                                resident_ctas<kernel>(kRowThreads, 0), p.heads);
  kernel<<<dim3(unsigned(grid), unsigned(p.heads)), kRowThreads, 0, stream>>>(p, rv);
}

template <class T, class O, bool SMALL, bool VEC, bool STREAM>
void launch_rows_v(const SddmmParams& p, const RowView& rv, cudaStream_t stream) {
  if (p.d > 32 * kRowVec<T>) {
    launch_rows_k<T, O, 32, 2, SMALL, VEC, STREAM>(p, rv, stream);
    return;
  }
  with_lanes(row_lanes<T>(p.d), [&](auto l) {
    launch_rows_k<T, O, l.value, 1, SMALL, VEC, STREAM>(p, rv, stream);
  });
}

// Small graphs take one whole row per group (their time is their longest chain); large ones
// streams of p.stream rows (JAXSPARSE_TC_SDDMM_STREAM=0: one row per group there too).
template <class T, class O>
void launch_rows(const SddmmParams& p, const RowView& rv, cudaStream_t stream) {
  const bool small = p.nnz < kSmallGraphNnz, streams = p.stream > 0;
  if (small && p.vec) launch_rows_v<T, O, true, true, false>(p, rv, stream);
  else if (small) launch_rows_v<T, O, true, false, false>(p, rv, stream);
  else if (p.vec && streams) launch_rows_v<T, O, false, true, true>(p, rv, stream);
  else if (p.vec) launch_rows_v<T, O, false, true, false>(p, rv, stream);
  else if (streams) launch_rows_v<T, O, false, false, true>(p, rv, stream);
  else launch_rows_v<T, O, false, false, false>(p, rv, stream);
}

// Kernel family: the row kernels where blocks are sparse (sparse_blocks) or for exact fp32,
// within their width limit; the tensor-core kernel otherwise. JAXSPARSE_TC_SDDMM_VARIANT (read
// per launch; tests, benchmarks): unset or auto, this choice; cuda_core forces the row kernels
// (an error past their width), tc the window kernels.

ffi::Error sddmm_cuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer y, I32 wcp, I32 wc,
                      I32 wbp, U32 bitmap, I32 bvp, I32 schedule, I32 row_entries,
                      I32 row_schedule, ffi::Result<ffi::AnyBuffer> out, int32_t precision) {
  const auto xd = x.dimensions(), yd = y.dimensions(), od = out->dimensions();
  if (xd.size() != 3 || yd.size() != 3 || od.size() != 2)
    return ffi::Error::InvalidArgument("sddmm: expected x [Hx,m,d], y [Hy,n,d], out [H,nnz]");
  const auto dtype = x.element_type();
  // out is x's dtype, or float32 for 16-bit x (the accumulator, unrounded).
  const bool f32_out = out->element_type() == ffi::DataType::F32 && dtype != ffi::DataType::F32;
  if (y.element_type() != dtype || (out->element_type() != dtype && !f32_out))
    return ffi::Error::InvalidArgument("sddmm: x, y and out must share a dtype (or out float32)");
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::F16 && dtype != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument("sddmm: unsupported dtype (float32, float16, bfloat16)");
  SddmmParams p{};
  p.x = x.untyped_data();
  p.y = y.untyped_data();
  p.out = out->untyped_data();
  static_cast<KernelPattern&>(p) = kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule);
  p.m = xd[1];
  p.d = xd[2];
  p.n = yd[1];
  p.nnz = od[1];
  const int64_t heads = od[0];
  p.heads = int(heads);
  p.x_head_stride = xd[0] == 1 ? 0 : p.m * p.d;
  p.y_head_stride = yd[0] == 1 ? 0 : p.n * p.d;
  if (heads == 0 || p.nnz == 0) return ffi::Error::Success();
  if (p.d == 0) {  // empty dot products
    const size_t bytes = size_t(heads * p.nnz) * (out->element_type() == ffi::DataType::F32 ? 4 : 2);
    if (cudaMemsetAsync(p.out, 0, bytes, stream) != cudaSuccess)
      return ffi::Error::Internal("sddmm: memset failed");
    return ffi::Error::Success();
  }
  if (heads > 65535) return ffi::Error::InvalidArgument("sddmm: at most 65535 heads");
  const RowView rv = row_view(row_entries, row_schedule);
  const int64_t esize = dtype == ffi::DataType::F32 ? 4 : 2;
  const bool exact = dtype == ffi::DataType::F32 && precision == 1;
  std::string variant;
  if (auto err = kernel_variant("sddmm", "JAXSPARSE_TC_SDDMM_VARIANT", {"cuda_core", "tc"}, variant);
      err.failure())
    return err;
  const bool rows_fit = p.d * esize <= 1024;
  const int64_t num_blocks = int64_t(bitmap.element_count()) / 2;
  const bool sparse = sparse_blocks(p.nnz, num_blocks);
  if (variant == "cuda_core" && !rows_fit)
    return ffi::Error::InvalidArgument(
        "sddmm: d * itemsize is past the row kernels' width (1024 bytes)");
  if (rows_fit && (variant == "cuda_core" || (variant != "tc" && (exact || sparse)))) {
    p.vec = (p.d * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(p.y) % 16 == 0;
    p.min_share = cta_min_share(p.nnz);
    // Whole rows per stream on large graphs (JAXSPARSE_TC_SDDMM_STREAM, read per launch; 0: one
    // row per group). 4: rmat17-d16 / rmat20-d8 fp16 d=128, H100 (NOTES, session 14).
    p.stream = std::max(0, env_int("JAXSPARSE_TC_SDDMM_STREAM", 4));
    if (dtype == ffi::DataType::F32) launch_rows<float, float>(p, rv, stream);
    else if (dtype == ffi::DataType::F16 && f32_out) launch_rows<__half, float>(p, rv, stream);
    else if (dtype == ffi::DataType::F16) launch_rows<__half, __half>(p, rv, stream);
    else if (f32_out) launch_rows<__nv_bfloat16, float>(p, rv, stream);
    else launch_rows<__nv_bfloat16, __nv_bfloat16>(p, rv, stream);
    return launch_status("sddmm");
  }
  const dim3 grid1(unsigned((p.num_items + kWarps - 1) / kWarps),
                   unsigned(std::min<int64_t>(heads, 65535)));
  if (dtype == ffi::DataType::F32 && precision == 1) {
    p.vec = p.d % 4 == 0;
    sddmm_f32_exact<<<grid1, kWarps * 32, 0, stream>>>(p);
  } else {
    p.sub = sddmm_sub_items(p.num_items, std::min<int64_t>(heads, 65535));
    const dim3 grid(unsigned((p.num_items * p.sub + kWarps - 1) / kWarps), grid1.y);
    p.vec = p.d % 8 == 0;
    if (dtype == ffi::DataType::F32) sddmm_tc<float><<<grid, kWarps * 32, 0, stream>>>(p);
    else if (dtype == ffi::DataType::F16 && f32_out) sddmm_tc<__half, float><<<grid, kWarps * 32, 0, stream>>>(p);
    else if (dtype == ffi::DataType::F16) sddmm_tc<__half><<<grid, kWarps * 32, 0, stream>>>(p);
    else if (f32_out) sddmm_tc<__nv_bfloat16, float><<<grid, kWarps * 32, 0, stream>>>(p);
    else sddmm_tc<__nv_bfloat16><<<grid, kWarps * 32, 0, stream>>>(p);
  }
  return launch_status("sddmm");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SddmmCuda, sddmm_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x [Hx, m, d]
                                  .Arg<ffi::AnyBuffer>()  // y [Hy, n, d]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  JAXSPARSE_TC_ROW_VIEW_ARGS
                                  .Ret<ffi::AnyBuffer>()  // out [H, nnz]
                                  .Attr<int32_t>("precision"),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
