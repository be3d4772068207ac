// The fused tensor-core attention forward (attn_fwd_tc; fp16/bf16, d = dv in {32, 64, 128}):
// Fused3S with FlashSparse's swap-and-transpose. One warp owns one (window, head); the window's
// 8 rows are the MMA's n=8 side. Per pair of 8x8 blocks (16 condensed columns):
//   SDDMM   S^T[16 cols x 8 rows] = K_cols[16 x d] Q_w^T[d x 8]     (d/16 mma m16n8k16)
//   softmax mask by the bitmap, online max/sum in fp32 (exp2), rows 2t, 2t+1 per thread
//   P^T     C fragment -> B fragment with movmatrix.trans (no shared memory)
//   SpMM    O^T[dv x 8] += V_cols^T[dv x 16] P^T[16 x 8]           (dv/16 mma m16n8k16)
// Feature remapping (contraction order is free): in the SDDMM thread t owns features
// [t*d/4, (t+1)*d/4) of Q and of the gathered K rows (16-byte loads); in the SpMM MMA row g of
// tile s is feature g*dv/8 + 2s (row g+8: +1), so each thread's V operands are dv/8 consecutive
// features of one gathered row and its O^T fragment maps back to consecutive output features.
// Q stays in registers for the whole window; the nnz-sized score matrix is never written.
// Windows are taken in the schedule's order (split windows first, heaviest first, as Fused3S;
// then by block-count class, pattern.window_schedule). A window split into several schedule
// items is processed by one warp per piece, whose partials (row max, row sum, unnormalised O) are
// merged FlashAttention-style (flash-decoding split-KV). Without this a hub row's window was one
// warp's serial tail. Two ways to merge:
// - grouped schedules (small graphs, pattern.py): a window's pieces (2 or 4) are warps of one
//   CTA; the others leave their partials in shared memory and the first piece merges them after
//   a named barrier. No workspace, no counters, no memset, no GPU-scope fences.
// - otherwise (pieces of 32 blocks, or 4 on small graphs with windows too large to group): each
//   piece writes its partial to a workspace slot, and the piece that completes the window (a
//   per-window counter, zeroed before the launch) merges them in one pass, several pieces'
//   partials per round trip. Windows whose pieces do not fit the workspace cap (or all split
//   windows, with merge_split_windows = 0: plan/attention.h) are processed whole by their first
//   piece's warp.
// Writes O and the row log-sum-exp (fp32) for the backward.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/format.h"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/dependent_launch.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/attention/tile.cuh"
#include "cuda/common/cuda_common.cuh"

namespace jaxsparse_tc {
namespace attention {

// Pieces of a split window merged per round trip: their partials' loads are in flight together
// (registers: 2 rows x (DV/8 + 2) floats per piece and thread).
template <int DV>
constexpr int kMergeChunk = DV > 64 ? 2 : 4;

// Folds C partials of split pieces (per row: max in the log2 domain and sum; unnormalised O
// features) into this thread's running (m, l, o) for rows 2t, 2t+1, FlashAttention-style. A
// partial without a row has max -inf and adds nothing.
template <int DV, int C>
__device__ __forceinline__ void fold_partials(float (&m)[2], float (&l)[2], float (&o)[2][DV / 8],
                                              const float2 (&ml)[C][2],
                                              const float (&oj)[C][2][DV / 8]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int c = 0; c < C; ++c) mx = fmaxf(mx, ml[c][r].x);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float alpha = exp2f(m[r] - base);  // 0 while no piece had this row
    l[r] *= alpha;
#pragma unroll
    for (int e = 0; e < DV / 8; ++e) o[r][e] *= alpha;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float w = exp2f(ml[c][r].x - base);
      l[r] += w * ml[c][r].y;
#pragma unroll
      for (int e = 0; e < DV / 8; ++e) o[r][e] += w * oj[c][r][e];
    }
    m[r] = mx;
  }
}

// Shared memory of a CTA whose warps merge a grouped window's pieces: per warp, two rows of DV
// floats (float4 per lane) and a (max, sum) pair per row and lane.
template <int DV>
constexpr int kGroupSmemBytes = kGroupItems * 2 * 32 * (DV / 32 * 16 + 8);

struct PairCols {  // a block pair's bitmaps, K columns g, g+8 and V columns 2t, 2t+1, 2t+8, 2t+9
  PairRows k;
  int32_t v[4];
};

// Register caps: 3 CTAs per SM at d = 128 (168 registers), 4 below (128; uncapped, ptxas gave
// d = 64 168 registers and 12 warps per SM). PF: the next pair's columns load a pair ahead
// (plan/attention.h says where).
// The kernel takes its operands as __restrict__ parameters rather than an AttnFwdParams: nvcc
// honours __restrict__ on kernel parameters only (not on the members of a struct parameter, nor on
// locals copied from them), and without it the schedule, column, value-offset and bias loads
// leave the read-only path (ld.global.nc). launch_fwd_tc (forward.cu) passes an AttnFwdParams'
// fields.
template <class T, int D, int DV, bool PF>
__global__ void __launch_bounds__(32 * kAttnWarps, D == 128 ? 3 : 4)
    attn_fwd_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                const float* __restrict__ bias, T* __restrict__ out, float* __restrict__ lse,
                const int32_t* __restrict__ wc, const int32_t* __restrict__ wbp,
                const uint32_t* __restrict__ bitmap, const int32_t* __restrict__ bvp,
                const int32_t* __restrict__ schedule, int64_t num_items, const PatternBounds pb,
                int64_t heads, Heads hc, int64_t m, int64_t n, int64_t nnz, float scale,
                int has_bias, float* __restrict__ ws, float2* __restrict__ ws_ml,
                int* __restrict__ done, int64_t cap, int grouped) {
  wait_prerequisites();  // a dependent launch: all inputs may come from the kernel before
  int64_t item, h;       // head-major (unit_item)
  if (!unit_item(int64_t(blockIdx.x) * kAttnWarps + threadIdx.x / 32, num_items, heads, grouped,
                 item, h))
    return;
  // The item carries its first condensed column and its window's end column, piece count and
  // first piece (docs/FORMAT.md), so its column indices load right after it.
  AttnItem it;
  if (!read_item(reinterpret_cast<const int4*>(schedule), wbp, item, num_items, grouped, cap, pb,
                 it))
    return;
  const int64_t w = it.w, b_first = it.b_first, b_end = it.b_end;
  const int64_t c_first = it.c_first, c_end = it.c_end, first = it.first, pieces = it.pieces;
  const bool local = it.local;
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  constexpr int QW = D / 8;    // words of Q / K a thread holds per row (D/4 elements)
  constexpr int VW = DV / 16;  // words of V a thread holds per row (DV/8 elements)
  constexpr int MS = DV / 16;  // SpMM m-tiles

  const T* qh = q + hsel(hc.q, h) * m * D;
  const T* kh = k + hsel(hc.k, h) * n * D;
  const T* vh = v + hsel(hc.v, h) * n * DV;
  const float* bh = bias + hsel(hc.b, h) * nnz;

  const float sl2 = scale * kLog2e;
  float mrow[2] = {-INFINITY, -INFINITY};  // running max (log2 domain), rows 2t, 2t+1
  float lrow[2] = {0.f, 0.f};              // partial sums of this thread's columns
  float acc[MS][4];
#pragma unroll
  for (int s = 0; s < MS; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.f;

  // A pair's bitmaps and the column indices this thread gathers (-1 past the window's end). With
  // PF they are loaded one pair ahead, so that a pair waits on one round trip (its K and V rows)
  // rather than two.
  auto pair_cols = [&](int64_t b0) {
    PairCols pc;
    pc.k = pair_rows(bitmap, wc, it, b0, g);
    const int64_t cbase = c_first + 8 * (b0 - b_first);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // V rows: condensed columns 2t, 2t+1, 2t+8, 2t+9
      const int64_t c = cbase + 2 * t + (j & 1) + (j >> 1) * 8;
      pc.v[j] = c < c_end ? wc[c] : -1;  // folded where used, as pair_rows' columns
    }
    return pc;
  };
  // The first pair's columns load right after the item, beside the window's Q rows (a small
  // graph's item walks ~2 pairs: one round trip off its chain).
  PairCols cur;
  if (b_first < b_end) cur = pair_cols(b_first);
  uint32_t qw[QW];
  row_words<T, D>(qh, w * 8 + g < m ? w * 8 + g : -1, t, qw);
  for (int64_t b0 = b_first; b0 < b_end; b0 += 2) {
    if (!PF && b0 != b_first) cur = pair_cols(b0);
    const PairCols now = cur;
    // At d = 128 the next pair's columns are issued before this pair's rows: nothing they load
    // waits on those rows then (issued after, they waited behind the rows' operand moves on H100).
    // At d = 64 and below a pair's rows are fewer bytes and the order is the other way round
    // (H200, d = 64: 1.074x the kernel before the bounds folds with the columns first, 1.021x
    // after the rows).
    constexpr bool kColsFirst = D > 64;
    if (PF && kColsFirst && b0 + 2 < b_end) cur = pair_cols(b0 + 2);
    uint32_t kw0[QW], kw1[QW];
    gathered_row_words<T, D>(kh, now.k.col[0], pb.last_col, t, kw0);
    gathered_row_words<T, D>(kh, now.k.col[1], pb.last_col, t, kw1);
    uint32_t vw[4][VW];  // issued early, used after the softmax
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (now.v[j] >= 0)
        load_row<T, DV / 8>(vh + int64_t(clamp_last(now.v[j], pb.last_col)) * DV,
                            int64_t(g) * (DV / 8), DV, true, vw[j]);
      else
        for (int x = 0; x < VW; ++x) vw[j][x] = 0u;
    }
    const PairRows tile = now.k;
    if (PF && !kColsFirst && b0 + 2 < b_end) cur = pair_cols(b0 + 2);
    float sc[4];
    tile_dots<T, D>(sc, kw0, kw1, qw);
    // mask + logits (log2 domain). sc[0]: (col g, row 2t), [1]: (g, 2t+1), [2]/[3]: col g+8.
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool on = tile_bit(tile, g, t, e);
      float val = sc[e] * sl2;
      if (has_bias && on) val += bh[tile_value(tile, bvp, b0, g, t, e, pb.last_value)] * kLog2e;
      x[e] = on ? val : -INFINITY;
    }
    float p[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(x[r], x[r + 2]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float mnew = fmaxf(mrow[r], mx);
      const float base = mnew == -INFINITY ? 0.f : mnew;
      const float alpha = exp2f(mrow[r] - base);  // 0 when mrow = -inf
      mrow[r] = mnew;
      p[r] = exp2f(x[r] - base);
      p[r + 2] = exp2f(x[r + 2] - base);
      lrow[r] = lrow[r] * alpha + p[r] + p[r + 2];
#pragma unroll
      for (int s = 0; s < MS; ++s) {
        acc[s][r] *= alpha;
        acc[s][r + 2] *= alpha;
      }
    }
    // P^T as the SpMM's B operand: transpose the two 8x8 halves in registers.
    const uint32_t pt[2] = {movmatrix_trans(pack2<T>(p[0], p[1])),
                            movmatrix_trans(pack2<T>(p[2], p[3]))};
#pragma unroll
    for (int s = 0; s < MS; ++s) {
      const uint32_t a[4] = {pack_lo(vw[0][s], vw[1][s]), pack_hi(vw[0][s], vw[1][s]),
                             pack_lo(vw[2][s], vw[3][s]), pack_hi(vw[2][s], vw[3][s])};
      mma_16816(acc[s], a, pt, T{});
    }
  }
  // finish: full row sums; this thread's rows 2t, 2t+1 and features g*DV/8 + (0 .. DV/8).
  float lsum[2];
  float o[2][DV / 8];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    lsum[r] = l;
#pragma unroll
    for (int s = 0; s < MS; ++s) {
      o[r][2 * s] = acc[s][r];
      o[r][2 * s + 1] = acc[s][r + 2];
    }
  }
  if (local) {
    // The other pieces leave their partials in this CTA's shared memory (slot = warp; each thread
    // its own rows and features, lanes adjacent per float4) and arrive at the window's barrier;
    // the first piece waits there and folds them in.
    extern __shared__ float4 part[];  // [kGroupItems][2 rows][DV/32][32 lanes] float4
    float2* part_ml = reinterpret_cast<float2*>(part + kGroupItems * 2 * (DV / 32) * 32);
    const int slot = int(item % kGroupItems), lead = int(first % kGroupItems);
    const int threads = int(pieces) * 32;
    if (slot != lead) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int x = 0; x < DV / 32; ++x)
          part[((slot * 2 + r) * (DV / 32) + x) * 32 + lane] =
              make_float4(o[r][4 * x], o[r][4 * x + 1], o[r][4 * x + 2], o[r][4 * x + 3]);
        part_ml[(slot * 2 + r) * 32 + lane] = make_float2(mrow[r], lsum[r]);
      }
      window_barrier(lead, threads, false);
      return;
    }
    window_barrier(lead, threads, true);
    for (int j = lead + 1; j < lead + pieces; ++j) {
      float2 ml[1][2];
      float oj[1][2][DV / 8];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        ml[0][r] = part_ml[(j * 2 + r) * 32 + lane];
#pragma unroll
        for (int x = 0; x < DV / 32; ++x) {
          const float4 v = part[((j * 2 + r) * (DV / 32) + x) * 32 + lane];
          oj[0][r][4 * x] = v.x;
          oj[0][r][4 * x + 1] = v.y;
          oj[0][r][4 * x + 2] = v.z;
          oj[0][r][4 * x + 3] = v.w;
        }
      }
      fold_partials<DV, 1>(mrow, lsum, o, ml, oj);
    }
  } else if (first >= 0) {
    // Partial of a piece in slot (item, h): unnormalised O rows [8][DV] (16-byte aligned, so
    // each thread stores its DV/8 features as vectors) and (max in the log2 domain, sum) per row.
    // The piece that completes the window merges every piece's partial into o, mrow, lsum.
    const int64_t slot = item * heads + h;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      store_row<float, DV / 8>(ws + (slot * 8 + 2 * t + r) * DV, int64_t(g) * (DV / 8), DV, true,
                               o[r]);
      if (g == 0) ws_ml[slot * 8 + 2 * t + r] = make_float2(mrow[r], lsum[r]);
    }
    fence_acq_rel_gpu();  // the partial is visible before the counter says so
    __syncwarp();
    int old = 0;
    if (lane == 0) old = atomicAdd(done + first * heads + h, 1);
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != pieces - 1) return;
    fence_acq_rel_gpu();  // and the other pieces' partials are visible to this one
    // One pass over the pieces, kMergeChunk at a time with all their loads in flight together
    // (a loop of one piece per round trip made a hub window's merge longer than its pairs).
    constexpr int C = kMergeChunk<DV>;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mrow[r] = -INFINITY;
      lsum[r] = 0.f;
#pragma unroll
      for (int e = 0; e < DV / 8; ++e) o[r][e] = 0.f;
    }
    for (int64_t j0 = 0; j0 < pieces; j0 += C) {
      float2 ml[C][2];
      float oj[C][2][DV / 8];
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const bool in = j0 + c < pieces;
        const int64_t s = (first + j0 + c) * heads + h;  // piece j's slot, same head
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = s * 8 + 2 * t + r;
          ml[c][r] = in ? __ldcg(ws_ml + row) : make_float2(-INFINITY, 0.f);
          const float4* src = reinterpret_cast<const float4*>(ws + row * DV + g * (DV / 8));
#pragma unroll
          for (int x = 0; x < DV / 32; ++x) {
            const float4 v = in ? __ldcg(src + x) : make_float4(0.f, 0.f, 0.f, 0.f);
            oj[c][r][4 * x] = v.x;
            oj[c][r][4 * x + 1] = v.y;
            oj[c][r][4 * x + 2] = v.z;
            oj[c][r][4 * x + 3] = v.w;
          }
        }
      }
      fold_partials<DV, C>(mrow, lsum, o, ml, oj);
    }
  }
  // normalise, write rows 2t and 2t+1 (features g*DV/8 ..) and their log-sum-exp: +inf where the
  // row has no finite logit (no entry, or all -inf: zeros out, and the backward's exp(s - lse) is
  // 0), NaN where a logit is NaN or +inf (p and so the sum are NaN then, and the row's O)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = lsum[r];
    const int64_t i = w * 8 + 2 * t + r;
    const float inv = l > 0.f ? 1.0f / l : 0.f;
    if (i < m) {
#pragma unroll
      for (int e = 0; e < DV / 8; ++e) o[r][e] *= inv;
      store_row<T, DV / 8>(out + (h * m + i) * DV, int64_t(g) * (DV / 8), DV, true, o[r]);
      if (g == 0) lse[h * m + i] = l == 0.f ? INFINITY : (mrow[r] + log2f(l)) / kLog2e;
    }
  }
}

}  // namespace attention
}  // namespace jaxsparse_tc
