// Scalar attention kernels (float32 in, head sizes the fused forward does not take, and the
// jvp): CUDA cores, one warp per (row, head), lane holds features lane + 32 f, float32 math.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/format.h"
#include "cuda/attention/params.cuh"
#include "cuda/attention/tile.cuh"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace attention {

constexpr int kMaxPerLane = 8;  // d, dv <= 256

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <class T>
__device__ __forceinline__ void load_lane(const T* row, int64_t d, float (&x)[kMaxPerLane],
                                          int lane) {
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f) {
    const int64_t c = lane + 32 * f;
    x[f] = c < d ? to_f32<T>(row[c]) : 0.f;
  }
}
__device__ __forceinline__ float lane_dot(const float (&a)[kMaxPerLane],
                                          const float (&b)[kMaxPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f) s += a[f] * b[f];
  return warp_sum(s);
}

// f(col, value_index) for each nonzero of row r of window w, in order: w, the window's spans,
// its columns (into the gathered table's rows) and value positions folded into bounds
// (bounds.cuh; bits past the window's columns, which a valid bitmap has none of, end the block).
template <class F>
__device__ __forceinline__ void row_walk(const KernelPattern& a, int64_t w, int r, F&& f) {
  if (a.last_col < 0 || a.last_window < 0) return;  // no rows to gather, or no window
  const WindowSpan s = window_span(a, clamp_last(int(w), a.last_window));
  const uint64_t rmask = 0x0101010101010101ull << r;
  for (int b = s.wb; b < s.wend; ++b) {
    const uint64_t bits = load_block_bits(a.bitmap, b);
    uint64_t rb = bits & rmask;
    const int col0 = 8 * (b - s.wb);  // < ncols: one block per 8 columns (window_span)
    while (rb) {
      const int kb = __ffsll(static_cast<long long>(rb)) - 1;
      rb &= rb - 1;
      if (col0 + kb / 8 >= s.ncols) break;
      f(int64_t(clamp_last(a.wc[s.cb + col0 + kb / 8], a.last_col)),
        int64_t(clamp_sum(a.bvp[b], __popcll(bits & ((1ull << kb) - 1ull)), a.last_value)));
    }
  }
}

// The row's online softmax over its logits s (natural log domain): max m, sum l, and the
// weights' rescaling. m stays -inf until a logit above -inf comes, and its exponent base is then
// 0, so that -inf logits give weight 0 rather than exp(-inf + inf) = NaN. A NaN or +inf logit
// makes p (and so l and every output) NaN, as jax.nn.softmax does: fmaxf drops NaN from m, but
// exp(NaN - base) and exp(inf - inf) are NaN.
struct OnlineSoftmax {
  float m = -INFINITY, l = 0.f;

  // Takes logit s; returns (alpha, p): the factor for the sums so far and s's weight.
  __device__ __forceinline__ float2 add(float s) {
    const float mnew = fmaxf(m, s);
    const float base = mnew == -INFINITY ? 0.f : mnew;
    const float alpha = __expf(m - base);
    const float p = __expf(s - base);
    m = mnew;
    l = l * alpha + p;
    return make_float2(alpha, p);
  }
  // The row's log-sum-exp: +inf where no logit is finite (no entry, or all -inf), so that the
  // backward's exp(s - lse) is 0; NaN where l is.
  __device__ __forceinline__ float lse() const { return l == 0.f ? INFINITY : m + logf(l); }
};

template <class T>
__device__ __forceinline__ void fwd_scalar(const T* q, const T* k, const T* v, const float* bias,
                                           T* out, float* lse, const KernelPattern& a,
                                           int64_t heads, Heads hc, int64_t m, int64_t n, int64_t d,
                                           int64_t dv, int64_t nnz, float scale, int has_bias) {
  const int64_t unit = int64_t(blockIdx.x) * kAttnWarps + threadIdx.x / 32;
  if (unit >= m * heads) return;
  const int64_t i = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  float qi[kMaxPerLane], kj[kMaxPerLane], vj[kMaxPerLane], acc[kMaxPerLane] = {};
  load_lane(q + (hsel(hc.q, h) * m + i) * d, d, qi, lane);
  const T* kh = k + hsel(hc.k, h) * n * d;
  const T* vh = v + hsel(hc.v, h) * n * dv;
  const float* bh = bias + hsel(hc.b, h) * nnz;
  OnlineSoftmax sm;
  row_walk(a, i / 8, int(i % 8), [&](int64_t j, int64_t idx) {
    load_lane(kh + j * d, d, kj, lane);
    load_lane(vh + j * dv, dv, vj, lane);
    const float2 ap = sm.add(scale * lane_dot(qi, kj) + (has_bias ? bh[idx] : 0.f));
#pragma unroll
    for (int f = 0; f < kMaxPerLane; ++f) acc[f] = acc[f] * ap.x + ap.y * vj[f];
  });
  const float inv = sm.l > 0.f ? 1.0f / sm.l : 0.f;  // NaN l: acc is NaN too
  T* orow = out + (h * m + i) * dv;
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f)
    if (lane + 32 * f < dv) orow[lane + 32 * f] = from_f32<T>(acc[f] * inv);
  if (lane == 0) lse[h * m + i] = sm.lse();
}

template <class T>
__global__ void __launch_bounds__(32 * kAttnWarps) attn_fwd_scalar(const AttnFwdParams<T> p) {
  fwd_scalar<T>(p.q, p.k, p.v, p.bias, p.out, p.lse, p.a, p.heads, p.hc, p.m, p.n, p.d, p.dv, p.nnz,
                p.scale, p.has_bias);
}

// JVP: dO_i = sum_j P_ij dS_ij V_j - (sum_j P_ij dS_ij) O_i + sum_j P_ij dV_j. The bias's
// tangent is float32 like the bias (dbias_f32), or Q's dtype.
template <class T>
__device__ __forceinline__ void jvp_scalar(const T* q, const T* k, const T* v, const float* bias,
                                           const float* lse, const T* dq, const T* dk, const T* dvv,
                                           const void* dbias, int dbias_f32, T* dout,
                                           const KernelPattern& a, int64_t heads, Heads hc,
                                           Heads hd, int64_t hl, int64_t m, int64_t n, int64_t d,
                                           int64_t dv, int64_t nnz, float scale, int has_bias) {
  const int64_t unit = int64_t(blockIdx.x) * kAttnWarps + threadIdx.x / 32;
  if (unit >= m * heads) return;
  const int64_t i = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  float qi[kMaxPerLane], dqi[kMaxPerLane], kj[kMaxPerLane], vj[kMaxPerLane];
  float a1[kMaxPerLane] = {}, a2[kMaxPerLane] = {}, of[kMaxPerLane] = {};
  load_lane(q + (hsel(hc.q, h) * m + i) * d, d, qi, lane);
  load_lane(dq + (hsel(hd.q, h) * m + i) * d, d, dqi, lane);
  const float li = lse[hsel(hl, h) * m + i];  // +inf for a row without finite logits: p = 0
  float c = 0.f;
  row_walk(a, i / 8, int(i % 8), [&](int64_t j, int64_t idx) {
    load_lane(k + (hsel(hc.k, h) * n + j) * d, d, kj, lane);
    const float qk = lane_dot(qi, kj), dqk = lane_dot(dqi, kj);
    load_lane(dk + (hsel(hd.k, h) * n + j) * d, d, kj, lane);
    const float qdk = lane_dot(qi, kj);
    const float s = scale * qk + (has_bias ? bias[hsel(hc.b, h) * nnz + idx] : 0.f);
    const float p = __expf(s - li);
    float db = 0.f;
    if (has_bias) {
      const int64_t at = hsel(hd.b, h) * nnz + idx;
      db = dbias_f32 ? static_cast<const float*>(dbias)[at]
                     : to_f32<T>(static_cast<const T*>(dbias)[at]);
    }
    const float ds = scale * (dqk + qdk) + db;
    c += p * ds;
    load_lane(v + (hsel(hc.v, h) * n + j) * dv, dv, vj, lane);
#pragma unroll
    for (int f = 0; f < kMaxPerLane; ++f) {
      a1[f] += p * ds * vj[f];
      of[f] += p * vj[f];
    }
    load_lane(dvv + (hsel(hd.v, h) * n + j) * dv, dv, vj, lane);
#pragma unroll
    for (int f = 0; f < kMaxPerLane; ++f) a2[f] += p * vj[f];
  });
  T* orow = dout + (h * m + i) * dv;
#pragma unroll
  for (int f = 0; f < kMaxPerLane; ++f)
    if (lane + 32 * f < dv) orow[lane + 32 * f] = from_f32<T>(a1[f] - c * of[f] + a2[f]);
}

template <class T>
__global__ void __launch_bounds__(32 * kAttnWarps) attn_jvp_scalar(const AttnJvpParams<T> p) {
  jvp_scalar<T>(p.q, p.k, p.v, p.bias, p.lse, p.dq, p.dk, p.dvv, p.dbias, p.dbias_f32, p.dout, p.a,
                p.heads, p.hc, p.hd, p.hl, p.m, p.n, p.d, p.dv, p.nnz, p.scale, p.has_bias);
}

}  // namespace attention
}  // namespace jaxsparse_tc
