// CUDA sparse attention: O = softmax_row(mask_A(scale * Q K^T + bias)) V (docs/FORMAT.md).
//
// Forward, tensor-core path (fp16/bf16, d = dv in {32, 64, 128}): Fused3S with FlashSparse's
// swap-and-transpose. One warp owns one (window, head); the window's 8 rows are the MMA's n=8
// side. Per pair of 8x8 blocks (16 condensed columns):
//   SDDMM   S^T[16 cols x 8 rows] = K_cols[16 x d] Q_w^T[d x 8]     (d/16 mma m16n8k16)
//   softmax mask by the bitmap, online max/sum in fp32 (exp2), rows 2t, 2t+1 per thread
//   P^T     C fragment -> B fragment with movmatrix.trans (no shared memory)
//   SpMM    O^T[dv x 8] += V_cols^T[dv x 16] P^T[16 x 8]           (dv/16 mma m16n8k16)
// Feature remapping (contraction order is free): in the SDDMM thread t owns features
// [t*d/4, (t+1)*d/4) of Q and of the gathered K rows (16-byte loads); in the SpMM MMA row g of
// tile s is feature g*dv/8 + 2s (row g+8: +1), so each thread's V operands are dv/8 consecutive
// features of one gathered row and its O^T fragment maps back to consecutive output features.
// Q stays in registers for the whole window; the nnz-sized score matrix is never written.
// Windows are taken in the schedule's order (heaviest first, Fused3S reordering). A window split
// into several schedule items is processed by one warp per piece, whose partials (row max, row
// sum, unnormalised O) are merged FlashAttention-style (flash-decoding split-KV). Without this a
// hub row's window was one warp's serial tail (docs/NOTES.md). Two ways to merge:
// - grouped schedules (small graphs, pattern.py): a window's pieces (2 or 4) are warps of one
//   CTA; the others leave their partials in shared memory and the first piece merges them after
//   a named barrier. No workspace, no counters, no memset, no GPU-scope fences.
// - otherwise (pieces of 32 blocks, or 4 on small graphs with windows too large to group): each
//   piece writes its partial to a workspace slot, and the piece that completes the window (a
//   per-window counter, zeroed before the launch) merges them in one pass, several pieces'
//   partials per round trip. Windows whose pieces do not fit the workspace cap are processed
//   whole by their first piece's warp.
// Writes O and the row log-sum-exp (fp32) for the backward.
//
// Scalar path (float32 in, other head sizes, and the jvp): CUDA cores, one warp per
// (row, head), lanes over features, float32 math. The backward is not here: tensor-core windows
// (attention_grads.cu), or a per-edge kernel (attention_bwd.cu) and the SpMMs
// (jaxsparse_tc/attention.py `_backward` says which).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "cuda/attention/tile.cuh"
#include "cuda/arch/dependent_launch.cuh"
#include "cuda/common/ffi_cuda.cuh"
#include "cuda/common/row_view.cuh"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = kAttnWarps;
constexpr int kMaxPerLane = 8;  // scalar kernels: d, dv <= 256

struct Heads {  // head counts of the operands (1 broadcasts)
  int64_t q, k, v, b;
};

__device__ __forceinline__ int64_t hsel(int64_t count, int64_t h) { return count == 1 ? 0 : h; }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Pieces of a split window merged per round trip: their partials' loads are in flight together
// (registers: 2 rows x (DV/8 + 2) floats per piece and thread).
template <int DV> constexpr int kMergeChunk = DV > 64 ? 2 : 4;

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

// ---------------------------------------------------------------------------------------------
// Tensor-core fused forward.
struct PairCols {  // a block pair's bitmaps, K columns g, g+8 and V columns 2t, 2t+1, 2t+8, 2t+9
  PairRows k;
  int32_t v[4];
};

// Register caps: 3 CTAs per SM at d = 128 (168 registers), 4 below (128; uncapped, ptxas gave
// d = 64 168 registers and 12 warps per SM). PF: the next pair's columns load a pair ahead.
template <class T, int D, int DV, bool PF>
__global__ void __launch_bounds__(32 * kWarps, D == 128 ? 3 : 4)
attn_fwd_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
            const T* __restrict__ bias, T* __restrict__ out, float* __restrict__ lse,
            const int32_t* __restrict__ wc, const int32_t* __restrict__ wbp,
            const uint32_t* __restrict__ bitmap, const int32_t* __restrict__ bvp,
            const int32_t* __restrict__ schedule,
            int64_t num_items, int64_t heads, Heads hc, int64_t m, int64_t n, int64_t nnz,
            float scale, int has_bias, float* __restrict__ ws, float2* __restrict__ ws_ml,
            int* __restrict__ done, int64_t cap, int head_major, int grouped) {
  wait_prerequisites();  // a dependent launch: all inputs may come from the kernel before
  int64_t item, h;  // head-major unless switched off (a grouped schedule's CTA is one head's)
  if (!unit_item(int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, num_items, heads, grouped,
                 grouped || head_major, item, h))
    return;
  // The item carries its first condensed column and its window's end column, piece count and
  // first piece (docs/FORMAT.md), so its column indices load right after it.
  AttnItem it;
  if (!read_item(reinterpret_cast<const int4*>(schedule), wbp, item, grouped, cap, it)) return;
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
  const T* bh = bias + hsel(hc.b, h) * nnz;

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
      pc.v[j] = c < c_end ? wc[c] : -1;
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
    uint32_t kw0[QW], kw1[QW];
    row_words<T, D>(kh, cur.k.col[0], t, kw0);
    row_words<T, D>(kh, cur.k.col[1], t, kw1);
    uint32_t vw[4][VW];  // issued early, used after the softmax
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (cur.v[j] >= 0) load_row<T, DV / 8>(vh + int64_t(cur.v[j]) * DV, int64_t(g) * (DV / 8), DV, true, vw[j]);
      else for (int x = 0; x < VW; ++x) vw[j][x] = 0u;
    }
    const PairRows tile = cur.k;
    if (PF && b0 + 2 < b_end) cur = pair_cols(b0 + 2);
    float sc[4];
    tile_dots<T, D>(sc, kw0, kw1, qw);
    // mask + logits (log2 domain). sc[0]: (col g, row 2t), [1]: (g, 2t+1), [2]/[3]: col g+8.
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool on = tile_bit(tile, g, t, e);
      float val = sc[e] * sl2;
      if (has_bias && on) val += to_f32<T>(bh[tile_value(tile, bvp, b0, g, t, e)]) * kLog2e;
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
      for (int s = 0; s < MS; ++s) { acc[s][r] *= alpha; acc[s][r + 2] *= alpha; }
    }
    // P^T as the SpMM's B operand: transpose the two 8x8 halves in registers.
    const uint32_t pb[2] = {movmatrix_trans(pack2<T>(p[0], p[1])),
                            movmatrix_trans(pack2<T>(p[2], p[3]))};
#pragma unroll
    for (int s = 0; s < MS; ++s) {
      const uint32_t a[4] = {pack_lo(vw[0][s], vw[1][s]), pack_hi(vw[0][s], vw[1][s]),
                             pack_lo(vw[2][s], vw[3][s]), pack_hi(vw[2][s], vw[3][s])};
      mma_16816(acc[s], a, pb, T{});
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
    for (int s = 0; s < MS; ++s) { o[r][2 * s] = acc[s][r]; o[r][2 * s + 1] = acc[s][r + 2]; }
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
          oj[0][r][4 * x] = v.x; oj[0][r][4 * x + 1] = v.y;
          oj[0][r][4 * x + 2] = v.z; oj[0][r][4 * x + 3] = v.w;
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
      store_row<float, DV / 8>(ws + (slot * 8 + 2 * t + r) * DV, int64_t(g) * (DV / 8), DV, true, o[r]);
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
            oj[c][r][4 * x] = v.x; oj[c][r][4 * x + 1] = v.y;
            oj[c][r][4 * x + 2] = v.z; oj[c][r][4 * x + 3] = v.w;
          }
        }
      }
      fold_partials<DV, C>(mrow, lsum, o, ml, oj);
    }
  }
  // normalise, write rows 2t and 2t+1 (features g*DV/8 ..) and their log-sum-exp
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = lsum[r];
    const int64_t i = w * 8 + 2 * t + r;
    const float inv = l > 0.f ? 1.0f / l : 0.f;
    if (i < m) {
#pragma unroll
      for (int e = 0; e < DV / 8; ++e) o[r][e] *= inv;
      store_row<T, DV / 8>(out + (h * m + i) * DV, int64_t(g) * (DV / 8), DV, true, o[r]);
      if (g == 0) lse[h * m + i] = l > 0.f ? (mrow[r] + log2f(l)) / kLog2e : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Scalar kernels: one warp per (row, head), lane holds features lane + 32 f.
template <class T>
__device__ __forceinline__ void load_lane(const T* row, int64_t d, float (&x)[kMaxPerLane], int lane) {
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f) {
    const int64_t c = lane + 32 * f;
    x[f] = c < d ? to_f32<T>(row[c]) : 0.f;
  }
}
__device__ __forceinline__ float lane_dot(const float (&a)[kMaxPerLane], const float (&b)[kMaxPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f) s += a[f] * b[f];
  return warp_sum(s);
}

// f(col, value_index) for each nonzero of row r of window w, in order.
template <class F>
__device__ __forceinline__ void row_walk(const int32_t* wcp, const int32_t* wc, const int32_t* wbp,
                                         const uint32_t* bitmap, const int32_t* bvp, int64_t w,
                                         int r, F&& f) {
  const int64_t b_first = wbp[w];
  const uint64_t rmask = 0x0101010101010101ull << r;
  for (int64_t b = b_first; b < wbp[w + 1]; ++b) {
    const uint64_t bits = load_block_bits(bitmap, b);
    uint64_t rb = bits & rmask;
    const int64_t col0 = wcp[w] + 8 * (b - b_first);
    while (rb) {
      const int kb = __ffsll(static_cast<long long>(rb)) - 1;
      rb &= rb - 1;
      f(int64_t(wc[col0 + kb / 8]), int64_t(bvp[b]) + __popcll(bits & ((1ull << kb) - 1ull)));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
attn_fwd_scalar(const T* q, const T* k, const T* v, const T* bias, T* out, float* lse,
                const int32_t* wcp, const int32_t* wc, const int32_t* wbp, const uint32_t* bitmap,
                const int32_t* bvp, int64_t heads, Heads hc, int64_t m, int64_t n, int64_t d,
                int64_t dv, int64_t nnz, float scale, int has_bias) {
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= m * heads) return;
  const int64_t i = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  float qi[kMaxPerLane], kj[kMaxPerLane], vj[kMaxPerLane], acc[kMaxPerLane] = {};
  load_lane(q + (hsel(hc.q, h) * m + i) * d, d, qi, lane);
  const T* kh = k + hsel(hc.k, h) * n * d;
  const T* vh = v + hsel(hc.v, h) * n * dv;
  const T* bh = bias + hsel(hc.b, h) * nnz;
  float mx = -INFINITY, l = 0.f;
  row_walk(wcp, wc, wbp, bitmap, bvp, i / 8, int(i % 8), [&](int64_t j, int64_t idx) {
    load_lane(kh + j * d, d, kj, lane);
    load_lane(vh + j * dv, dv, vj, lane);
    const float s = scale * lane_dot(qi, kj) + (has_bias ? to_f32<T>(bh[idx]) : 0.f);
    const float mnew = fmaxf(mx, s);
    const float alpha = __expf(mx - mnew);
    const float p = __expf(s - mnew);
    mx = mnew;
    l = l * alpha + p;
#pragma unroll
    for (int f = 0; f < kMaxPerLane; ++f) acc[f] = acc[f] * alpha + p * vj[f];
  });
  const float inv = l > 0.f ? 1.0f / l : 0.f;
  T* orow = out + (h * m + i) * dv;
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f)
    if (lane + 32 * f < dv) orow[lane + 32 * f] = from_f32<T>(acc[f] * inv);
  if (lane == 0) lse[h * m + i] = l > 0.f ? mx + logf(l) : -INFINITY;
}

// JVP: dO_i = sum_j P_ij dS_ij V_j - (sum_j P_ij dS_ij) O_i + sum_j P_ij dV_j.
template <class T>
__global__ void __launch_bounds__(32 * kWarps)
attn_jvp_scalar(const T* q, const T* k, const T* v, const T* bias, const float* lse,
                const T* dq, const T* dk, const T* dvv, const T* dbias, T* dout,
                const int32_t* wcp, const int32_t* wc, const int32_t* wbp, const uint32_t* bitmap,
                const int32_t* bvp, int64_t heads, Heads hc, Heads hd, int64_t hl, int64_t m,
                int64_t n, int64_t d, int64_t dv, int64_t nnz, float scale, int has_bias) {
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= m * heads) return;
  const int64_t i = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  float qi[kMaxPerLane], dqi[kMaxPerLane], kj[kMaxPerLane], vj[kMaxPerLane];
  float a1[kMaxPerLane] = {}, a2[kMaxPerLane] = {}, of[kMaxPerLane] = {};
  load_lane(q + (hsel(hc.q, h) * m + i) * d, d, qi, lane);
  load_lane(dq + (hsel(hd.q, h) * m + i) * d, d, dqi, lane);
  const float li = lse[hsel(hl, h) * m + i];
  float c = 0.f;
  row_walk(wcp, wc, wbp, bitmap, bvp, i / 8, int(i % 8), [&](int64_t j, int64_t idx) {
    load_lane(k + (hsel(hc.k, h) * n + j) * d, d, kj, lane);
    const float qk = lane_dot(qi, kj), dqk = lane_dot(dqi, kj);
    load_lane(dk + (hsel(hd.k, h) * n + j) * d, d, kj, lane);
    const float qdk = lane_dot(qi, kj);
    const float s = scale * qk + (has_bias ? to_f32<T>(bias[hsel(hc.b, h) * nnz + idx]) : 0.f);
    const float p = __expf(s - li);
    const float ds = scale * (dqk + qdk) + (has_bias ? to_f32<T>(dbias[hsel(hd.b, h) * nnz + idx]) : 0.f);
    c += p * ds;
    load_lane(v + (hsel(hc.v, h) * n + j) * dv, dv, vj, lane);
#pragma unroll
    for (int f = 0; f < kMaxPerLane; ++f) { a1[f] += p * ds * vj[f]; of[f] += p * vj[f]; }
    load_lane(dvv + (hsel(hd.v, h) * n + j) * dv, dv, vj, lane);
#pragma unroll
    for (int f = 0; f < kMaxPerLane; ++f) a2[f] += p * vj[f];
  });
  T* orow = dout + (h * m + i) * dv;
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f)
    if (lane + 32 * f < dv) orow[lane + 32 * f] = from_f32<T>(a1[f] - c * of[f] + a2[f]);
}

unsigned grid_for(int64_t units) { return unsigned((units + kWarps - 1) / kWarps); }

// Split-window partials of the tensor-core forward: slots for the schedule's first `cap` items
// (split items are its prefix): O [cap, heads, 8, dv] fp32, (max, sum) [cap, heads, 8] float2,
// then [cap, heads] counters.
struct SplitWorkspace {
  float* ws;
  float2* ws_ml;
  int* done;
  int64_t cap;
};
constexpr int64_t kSplitWorkspaceBytes = 128 << 20;

template <class T, int D>
void launch_tc(cudaStream_t st, const T* q, const T* k, const T* v, const T* b,
               T* o, float* l, const PatternView& p, int64_t heads, Heads hc, int64_t m,
               int64_t n, int64_t nnz, float scale, int has_bias, const SplitWorkspace& sw,
               bool pf, bool grouped) {
  // JAXSPARSE_TC_ATTN_HEAD_MAJOR=0 (benchmarks): a window's heads adjacent, the order before
  // session 12 (NOTES: head-major was 10% faster at d=128 on R-MAT).
  // A dependent launch (its launch hides behind the previous kernel's tail) unless the counters'
  // memset comes between.
  auto kernel = pf ? attn_fwd_tc<T, D, D, true> : attn_fwd_tc<T, D, D, false>;
  const unsigned grid = grid_for(items_per_head(p.num_items, grouped) * heads);
  launch_kernel(sw.cap == 0, kernel, grid, 32 * kWarps, grouped ? kGroupSmemBytes<D> : 0, st,
                q, k, v, b, o, l, p.window_cols, p.window_block_ptr, p.block_bitmap,
                p.block_value_ptr, p.schedule, p.num_items, heads, hc, m, n, nnz, scale, has_bias,
                sw.ws, sw.ws_ml, sw.done, sw.cap, env_int("JAXSPARSE_TC_ATTN_HEAD_MAJOR", 1),
                int(grouped));
}

}  // namespace

// Split windows' workspace of the fused forward (tensor-core path: 16-bit, d == dv in {32, 64,
// 128}; JAXSPARSE_TC_ATTN_SPLIT=0, for tests and benchmarks: no merges, whole windows per warp):
// per slot and head, 8 rows of unnormalised O, then of (running max, sum), then a piece counter per
// slot and head. Slots beyond the cap are windows done whole by their first piece. A grouped
// schedule merges in shared memory and needs none.
struct SplitLayout {
  int64_t cap;
  size_t o_bytes, done_offset, total_bytes;  // O, then (max, sum), then counters
  bool grouped;                              // merges inside CTAs
};

static SplitLayout attention_split(int esize, int64_t d, int64_t dv, int64_t heads,
                                   int64_t num_items, bool grouped) {
  const bool tc = esize == 2 && d == dv && (d == 32 || d == 64 || d == 128) && num_items > 0;
  const int64_t slot_bytes = heads * 8 * (dv + 2) * 4 + heads * 4;
  SplitLayout l{0, 0, 0, 0, false};
  const bool split = tc && env_int("JAXSPARSE_TC_ATTN_SPLIT", 1) != 0;
  l.grouped = split && grouped;
  if (split && !grouped)
    l.cap = std::min<int64_t>(num_items, kSplitWorkspaceBytes / slot_bytes);
  l.o_bytes = size_t(l.cap * heads * 8 * dv) * 4;
  l.done_offset = l.o_bytes + size_t(l.cap * heads * 8) * 8;
  l.total_bytes = l.done_offset + size_t(l.cap * heads) * 4;
  return l;
}

int64_t attention_workspace_bytes(int esize, int64_t d, int64_t dv, int64_t heads,
                                  int64_t num_items, bool grouped) {
  return int64_t(attention_split(esize, d, dv, heads, num_items, grouped).total_bytes);
}

static ffi::Error attention_fwd_cuda(cudaStream_t st, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                     ffi::AnyBuffer v, ffi::AnyBuffer bias, I32 wcp, I32 wc,
                                     I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                     ffi::Result<ffi::AnyBuffer> o,
                                     ffi::Result<ffi::Buffer<ffi::F32>> lse,
                                     ffi::Result<ffi::AnyBuffer> workspace, float scale,
                                     int32_t has_bias, int32_t grouped) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const int64_t heads = o->dimensions()[0], m = o->dimensions()[1], dv = o->dimensions()[2];
  const int64_t n = k.dimensions()[1], d = q.dimensions()[2], nnz = bias.dimensions()[1];
  const Heads hc{q.dimensions()[0], k.dimensions()[0], v.dimensions()[0], bias.dimensions()[0]};
  if (d > 32 * kMaxPerLane || dv > 32 * kMaxPerLane)
    return ffi::Error::InvalidArgument("sparse_attention (CUDA): d and dv must be <= 256");
  if (heads == 0 || m == 0) return ffi::Error::Success();
  const int esize = q.element_type() == ffi::DataType::F32 ? 4 : 2;
  const SplitLayout layout = attention_split(esize, d, dv, heads, p.num_items, grouped != 0);
  if (workspace->size_bytes() < layout.total_bytes)
    return ffi::Error::InvalidArgument(
        "sparse_attention: workspace smaller than the launch needs (JAXSPARSE_TC_ATTN_SPLIT "
        "changed after the program was compiled?)");
  SplitWorkspace sw{nullptr, nullptr, nullptr, layout.cap};
  if (sw.cap > 0) {
    char* const mem = static_cast<char*>(workspace->untyped_data());
    sw.ws = reinterpret_cast<float*>(mem);
    sw.ws_ml = reinterpret_cast<float2*>(mem + layout.o_bytes);
    sw.done = reinterpret_cast<int*>(mem + layout.done_offset);
    if (cudaMemsetAsync(sw.done, 0, layout.total_bytes - layout.done_offset, st) != cudaSuccess)
      return ffi::Error::Internal("sparse_attention: workspace memset failed");
  }
  // The next block pair's columns load one pair ahead where the pattern has kSmallGraphNnz
  // condensed columns (K/V row gathers per head) or more: R-MAT -4..-10% (NOTES, session 13);
  // Cora read slower with it in the one A/B run. JAXSPARSE_TC_ATTN_PREFETCH=0|1 forces either.
  const bool pf = env_int("JAXSPARSE_TC_ATTN_PREFETCH", wc.element_count() >= kSmallGraphNnz) != 0;
  ffi::Error e = dispatch_device_float(q.element_type(), "sparse_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* qp = static_cast<const T*>(q.untyped_data());
    const T* kp = static_cast<const T*>(k.untyped_data());
    const T* vp = static_cast<const T*>(v.untyped_data());
    const T* bp = static_cast<const T*>(bias.untyped_data());
    T* op = static_cast<T*>(o->untyped_data());
    float* lp = lse->typed_data();
    if constexpr (sizeof(T) == 2) {
      if (d == dv && (d == 32 || d == 64 || d == 128) && p.num_items > 0) {
        const bool gr = layout.grouped;
        if (d == 32) launch_tc<T, 32>(st, qp, kp, vp, bp, op, lp, p, heads, hc, m, n, nnz, scale, has_bias, sw, pf, gr);
        if (d == 64) launch_tc<T, 64>(st, qp, kp, vp, bp, op, lp, p, heads, hc, m, n, nnz, scale, has_bias, sw, pf, gr);
        if (d == 128) launch_tc<T, 128>(st, qp, kp, vp, bp, op, lp, p, heads, hc, m, n, nnz, scale, has_bias, sw, pf, gr);
        return;
      }
    }
    attn_fwd_scalar<T><<<grid_for(m * heads), 32 * kWarps, 0, st>>>(
        qp, kp, vp, bp, op, lp, p.window_col_ptr, p.window_cols, p.window_block_ptr,
        p.block_bitmap, p.block_value_ptr, heads, hc, m, n, d, dv, nnz, scale, has_bias);
  });
  if (e.failure()) return e;
  return launch_status("sparse_attention forward");
}

static ffi::Error attention_jvp_cuda(cudaStream_t st, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                     ffi::AnyBuffer v, ffi::AnyBuffer bias, ffi::AnyBuffer o,
                                     ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dq,
                                     ffi::AnyBuffer dk, ffi::AnyBuffer dvv, ffi::AnyBuffer dbias,
                                     I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                     ffi::Result<ffi::AnyBuffer> dout, float scale,
                                     int32_t has_bias) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const int64_t heads = dout->dimensions()[0], m = dout->dimensions()[1];
  const int64_t dv = dout->dimensions()[2], n = k.dimensions()[1], d = q.dimensions()[2];
  const int64_t nnz = bias.dimensions()[1];
  const Heads hc{q.dimensions()[0], k.dimensions()[0], v.dimensions()[0], bias.dimensions()[0]};
  const Heads hd{dq.dimensions()[0], dk.dimensions()[0], dvv.dimensions()[0], dbias.dimensions()[0]};
  if (d > 32 * kMaxPerLane || dv > 32 * kMaxPerLane)
    return ffi::Error::InvalidArgument("sparse_attention (CUDA): d and dv must be <= 256");
  if (heads == 0 || m == 0) return ffi::Error::Success();
  ffi::Error e = dispatch_device_float(q.element_type(), "sparse_attention", [&](auto tag) {
    using T = decltype(tag);
    attn_jvp_scalar<T><<<grid_for(m * heads), 32 * kWarps, 0, st>>>(
        static_cast<const T*>(q.untyped_data()), static_cast<const T*>(k.untyped_data()),
        static_cast<const T*>(v.untyped_data()), static_cast<const T*>(bias.untyped_data()),
        lse.typed_data(), static_cast<const T*>(dq.untyped_data()),
        static_cast<const T*>(dk.untyped_data()), static_cast<const T*>(dvv.untyped_data()),
        static_cast<const T*>(dbias.untyped_data()), static_cast<T*>(dout->untyped_data()),
        p.window_col_ptr, p.window_cols, p.window_block_ptr, p.block_bitmap, p.block_value_ptr,
        heads, hc, hd, lse.dimensions()[0], m, n, d, dv, nnz, scale, has_bias);
  });
  if (e.failure()) return e;
  return launch_status("sparse_attention jvp");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionFwdCuda, attention_fwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()  // workspace [bytes]
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("has_bias")
                                  .Attr<int32_t>("grouped"),  // the schedule is grouped
                              JAXSPARSE_TC_CAPTURABLE);

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionJvpCuda, attention_jvp_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("has_bias"),
                              JAXSPARSE_TC_CAPTURABLE);


}  // namespace jaxsparse_tc
