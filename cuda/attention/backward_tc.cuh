// The fused attention backward's kernels (grads_row_stats, grads_windows): FlashAttention-2 on the
// window format, for 16-bit Q, K, V with d = dv in {32, 64, 128}. From the
// forward's saved row log-sum-exp:
//   P = exp(scale Q K^T + bias - lse)   dP = dO V^T   delta_i = dO_i . O_i   dS = P (dP - delta)
//   dQ = scale dS K    dK = scale dS^T Q    dV = P^T dO    dbias = dS
// First (lse, delta) [H, m] per row (grads_row_stats; one 8-byte load per gathered query later),
// then one launch of two kinds of CTAs (grads_windows, a dependent launch: its prologue overlaps
// the stats), neither writing P or dS to memory (but dS as dbias, when asked):
// - dq_windows on A's windows, the forward's tile (tile.cuh), delta and lse of its own
//   rows from O and the saved lse (it never waits for the stats kernel): per block pair
//   S^T = K Q^T and dP^T = V dO^T (K and V rows gathered in the row layout, the window's Q and
//   dO rows in registers), dS^T in registers, dQ^T += K^T dS^T.
// - dkv_windows on A^T's windows (keys are the n=8 side, queries the condensed columns):
//   S = Q K^T and dP = dO V^T (Q and dO rows gathered), dV^T += dO^T P, dK^T += Q^T dS.
// Each pass gathers each of its two operands' rows once per condensed column. Their second
// product wants them transposed (features as the m=16 side), and movmatrix turns each
// row-layout word into that A fragment in registers: word x of the rows of columns g (g+8)
// becomes columns 2t, 2t+1 (2t+8, 2t+9) at feature j_g(x) = (g/2) D/4 + 2x + g%2, and m-tile s
// takes x = 2s (MMA rows g) and 2s+1 (rows g+8). The results (dQ^T, dK^T, dV^T: features by the
// window's rows) go back to rows by the same movmatrix (tile_to_rows). No atomics on outputs:
// each row belongs to one window; a split window's pieces add their partials as the forward
// merges its (in the CTA for grouped schedules, else through workspace slots and a per-window
// counter), in the accumulators' own layout.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/format.h"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/dependent_launch.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/attention/tile.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace attention {

template <class T>
struct GradOperands {
  const T *q, *k, *v, *o, *dout;
  const float* bias;  // [Hb, nnz] float32
  const float* lse;
  const int32_t* perm_t;  // A^T's value order -> A's (the bias in the dK/dV kernel)
  T *dq, *dk, *dv, *dbias;
  float2* row_stats;  // [H, m]: lse in the log2 domain, delta (grads_row_stats)
  int64_t m, n, nnz, heads;
  int64_t q_hs, k_hs, v_hs, b_hs, o_hs, do_hs, lse_hs;  // head strides, 0 where broadcast
  float scale;
  int has_bias;
  int last_value;  // nnz - 1: both orders' value positions and perm_t's entries fold into it
};

// One kernel's split-window partials: per slot (the schedule's first `cap` items) and head, NA
// accumulator tiles of 8 x D fp32 (merge_pieces' layout), and a piece counter per slot and head
// (zeroed before the launch). Grouped schedules merge in shared memory and have none.
struct GradSplit {
  float* ws;
  int* done;
  int64_t cap;
  int grouped;
};

// Shared memory per warp: its partial of a grouped window (NA accumulator tiles, D/16 float4
// per lane each), which in grads_dkv first holds the window's K and V B fragments (D/4 words per
// lane).
template <int D, int NA>
constexpr int kGradSlotBytes = NA * (D / 16) * 32 * 16;
static_assert(kGradSlotBytes<32, 2> >= 2 * (32 / 16) * 32 * 8, "K and V fragments fit a slot");

// Adds a split window's partials (NA accumulator tiles; each lane's fragments are its own, so a
// partial keeps the MMA layout: lane-major float4s) into the piece that writes the window;
// returns whether this warp is that piece.
template <int D, int NA>
__device__ __forceinline__ bool merge_pieces(float (&o)[NA][D / 16][4], const AttnItem& it,
                                             int64_t item, int64_t h, int64_t heads,
                                             const GradSplit& sp, int lane) {
  if (it.first < 0) return true;
  auto add = [&](int a, int s, float4 v) {
    o[a][s][0] += v.x;
    o[a][s][1] += v.y;
    o[a][s][2] += v.z;
    o[a][s][3] += v.w;
  };
  auto pack = [&](int a, int s) {
    return make_float4(o[a][s][0], o[a][s][1], o[a][s][2], o[a][s][3]);
  };
  if (it.local) {
    // The other pieces leave their partials in shared memory (slot = warp) and arrive at the
    // window's barrier; the first piece waits there and adds them.
    extern __shared__ float4 part[];  // [kGroupItems][NA][D/16][32 lanes]: the slots
    const int slot = int(item % kGroupItems), lead = int(it.first % kGroupItems);
    const int threads = int(it.pieces) * 32;
    auto at = [&](int j, int a, int s) -> float4& {
      return part[((j * NA + a) * (D / 16) + s) * 32 + lane];
    };
    if (slot != lead) {
#pragma unroll
      for (int a = 0; a < NA; ++a)
#pragma unroll
        for (int s = 0; s < D / 16; ++s) at(slot, a, s) = pack(a, s);
      window_barrier(lead, threads, false);
      return false;
    }
    window_barrier(lead, threads, true);
    for (int j = lead + 1; j < lead + it.pieces; ++j)
#pragma unroll
      for (int a = 0; a < NA; ++a)
#pragma unroll
        for (int s = 0; s < D / 16; ++s) add(a, s, at(j, a, s));
    return true;
  }
  // Workspace slot (item, h); the piece that completes the window's count adds the others'.
  auto at = [&](int64_t j, int a, int s) {
    return reinterpret_cast<float4*>(sp.ws) + ((j * NA + a) * (D / 16) + s) * 32 + lane;
  };
  const int64_t mine = item * heads + h;
#pragma unroll
  for (int a = 0; a < NA; ++a)
#pragma unroll
    for (int s = 0; s < D / 16; ++s) *at(mine, a, s) = pack(a, s);
  fence_acq_rel_gpu();  // the partial is visible before the counter says so
  __syncwarp();
  int old = 0;
  if (lane == 0) old = atomicAdd(sp.done + it.first * heads + h, 1);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != it.pieces - 1) return false;
  fence_acq_rel_gpu();  // and the other pieces' partials are visible to this one
  for (int64_t j = it.first; j < int64_t(it.first) + it.pieces; ++j) {
    if (j == item) continue;
#pragma unroll
    for (int a = 0; a < NA; ++a)
#pragma unroll
      for (int s = 0; s < D / 16; ++s) add(a, s, __ldcg(at(j * heads + h, a, s)));
  }
  return true;
}

// The A fragment of features-by-columns (m-tile s) from two row-layout rows (columns g, g+8).
template <int D>
__device__ __forceinline__ void transposed_tile(const uint32_t (&r0)[D / 8],
                                                const uint32_t (&r1)[D / 8], int s,
                                                uint32_t (&a)[4]) {
  a[0] = movmatrix_trans(r0[2 * s]);
  a[1] = movmatrix_trans(r0[2 * s + 1]);
  a[2] = movmatrix_trans(r1[2 * s]);
  a[3] = movmatrix_trans(r1[2 * s + 1]);
}

// A window-side result tile (D/16 C fragments: m-tile s row g holds feature j_g(2s), row g+8
// j_g(2s+1), at window rows 2t, 2t+1; j_g(x) = (g/2) D/4 + 2x + g%2), times `scale`, as 16-bit
// row-layout words of window row g (features t*D/4 ..). movmatrix of the packed C halves does
// the transpose: word 2s holds features t*D/4 + 4s, +1 and word 2s + 1 the next two.
template <class T, int D>
__device__ __forceinline__ void tile_to_rows(const float (&acc)[D / 16][4], float scale,
                                             uint32_t (&w)[D / 8]) {
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    w[2 * s] = movmatrix_trans(pack2<T>(acc[s][0] * scale, acc[s][1] * scale));
    w[2 * s + 1] = movmatrix_trans(pack2<T>(acc[s][2] * scale, acc[s][3] * scale));
  }
}

// Stores row-layout words (tile_to_rows) of one row: features t*D/4 .. (t+1)*D/4.
template <class T, int D>
__device__ __forceinline__ void store_words(T* row, int t, const uint32_t (&w)[D / 8]) {
  uint4* dst = reinterpret_cast<uint4*>(row + t * (D / 4));
#pragma unroll
  for (int i = 0; i < D / 32; ++i)
    dst[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
}

// Dot product of E 16-bit elements held as words (grads_row_stats: a lane's share of a delta).
template <class T, int E>
__device__ __forceinline__ float dot_words(const uint32_t* a, const uint32_t* b) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) s = fmaf(word_elem<T>(a, e), word_elem<T>(b, e), s);
  return s;
}

// (lse in the log2 domain, delta_i = dO_i . O_i) of every row and head, before the windows: 8
// lanes per row, D/8 features each.
template <class T, int D>
__global__ void __launch_bounds__(256) grads_row_stats(const GradOperands<T> p) {
  wait_prerequisites();  // O and dO may come from the kernel before
  allow_dependents();    // grads_windows' prologue needs none of this kernel's output
  const int64_t unit = (int64_t(blockIdx.x) * 256 + threadIdx.x) / 8;  // h * m + i
  const int li = threadIdx.x % 8;
  const bool in = unit < p.heads * p.m;
  const int64_t h = in ? unit / p.m : 0, i = in ? unit % p.m : 0;
  uint32_t dw[Words<T, D / 8>::N], ow[Words<T, D / 8>::N];
  load_row<T, D / 8>(p.dout + h * p.do_hs + i * D, int64_t(li) * (D / 8), D, true, dw);
  load_row<T, D / 8>(p.o + h * p.o_hs + i * D, int64_t(li) * (D / 8), D, true, ow);
  float delta = dot_words<T, D / 8>(dw, ow);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) delta += __shfl_xor_sync(0xffffffffu, delta, o);
  if (in && li == 0) p.row_stats[unit] = make_float2(p.lse[h * p.lse_hs + i] * kLog2e, delta);
}

// delta of the window's rows 2t and 2t+1 (dO_i . O_i) from its row-layout dO and O rows: the
// diagonal of tile_dots with dO's rows as the columns g (columns g+8 zero) and O's as the
// window's rows, whose element (i, i) thread (i, i/2) holds.
template <class T, int D>
__device__ __forceinline__ void window_deltas(const uint32_t (&dw)[D / 8],
                                              const uint32_t (&ow)[D / 8], int t, float (&dl)[2]) {
  constexpr uint32_t zero[D / 8] = {};
  float c[4];
  tile_dots<T, D>(c, dw, zero, ow);
#pragma unroll
  for (int r = 0; r < 2; ++r) dl[r] = __shfl_sync(0xffffffffu, c[r], (2 * t + r) * 4 + t);
}

// The warp's unit of a CTA's windows (head-major, as the forward): its schedule item, head and
// the item's fields; false where the warp has none.
__device__ __forceinline__ bool warp_window_item(const KernelPattern& a, int64_t heads,
                                                 const GradSplit& sp, int64_t cta, int64_t& item,
                                                 int64_t& h, AttnItem& it) {
  return unit_item(cta * kAttnWarps + threadIdx.x / 32, a.num_items, heads, sp.grouped, item, h) &&
         read_item(a.sched, a.wbp, item, a.num_items, sp.grouped, sp.cap, a, it);
}

// dQ (and dbias) of one CTA's windows of A. PF: the next pair's columns load a pair ahead
// (plan/attention.h: large graphs, as the forward).
template <class T, int D, bool PF>
__device__ __forceinline__ void dq_windows(const GradOperands<T>& p, const KernelPattern& a,
                                           const GradSplit& sp, int64_t cta) {
  int64_t item, h;
  AttnItem it;
  if (!warp_window_item(a, p.heads, sp, cta, item, h, it)) return;
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  constexpr int W = D / 8;
  const T* kh = p.k + h * p.k_hs;
  const T* vh = p.v + h * p.v_hs;
  const float* bh = p.bias + h * p.b_hs;

  // The window's Q and dO rows (row g), and the stats of rows 2t, 2t+1 from its own O rows and
  // lse: this pass reads no grads_row_stats, so it runs while that kernel does.
  const int64_t i = int64_t(it.w) * 8 + g, row = i < p.m ? i : -1;
  uint32_t qw[W], dw[W];
  row_words<T, D>(p.q + h * p.q_hs, row, t, qw);
  row_words<T, D>(p.dout + h * p.do_hs, row, t, dw);
  float dl[2], l2[2];  // rows 2t, 2t+1: delta and lse (log2 domain)
  {
    uint32_t ow[W];
    row_words<T, D>(p.o + h * p.o_hs, row, t, ow);
    window_deltas<T, D>(dw, ow, t, dl);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t ri = int64_t(it.w) * 8 + 2 * t + r;
      l2[r] = ri < p.m ? p.lse[h * p.lse_hs + ri] * kLog2e : 0.f;
    }
  }
  const float sl2 = p.scale * kLog2e;
  float out[1][D / 16][4];  // dQ^T: the C fragments of D/16 m-tiles
  auto& acc = out[0];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.f;

  PairRows next;
  if (PF && it.b_first < it.b_end) next = pair_rows(a.bitmap, a.wc, it, it.b_first, g);
  for (int64_t b0 = it.b_first; b0 < it.b_end; b0 += 2) {
    const PairRows pr = PF ? next : pair_rows(a.bitmap, a.wc, it, b0, g);
    if (PF && b0 + 2 < it.b_end) next = pair_rows(a.bitmap, a.wc, it, b0 + 2, g);  // as forward
    uint32_t kw0[W], kw1[W], vw0[W], vw1[W];
    gathered_row_words<T, D>(kh, pr.col[0], a.last_col, t, kw0);
    gathered_row_words<T, D>(kh, pr.col[1], a.last_col, t, kw1);
    gathered_row_words<T, D>(vh, pr.col[0], a.last_col, t, vw0);
    gathered_row_words<T, D>(vh, pr.col[1], a.last_col, t, vw1);
    float sc[4], dp[4], ds[4];
    tile_dots<T, D>(sc, kw0, kw1, qw);  // S^T: (column, row)
    tile_dots<T, D>(dp, vw0, vw1, dw);  // dP^T
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool on = tile_bit(pr, g, t, e);
      const int64_t idx = p.has_bias && on ? tile_value(pr, a.bvp, b0, g, t, e, a.last_value) : 0;
      float x = sc[e] * sl2;
      if (p.has_bias && on) x += bh[idx] * kLog2e;
      // lse is +inf for a row without finite logits: pe = 0 there (and for -inf logits)
      const float pe = on ? exp2f(x - l2[e & 1]) : 0.f;
      ds[e] = pe * (dp[e] - dl[e & 1]);
      if (p.has_bias && on) p.dbias[h * p.nnz + idx] = from_f32<T>(ds[e]);
    }
    const uint32_t db[2] = {movmatrix_trans(pack2<T>(ds[0], ds[1])),
                            movmatrix_trans(pack2<T>(ds[2], ds[3]))};
#pragma unroll
    for (int s = 0; s < D / 16; ++s) {  // dQ^T += K^T dS^T
      uint32_t kt[4];
      transposed_tile<D>(kw0, kw1, s, kt);
      mma_16816(acc[s], kt, db, T{});
    }
  }
  if (!merge_pieces<D, 1>(out, it, item, h, p.heads, sp, lane)) return;
  uint32_t w[W];
  tile_to_rows<T, D>(acc, p.scale, w);
  if (i < p.m) store_words<T, D>(p.dq + (h * p.m + i) * D, t, w);
}

// dK and dV of one CTA's windows of A^T (rows: keys; condensed columns: queries).
template <class T, int D, bool PF>
__device__ __forceinline__ void dkv_windows(const GradOperands<T>& p, const KernelPattern& at,
                                            const GradSplit& sp, int64_t cta) {
  int64_t item, h;
  AttnItem it;
  if (!warp_window_item(at, p.heads, sp, cta, item, h, it)) return;
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  constexpr int W = D / 8;
  const T* qh = p.q + h * p.q_hs;
  const T* doh = p.dout + h * p.do_hs;
  const float2* stats = p.row_stats + h * p.m;
  const float* bh = p.bias + h * p.b_hs;

  // The window's K and V rows (key row g) as B fragments, kept in this warp's slot of shared
  // memory (in registers the pass took 222 of them at D = 128: 2 CTAs per SM, not 3).
  extern __shared__ float4 smem[];  // [kAttnWarps][kGradSlotBytes<D, 2> / 16]
  uint2* const kvw =
      reinterpret_cast<uint2*>(smem + (threadIdx.x / 32) * (kGradSlotBytes<D, 2> / 16));
  const int64_t j = int64_t(it.w) * 8 + g;
  {
    uint32_t kw[W], vw[W];
    row_words<T, D>(p.k + h * p.k_hs, j < p.n ? j : -1, t, kw);
    row_words<T, D>(p.v + h * p.v_hs, j < p.n ? j : -1, t, vw);
#pragma unroll
    for (int s = 0; s < D / 16; ++s) {
      kvw[s * 32 + lane] = make_uint2(kw[2 * s], kw[2 * s + 1]);
      kvw[(D / 16 + s) * 32 + lane] = make_uint2(vw[2 * s], vw[2 * s + 1]);
    }
  }
  const float sl2 = p.scale * kLog2e;
  float out[2][D / 16][4];  // dK^T, dV^T
  auto &ak = out[0], &av = out[1];
#pragma unroll
  for (int s = 0; s < D / 16; ++s)
#pragma unroll
    for (int e = 0; e < 4; ++e) ak[s][e] = av[s][e] = 0.f;

  wait_prerequisites();  // grads_row_stats (stats of the gathered queries)
  PairRows next;
  if (PF && it.b_first < it.b_end) next = pair_rows(at.bitmap, at.wc, it, it.b_first, g);
  for (int64_t b0 = it.b_first; b0 < it.b_end; b0 += 2) {
    const PairRows pr = PF ? next : pair_rows(at.bitmap, at.wc, it, b0, g);
    if (PF && b0 + 2 < it.b_end) next = pair_rows(at.bitmap, at.wc, it, b0 + 2, g);  // as forward
    uint32_t qc0[W], qc1[W], dc0[W], dc1[W];
    gathered_row_words<T, D>(qh, pr.col[0], at.last_col, t, qc0);
    gathered_row_words<T, D>(qh, pr.col[1], at.last_col, t, qc1);
    gathered_row_words<T, D>(doh, pr.col[0], at.last_col, t, dc0);
    gathered_row_words<T, D>(doh, pr.col[1], at.last_col, t, dc1);
    float2 st2[2];  // the queries of columns g and g+8: (lse, delta)
#pragma unroll
    for (int c = 0; c < 2; ++c)
      st2[c] = pr.col[c] >= 0 ? stats[clamp_last(pr.col[c], at.last_col)] : make_float2(0.f, 0.f);
    float sc[4], dp[4], pe[4], ds[4];
    tile_dots<T, D>(sc, qc0, qc1, kvw, lane);                // S: (query column, key row)
    tile_dots<T, D>(dp, dc0, dc1, kvw + D / 16 * 32, lane);  // dP
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool on = tile_bit(pr, g, t, e);
      float x = sc[e] * sl2;
      if (p.has_bias && on)
        x += bh[clamp_last(p.perm_t[tile_value(pr, at.bvp, b0, g, t, e, p.last_value)],
                           p.last_value)] *
             kLog2e;
      pe[e] = on ? exp2f(x - st2[e >> 1].x) : 0.f;
      ds[e] = pe[e] * (dp[e] - st2[e >> 1].y);
    }
    const uint32_t pb[2] = {movmatrix_trans(pack2<T>(pe[0], pe[1])),
                            movmatrix_trans(pack2<T>(pe[2], pe[3]))};
    const uint32_t db[2] = {movmatrix_trans(pack2<T>(ds[0], ds[1])),
                            movmatrix_trans(pack2<T>(ds[2], ds[3]))};
#pragma unroll
    for (int s = 0; s < D / 16; ++s) {
      uint32_t x[4];
      transposed_tile<D>(dc0, dc1, s, x);  // dV^T += dO^T P
      mma_16816(av[s], x, pb, T{});
      transposed_tile<D>(qc0, qc1, s, x);  // dK^T += Q^T dS
      mma_16816(ak[s], x, db, T{});
    }
  }
  if (!merge_pieces<D, 2>(out, it, item, h, p.heads, sp, lane)) return;
  uint32_t w[W];
  tile_to_rows<T, D>(ak, p.scale, w);
  if (j < p.n) store_words<T, D>(p.dk + (h * p.n + j) * D, t, w);
  tile_to_rows<T, D>(av, 1.f, w);
  if (j < p.n) store_words<T, D>(p.dv + (h * p.n + j) * D, t, w);
}

// Both passes in one launch, after the row stats: CTAs [0, ctas_t) take A^T's windows (dK, dV),
// the rest A's (dQ), so that a small graph's two longest windows overlap rather than queue. The
// heavier dK/dV CTAs go first (measured on H100, Cora: 11.5 -> 11.1 us at d=64, 23.7 -> 22.1 at
// d=128; R-MAT even; once dQ stopped waiting for the row stats, either order read the same).
// Register caps as the forward's (one CTA per SM more spilled: Cora 23.7 -> 33.2 us at d=128,
// 11.5 -> 15.0 at d=64).
template <class T, int D, bool PF>
__global__ void __launch_bounds__(32 * kAttnWarps, D == 128 ? 3 : 4)
    grads_windows(const GradOperands<T> p, const KernelPattern a, const KernelPattern at,
                  const GradSplit sa, const GradSplit st, int64_t ctas_t) {
  // One call site per pass (two, for a switchable order, made ptxas spill more).
  if (blockIdx.x < ctas_t)
    dkv_windows<T, D, PF>(p, at, st, blockIdx.x);
  else
    dq_windows<T, D, PF>(p, a, sa, blockIdx.x - ctas_t);
}

}  // namespace attention
}  // namespace jaxsparse_tc
