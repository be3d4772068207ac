// CUDA edge softmax over the format (docs/FORMAT.md): one warp per (window, head). The window's
// values are contiguous (blocks of the window, in order); lanes take blocks round-robin and
// decode each block's bitmap (bit c*8+r: row r), keeping per-row max / sum for the window's 8
// rows in registers; warp reductions combine them. Three passes over the window's values
// (max, sum, write) -- the second and third hit L1/L2. float32 math.
// edge_softmax_bwd: out = y * (t - rowsum(y * t)), same walk, two passes.
#include <cfloat>
#include <cstdint>

#include "jaxsparse_tc/ffi_cuda.cuh"
#include "jaxsparse_tc/bitmap.cuh"
#include "jaxsparse_tc/cuda_common.cuh"
#include "jaxsparse_tc/format.h"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = 4;

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

// f(row, value_index) for every nonzero of the window's blocks handled by this lane.
template <class F>
__device__ __forceinline__ void lane_walk(const int32_t* wbp, const uint32_t* bitmap,
                                          const int32_t* bvp, int64_t w, int lane, F&& f) {
  for (int64_t b = wbp[w] + lane; b < wbp[w + 1]; b += 32) {
    uint64_t bits = load_block_bits(bitmap, b);
    int64_t idx = bvp[b];
    while (bits) {
      const int bit = __ffsll(static_cast<long long>(bits)) - 1;
      bits &= bits - 1;
      f(bit & 7, idx++);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
edge_softmax_kernel(const T* __restrict__ v, T* __restrict__ out, const int32_t* wbp,
                    const uint32_t* bitmap, const int32_t* bvp, int64_t W, int64_t heads,
                    int64_t nnz) {
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= W * heads) return;
  const int64_t w = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  const T* vh = v + h * nnz;
  T* oh = out + h * nnz;
  float mx[8], sm[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) mx[r] = -FLT_MAX, sm[r] = 0.f;
  lane_walk(wbp, bitmap, bvp, w, lane, [&](int r, int64_t i) {
    const float x = to_f32<T>(vh[i]);
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) if (rr == r) mx[rr] = fmaxf(mx[rr], x);
  });
#pragma unroll
  for (int r = 0; r < 8; ++r) mx[r] = warp_max(mx[r]);
  lane_walk(wbp, bitmap, bvp, w, lane, [&](int r, int64_t i) {
    const float x = to_f32<T>(vh[i]);
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) if (rr == r) sm[rr] += __expf(x - mx[rr]);
  });
#pragma unroll
  for (int r = 0; r < 8; ++r) sm[r] = 1.0f / warp_sum(sm[r]);
  lane_walk(wbp, bitmap, bvp, w, lane, [&](int r, int64_t i) {
    const float x = to_f32<T>(vh[i]);
    float y = 0.f;
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) if (rr == r) y = __expf(x - mx[rr]) * sm[rr];
    oh[i] = from_f32<T>(y);
  });
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
edge_softmax_bwd_kernel(const T* __restrict__ y, const T* __restrict__ t, T* __restrict__ out,
                        const int32_t* wbp, const uint32_t* bitmap, const int32_t* bvp,
                        int64_t W, int64_t heads, int64_t hy, int64_t ht, int64_t nnz) {
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= W * heads) return;
  const int64_t w = unit / heads, h = unit % heads;
  const int lane = threadIdx.x % 32;
  const T* yh = y + (hy == 1 ? 0 : h) * nnz;
  const T* th = t + (ht == 1 ? 0 : h) * nnz;
  T* oh = out + h * nnz;
  float dot[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) dot[r] = 0.f;
  lane_walk(wbp, bitmap, bvp, w, lane, [&](int r, int64_t i) {
    const float p = to_f32<T>(yh[i]) * to_f32<T>(th[i]);
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) if (rr == r) dot[rr] += p;
  });
#pragma unroll
  for (int r = 0; r < 8; ++r) dot[r] = warp_sum(dot[r]);
  lane_walk(wbp, bitmap, bvp, w, lane, [&](int r, int64_t i) {
    float d = 0.f;
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) if (rr == r) d = dot[rr];
    oh[i] = from_f32<T>(to_f32<T>(yh[i]) * (to_f32<T>(th[i]) - d));
  });
}

}  // namespace

static ffi::Error edge_softmax_cuda(cudaStream_t stream, ffi::AnyBuffer values, I32 wcp, I32 wc,
                                    I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                    ffi::Result<ffi::AnyBuffer> out) {
  const int64_t heads = values.dimensions()[0], nnz = values.dimensions()[1];
  const int64_t W = int64_t(wcp.element_count()) - 1;
  if (out->element_type() != values.element_type())
    return ffi::Error::InvalidArgument("edge_softmax: values and out must share a dtype");
  if (W <= 0 || heads == 0 || nnz == 0) return ffi::Error::Success();
  const int64_t units = W * heads;
  const unsigned grid = unsigned((units + kWarps - 1) / kWarps);
  ffi::Error e = dispatch_device_float(values.element_type(), "edge_softmax", [&](auto tag) {
    using T = decltype(tag);
    edge_softmax_kernel<T><<<grid, 32 * kWarps, 0, stream>>>(
        static_cast<const T*>(values.untyped_data()), static_cast<T*>(out->untyped_data()),
        wbp.typed_data(), bitmap.typed_data(), bvp.typed_data(), W, heads, nnz);
  });
  if (e.failure()) return e;
  return launch_status("edge_softmax");
}

static ffi::Error edge_softmax_bwd_cuda(cudaStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer t,
                                        I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp,
                                        I32 schedule, ffi::Result<ffi::AnyBuffer> out) {
  const int64_t heads = out->dimensions()[0], nnz = out->dimensions()[1];
  const int64_t W = int64_t(wcp.element_count()) - 1;
  if (y.element_type() != t.element_type() || out->element_type() != y.element_type())
    return ffi::Error::InvalidArgument("edge_softmax_bwd: y, t and out must share a dtype");
  if (W <= 0 || heads == 0 || nnz == 0) return ffi::Error::Success();
  const int64_t units = W * heads;
  const unsigned grid = unsigned((units + kWarps - 1) / kWarps);
  ffi::Error e = dispatch_device_float(y.element_type(), "edge_softmax", [&](auto tag) {
    using T = decltype(tag);
    edge_softmax_bwd_kernel<T><<<grid, 32 * kWarps, 0, stream>>>(
        static_cast<const T*>(y.untyped_data()), static_cast<const T*>(t.untyped_data()),
        static_cast<T*>(out->untyped_data()), wbp.typed_data(), bitmap.typed_data(),
        bvp.typed_data(), W, heads, y.dimensions()[0], t.dimensions()[0], nnz);
  });
  if (e.failure()) return e;
  return launch_status("edge_softmax_bwd");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxCuda, edge_softmax_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // values [H, nnz]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>(),
                              JAXSPARSE_TC_CAPTURABLE);

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxBwdCuda, edge_softmax_bwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // y [Hy, nnz]
                                  .Arg<ffi::AnyBuffer>()  // t [Ht, nnz]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>(),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
