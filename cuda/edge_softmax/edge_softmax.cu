// CUDA edge softmax over the format (docs/FORMAT.md): one warp per (window, head). A window's
// values are contiguous (its blocks', in order), so the warp's lanes stride over them, coalesced,
// reading each value's row from the per-value rows array; per-row max / sum for the window's 8
// rows stay in registers and warp reductions combine them. A window of up to kHeld values per
// lane is loaded once and its three passes (max, sum, write) run on registers; a larger one
// reloads per pass (L1/L2 hits). float32 math. edge_softmax_bwd: out = y * (t - rowsum(y * t)),
// the same walk, two passes.
// (The first version walked the blocks: a lane decoded its blocks' bitmaps one value at a
// time, a chain of dependent loads per block, three times over; Cora's hub window took ~15 us.)
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "common/format.h"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = 4;
constexpr int kHeld = 8;   // values per lane held in registers across passes
constexpr int kNoRow = 8;  // a register slot past the window's values

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The value range [begin, end) of window w (its blocks' values are contiguous), its block
// pointers folded into [0, blocks] and its value pointers into [0, nnz] (bounds.cuh).
__device__ __forceinline__ int2 window_values(const int32_t* wbp, const int32_t* bvp, int64_t w,
                                              int blocks, int nnz) {
  const int b0 = clamp_to(wbp[w], 0, blocks), b1 = clamp_to(wbp[w + 1], 0, blocks);
  const int begin = clamp_to(bvp[b0], 0, nnz);
  return make_int2(begin, clamp_to(bvp[b1], begin, nnz));
}

// A chunk of a window's values: lane `lane` holds values base + lane + 32 k, k < kHeld, and
// their rows in the window (kNoRow past the end). NV arrays of values per chunk (softmax 1,
// backward 2).
template <class T, int NV>
struct Chunk {
  float x[NV][kHeld];
  int r[kHeld];

  __device__ __forceinline__ void load(const T* const (&src)[NV], const int32_t* rows, int base,
                                       int end, int lane) {
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int i = base + lane + 32 * k;
      const bool ok = i < end;
      r[k] = ok ? rows[i] & 7 : kNoRow;
#pragma unroll
      for (int a = 0; a < NV; ++a) x[a][k] = ok ? to_f32<T>(src[a][i]) : 0.f;
    }
  }
};

// f(k): once per held value, for every chunk of [begin, end), the chunk held in c (loaded
// here unless the window is one chunk and `loaded`).
template <class T, int NV, class F>
__device__ __forceinline__ void each_chunk(Chunk<T, NV>& c, const T* const (&src)[NV],
                                           const int32_t* rows, int2 range, int lane, bool loaded,
                                           F&& f) {
  constexpr int kSpan = 32 * kHeld;
  const bool one = range.y - range.x <= kSpan;
  for (int base = range.x; base < range.y; base += kSpan) {
    if (!(one && loaded)) c.load(src, rows, base, range.y, lane);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) f(k, base + lane + 32 * k);
  }
}

// The per-row slot of a held value's row (registers indexed by unrolled compares, not memory).
template <class F>
__device__ __forceinline__ void at_row(int r, F&& f) {
#pragma unroll
  for (int rr = 0; rr < 8; ++rr)
    if (rr == r) f(rr);
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    edge_softmax_kernel(const T* __restrict__ v, T* __restrict__ out, const int32_t* wbp,
                        const int32_t* bvp, const int32_t* __restrict__ rows, int64_t W,
                        int64_t heads, int64_t nnz, int blocks, int values) {
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= W * heads) return;
  const int64_t w = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  const T* const src[1] = {v + h * nnz};
  T* oh = out + h * nnz;
  const int2 range = window_values(wbp, bvp, w, blocks, values);
  float mx[8], sm[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) mx[r] = -FLT_MAX, sm[r] = 0.f;
  Chunk<T, 1> c;
  each_chunk(c, src, rows, range, lane, false, [&](int k, int) {
    at_row(c.r[k], [&](int rr) { mx[rr] = fmaxf(mx[rr], c.x[0][k]); });
  });
#pragma unroll
  for (int r = 0; r < 8; ++r) mx[r] = warp_max(mx[r]);
  each_chunk(c, src, rows, range, lane, true, [&](int k, int) {
    at_row(c.r[k], [&](int rr) { sm[rr] += __expf(c.x[0][k] - mx[rr]); });
  });
  // A row with a finite maximum has sum >= 1. NaN or +inf logits make the sum NaN (fmaxf drops
  // NaN from the max, but exp(NaN - max) and exp(inf - inf) are NaN), and so every value of the
  // row; a row without values or with only -inf ones sums to 0 and gives zeros.
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const float s = warp_sum(sm[r]);
    sm[r] = s == 0.f ? 0.f : 1.0f / s;
  }
  each_chunk(c, src, rows, range, lane, true, [&](int k, int i) {
    at_row(c.r[k], [&](int rr) { oh[i] = from_f32<T>(__expf(c.x[0][k] - mx[rr]) * sm[rr]); });
  });
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    edge_softmax_bwd_kernel(const T* __restrict__ y, const T* __restrict__ t, T* __restrict__ out,
                            const int32_t* wbp, const int32_t* bvp,
                            const int32_t* __restrict__ rows, int64_t W, int64_t heads, int64_t hy,
                            int64_t ht, int64_t nnz, int blocks, int values) {
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= W * heads) return;
  const int64_t w = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  const T* const src[2] = {y + (hy == 1 ? 0 : h) * nnz, t + (ht == 1 ? 0 : h) * nnz};
  T* oh = out + h * nnz;
  const int2 range = window_values(wbp, bvp, w, blocks, values);
  float dot[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) dot[r] = 0.f;
  Chunk<T, 2> c;
  each_chunk(c, src, rows, range, lane, false, [&](int k, int) {
    at_row(c.r[k], [&](int rr) { dot[rr] += c.x[0][k] * c.x[1][k]; });
  });
#pragma unroll
  for (int r = 0; r < 8; ++r) dot[r] = warp_sum(dot[r]);
  each_chunk(c, src, rows, range, lane, true, [&](int k, int i) {
    at_row(c.r[k], [&](int rr) { oh[i] = from_f32<T>(c.x[0][k] * (c.x[1][k] - dot[rr])); });
  });
}

}  // namespace

namespace {

// Windows, blocks and the value positions a window's range may cover (the values' and the rows
// array's), from the buffers' counts (bounds.cuh).
struct SoftmaxBounds {
  int64_t windows;
  int blocks, values;
};
SoftmaxBounds softmax_bounds(I32 wbp, I32 bvp, I32 rows, int64_t nnz) {
  return {int64_t(wbp.element_count()) - 1, count_int(int64_t(bvp.element_count()) - 1),
          count_int(std::min<int64_t>(nnz, rows.element_count()))};
}

}  // namespace

static ffi::Error edge_softmax_cuda(cudaStream_t stream, ffi::AnyBuffer values, I32 wcp, I32 wc,
                                    I32 wbp, U32 bitmap, I32 bvp, I32 schedule, I32 rows,
                                    ffi::Result<ffi::AnyBuffer> out) {
  if (auto err = check_aligned(
          "edge_softmax",
          {operand("values", values), operand("window_block_ptr", wbp),
           operand("block_value_ptr", bvp), operand("rows", rows), operand("out", *out)});
      err.failure())
    return err;
  const int64_t heads = values.dimensions()[0], nnz = values.dimensions()[1];
  const SoftmaxBounds sb = softmax_bounds(wbp, bvp, rows, nnz);
  const int64_t W = sb.windows;
  if (out->element_type() != values.element_type())
    return ffi::Error::InvalidArgument("edge_softmax: values and out must share a dtype");
  if (W <= 0 || heads == 0 || nnz == 0) return ffi::Error::Success();
  const int64_t units = W * heads;
  const unsigned grid = unsigned((units + kWarps - 1) / kWarps);
  ffi::Error e = dispatch_device_float(values.element_type(), "edge_softmax", [&](auto tag) {
    using T = decltype(tag);
    edge_softmax_kernel<T><<<grid, 32 * kWarps, 0, stream>>>(
        static_cast<const T*>(values.untyped_data()), static_cast<T*>(out->untyped_data()),
        wbp.typed_data(), bvp.typed_data(), rows.typed_data(), W, heads, nnz, sb.blocks, sb.values);
  });
  if (e.failure()) return e;
  return launch_status("edge_softmax");
}

static ffi::Error edge_softmax_bwd_cuda(cudaStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer t,
                                        I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                        I32 rows, ffi::Result<ffi::AnyBuffer> out) {
  if (auto err = check_aligned(
          "edge_softmax_bwd",
          {operand("y", y), operand("t", t), operand("window_block_ptr", wbp),
           operand("block_value_ptr", bvp), operand("rows", rows), operand("out", *out)});
      err.failure())
    return err;
  const int64_t heads = out->dimensions()[0], nnz = out->dimensions()[1];
  const SoftmaxBounds sb = softmax_bounds(wbp, bvp, rows, nnz);
  const int64_t W = sb.windows;
  if (y.element_type() != t.element_type() || out->element_type() != y.element_type())
    return ffi::Error::InvalidArgument("edge_softmax_bwd: y, t and out must share a dtype");
  if (W <= 0 || heads == 0 || nnz == 0) return ffi::Error::Success();
  const int64_t units = W * heads;
  const unsigned grid = unsigned((units + kWarps - 1) / kWarps);
  ffi::Error e = dispatch_device_float(y.element_type(), "edge_softmax", [&](auto tag) {
    using T = decltype(tag);
    edge_softmax_bwd_kernel<T><<<grid, 32 * kWarps, 0, stream>>>(
        static_cast<const T*>(y.untyped_data()), static_cast<const T*>(t.untyped_data()),
        static_cast<T*>(out->untyped_data()), wbp.typed_data(), bvp.typed_data(), rows.typed_data(),
        W, heads, y.dimensions()[0], t.dimensions()[0], nnz, sb.blocks, sb.values);
  });
  if (e.failure()) return e;
  return launch_status("edge_softmax_bwd");
}

// Both read each value's row (rows [nnz]) after the pattern.
XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxCuda, edge_softmax_cuda,
                              JAXSPARSE_TC_BIND_EDGE_SOFTMAX(JAXSPARSE_TC_CUDA_CTX, .Arg<I32>(),
                                                             , ),
                              JAXSPARSE_TC_CAPTURABLE);

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxBwdCuda, edge_softmax_bwd_cuda,
                              JAXSPARSE_TC_BIND_EDGE_SOFTMAX_BWD(JAXSPARSE_TC_CUDA_CTX, .Arg<I32>(),
                                                                 , ),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
