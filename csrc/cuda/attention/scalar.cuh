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
#include "cuda/common/cuda_common.cuh"

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
__device__ __forceinline__ void fwd_scalar(const T* q, const T* k, const T* v, const T* bias,
                                           T* out, float* lse, const int32_t* wcp,
                                           const int32_t* wc, const int32_t* wbp,
                                           const uint32_t* bitmap, const int32_t* bvp,
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

template <class T>
__global__ void __launch_bounds__(32 * kAttnWarps) attn_fwd_scalar(const AttnFwdParams<T> p) {
  fwd_scalar<T>(p.q, p.k, p.v, p.bias, p.out, p.lse, p.a.wcp, p.a.wc, p.a.wbp, p.a.bitmap, p.a.bvp,
                p.heads, p.hc, p.m, p.n, p.d, p.dv, p.nnz, p.scale, p.has_bias);
}

// JVP: dO_i = sum_j P_ij dS_ij V_j - (sum_j P_ij dS_ij) O_i + sum_j P_ij dV_j.
template <class T>
__device__ __forceinline__ void jvp_scalar(const T* q, const T* k, const T* v, const T* bias,
                                           const float* lse, const T* dq, const T* dk, const T* dvv,
                                           const T* dbias, T* dout, const int32_t* wcp,
                                           const int32_t* wc, const int32_t* wbp,
                                           const uint32_t* bitmap, const int32_t* bvp,
                                           int64_t heads, Heads hc, Heads hd, int64_t hl, int64_t m,
                                           int64_t n, int64_t d, int64_t dv, int64_t nnz,
                                           float scale, int has_bias) {
  const int64_t unit = int64_t(blockIdx.x) * kAttnWarps + threadIdx.x / 32;
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
    const float ds =
        scale * (dqk + qdk) + (has_bias ? to_f32<T>(dbias[hsel(hd.b, h) * nnz + idx]) : 0.f);
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
  jvp_scalar<T>(p.q, p.k, p.v, p.bias, p.lse, p.dq, p.dk, p.dvv, p.dbias, p.dout, p.a.wcp, p.a.wc,
                p.a.wbp, p.a.bitmap, p.a.bvp, p.heads, p.hc, p.hd, p.hl, p.m, p.n, p.d, p.dv, p.nnz,
                p.scale, p.has_bias);
}

}  // namespace attention
}  // namespace jaxsparse_tc
