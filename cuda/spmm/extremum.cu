// CUDA max/min SpMM (spmm(A, X, reduce="max" | "min")): one warp per (8-row window, head, 32
// features). Each lane walks the window's condensed columns for its feature and keeps its 8 rows'
// best products and their format positions in registers. The CPU kernel
// (cpu/kernels/spmm_extremum.inc) is the specification: a min is the max of the negated
// products, the first position wins a tie, a NaN product replaces a number and stays, and a row
// without entries gives 0 and position -1. Every index read from the pattern is folded
// (bounds.cuh), so any content of its arrays stays in bounds.
#include <cstdint>

#include "common/format.h"
#include "cuda/common/bitmap.cuh"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace {

constexpr int kWarps = 4;

// Units: windows of out's rows (ceil(m / 8)) x heads x feature chunks; a window past the
// pattern's (only in a corrupt one) walks nothing and writes its zeros.
template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    spmm_extremum_kernel(const T* __restrict__ values, const T* __restrict__ x, T* __restrict__ out,
                         int32_t* __restrict__ arg, const KernelPattern p, int64_t windows,
                         int64_t heads, int64_t v_stride, int64_t x_stride, int64_t m, int64_t d,
                         bool walk, bool is_min) {
  const int64_t chunks = (d + 31) / 32;
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= windows * heads * chunks) return;
  const int64_t chunk = unit % chunks, rest = unit / chunks;
  const int64_t h = rest % heads;
  const int w = int(rest / heads);
  const int64_t k = chunk * 32 + threadIdx.x % 32;
  const bool on = k < d;
  const T* vh = values + h * v_stride;
  const T* xh = x + h * x_stride;
  const float sign = is_min ? -1.f : 1.f;
  float best[kWindowRows];
  int from[kWindowRows];
#pragma unroll
  for (int r = 0; r < kWindowRows; ++r) best[r] = 0.f, from[r] = -1;
  if (walk && w <= p.last_window) {
    const WindowSpan s = window_span(p, w);
    for (int b = s.wb; b < s.wend; ++b) {
      const uint64_t bits = load_block_bits(p.bitmap, b);
      const int vbase = p.bvp[b];
      int rank = 0;  // the block's values are in bit order: column by column, rows ascending
      for (int c = 0; c < kBlockCols; ++c) {
        const uint32_t mask = uint32_t(bits >> (8 * c)) & 0xffu;
        const int ci = kBlockCols * (b - s.wb) + c;
        if (mask == 0u || ci >= s.ncols) continue;
        const int col = clamp_last(p.wc[s.cb + ci], p.last_col);
        const float xv = on ? to_f32<T>(xh[int64_t(col) * d + k]) : 0.f;
#pragma unroll
        for (int r = 0; r < kWindowRows; ++r) {
          if (!((mask >> r) & 1u)) continue;
          const int pos = clamp_sum(vbase, rank++, p.last_value);
          const float prod = sign * to_f32<T>(vh[pos]) * xv;
          if (from[r] < 0 || prod > best[r] || (prod != prod && best[r] == best[r])) {
            best[r] = prod;
            from[r] = pos;
          }
        }
      }
    }
  }
  if (!on) return;
#pragma unroll
  for (int r = 0; r < kWindowRows; ++r) {
    const int64_t row = int64_t(w) * kWindowRows + r;
    if (row >= m) break;
    const int64_t o = (h * m + row) * d + k;
    out[o] = from_f32<T>(from[r] < 0 ? 0.f : sign * best[r]);
    arg[o] = from[r];
  }
}

}  // namespace

static ffi::Error spmm_extremum_cuda(cudaStream_t stream, ffi::AnyBuffer values, ffi::AnyBuffer x,
                                     I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<I32> arg,
                                     int32_t is_min) {
  constexpr const char* kOp = "spmm_extremum";
  const auto vd = values.dimensions(), xd = x.dimensions(), od = out->dimensions();
  const auto ad = arg->dimensions();
  if (vd.size() != 2 || xd.size() != 3 || od.size() != 3 || ad.size() != 3 || ad[0] != od[0] ||
      ad[1] != od[1] || ad[2] != od[2] || (vd[0] != 1 && vd[0] != od[0]) ||
      (xd[0] != 1 && xd[0] != od[0]) || xd[2] != od[2])
    return ffi::Error::InvalidArgument(
        "spmm_extremum: expected values [Hv,nnz], x [Hx,n,d], out and arg [H,m,d], Hv and Hx in "
        "{1, H}");
  const auto dtype = x.element_type();
  if (values.element_type() != dtype || out->element_type() != dtype)
    return ffi::Error::InvalidArgument("spmm_extremum: values, x and out must share a dtype");
  const int64_t heads = od[0], m = od[1], d = od[2], n = xd[1], nnz = vd[1];
  if (heads == 0 || m == 0 || d == 0) return ffi::Error::Success();
  if (auto err = first_failure({check_pattern_aligned(kOp, wcp, wc, wbp, bitmap, bvp, schedule),
                                check_aligned(kOp, {operand("values", values), operand("x", x),
                                                    operand("out", *out), operand("arg", *arg)})});
      err.failure())
    return err;
  const KernelPattern p = kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule, n, nnz);
  // Without a value or an X row nothing may be read: every row is then empty.
  const bool walk = nnz > 0 && n > 0 && p.last_window >= 0 && p.num_blocks > 0 && p.num_cols > 0;
  const int64_t windows = (m + kWindowRows - 1) / kWindowRows, chunks = (d + 31) / 32;
  const int64_t grid = (windows * heads * chunks + kWarps - 1) / kWarps;
  if (grid > INT32_MAX) return ffi::Error::InvalidArgument("spmm_extremum: too many rows x heads");
  const int64_t v_stride = vd[0] == 1 ? 0 : nnz, x_stride = xd[0] == 1 ? 0 : n * d;
  ffi::Error e = dispatch_device_float(dtype, kOp, [&](auto tag) {
    using T = decltype(tag);
    spmm_extremum_kernel<T><<<unsigned(grid), 32 * kWarps, 0, stream>>>(
        static_cast<const T*>(values.untyped_data()), static_cast<const T*>(x.untyped_data()),
        static_cast<T*>(out->untyped_data()), arg->typed_data(), p, windows, heads, v_stride,
        x_stride, m, d, walk, is_min != 0);
  });
  if (e.failure()) return e;
  return launch_status(kOp);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmExtremumCuda, spmm_extremum_cuda,
                              JAXSPARSE_TC_BIND_SPMM_EXTREMUM(JAXSPARSE_TC_CUDA_CTX, , , ),
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
