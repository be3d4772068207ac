// CUDA SpMM: out[h] = A_h @ X_h on the window/bitmap-block format (docs/FORMAT.md): the handler
// and its launches. The kernels: rows.cuh (CUDA cores on the pattern's row view: sparse blocks,
// exact float32), windows_async.cuh and windows_registers.cuh (tensor cores on the windows),
// exact_f32.cuh (exact float32 on the windows). Which one runs, and the workspace: plan/spmm.h.
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/format.h"
#include "cuda/common/ffi_cuda.cuh"
#include "plan/common.h"
#include "cuda/common/row_view.cuh"
#include "cuda/spmm/exact_f32.cuh"
#include "cuda/spmm/params.cuh"
#include "plan/spmm.h"
#include "cuda/spmm/rows.cuh"
#include "cuda/spmm/windows_async.cuh"
#include "cuda/spmm/windows_registers.cuh"

namespace jaxsparse_tc {
namespace spmm {
namespace {

// spmm_tc's register cap: 128 registers (4 CTAs of kWarps warps per SM) for 16-bit types, none
// for tf32 (windows_registers.cuh).
template <class T, int MT>
void launch_registers_mt(const SpmmParams& p, cudaStream_t stream) {
  const int64_t warps = p.num_items * p.nslab;
  const dim3 grid(unsigned((warps + kWarps - 1) / kWarps), unsigned(std::min(p.heads, 65535)));
  spmm_tc<T, MT, sizeof(T) == 2 ? 4 : 1><<<grid, kWarps * 32, 0, stream>>>(p);
}

template <class T>
void launch_registers(const SpmmParams& p, int mt, cudaStream_t stream) {
  if (mt == 1)
    launch_registers_mt<T, 1>(p, stream);
  else if (mt == 2)
    launch_registers_mt<T, 2>(p, stream);
  else
    launch_registers_mt<T, 4>(p, stream);
}

constexpr int kAsyncWarps = 2;  // warps per CTA (each warp owns its shared-memory ring)

// Persistent: at most the CTAs the device holds at once (one unit per warp where that count is
// unknown).
template <class T, int SLAB>
void launch_async_slab(const SpmmParams& p, cudaStream_t stream) {
  using Sh = AsyncShape<T, SLAB, kAsyncWarps>;
  constexpr auto kernel = spmm_async<T, SLAB, kAsyncWarps>;
  const int ctas = resident_ctas<kernel>(kAsyncWarps * 32, Sh::kCtaBytes);
  const int64_t units = int64_t(p.heads) * p.num_items * p.nslab;
  int64_t grid = (units + kAsyncWarps - 1) / kAsyncWarps;
  grid = std::min<int64_t>(grid, ctas > 0 ? ctas : 0x7fffffff);
  kernel<<<unsigned(grid), kAsyncWarps * 32, Sh::kCtaBytes, stream>>>(p);
}

template <class T>
void launch_async(const SpmmParams& p, int slab, cudaStream_t stream) {
  if (slab == 32)
    launch_async_slab<T, 32>(p, stream);
  else if (slab == 64)
    launch_async_slab<T, 64>(p, stream);
  else if constexpr (sizeof(T) == 2)
    launch_async_slab<T, 128>(p, stream);
}

// Row-kernel grid: groups stride over the items, at most as many CTAs as the device holds at
// once (per kernel and device, asked once). Persistent groups prefetch their next item's
// schedule entry and first entries (measured on H100, fp16 d=128: rmat20 596 us against 629
// with one item per group; rmat17 143 against 137).
template <class T, int L, bool VEC>
void launch_rows_l(const SpmmParams& p, const RowView& rv, const RowSplit& rs,
                   cudaStream_t stream) {
  constexpr auto kernel = spmm_rows<T, L, VEC>;
  const int ctas = resident_ctas<kernel>(kRowThreads, 0);
  int64_t grid = row_ctas(rv.num_items, kRowThreads / L, ctas, int64_t(p.nslab) * p.heads);
  if (ctas > 0) grid = std::min<int64_t>(grid, ctas);
  kernel<<<dim3(unsigned(grid), unsigned(p.nslab), unsigned(p.heads)), kRowThreads, 0, stream>>>(
      p, rv, rs);
}

template <class T>
void launch_rows(const SpmmParams& p, const RowView& rv, const RowSplit& rs, int lanes,
                 cudaStream_t stream) {
  with_lanes(lanes, [&](auto l) {
    if (p.vec)
      launch_rows_l<T, l.value, true>(p, rv, rs, stream);
    else
      launch_rows_l<T, l.value, false>(p, rv, rs, stream);
  });
}

ffi::Error spmm_cuda(cudaStream_t stream, ffi::AnyBuffer values, ffi::AnyBuffer x, I32 wcp, I32 wc,
                     I32 wbp, U32 bitmap, I32 bvp, I32 schedule, I32 row_entries, I32 row_schedule,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                     int32_t precision, int32_t kernel) {
  KernelChoice choice;
  if (auto err = kernel_choice("spmm", kernel, choice); err.failure()) return err;
  const auto vd = values.dimensions(), xd = x.dimensions(), od = out->dimensions();
  if (vd.size() != 2 || xd.size() != 3 || od.size() != 3)
    return ffi::Error::InvalidArgument("spmm: expected values [Hv,nnz], x [Hx,n,d], out [H,m,d]");
  const auto dtype = x.element_type();
  if (values.element_type() != dtype || out->element_type() != dtype)
    return ffi::Error::InvalidArgument("spmm: values, x and out must share a dtype");
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::F16 && dtype != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument("spmm: unsupported dtype (float32, float16, bfloat16)");
  if (auto err = first_failure(
          {check_pattern_aligned("spmm", wcp, wc, wbp, bitmap, bvp, schedule),
           check_aligned(
               "spmm", {operand("values", values), operand("row_entries", row_entries),
                        operand("row_schedule", row_schedule), operand("workspace", *workspace)})});
      err.failure())
    return err;
  SpmmParams p{};
  p.values = values.untyped_data();
  p.x = x.untyped_data();
  p.out = out->untyped_data();
  p.nnz = vd[1];
  p.n = xd[1];
  p.d = xd[2];
  p.m = od[1];
  // The pattern's columns gather X's rows, its value positions read values.
  static_cast<KernelPattern&>(p) = kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule, p.n, p.nnz);
  const RowView rv = row_view(row_entries, row_schedule, p.m, p.n, p.nnz);
  const int64_t heads = od[0];
  p.heads = int(heads);
  p.v_head_stride = vd[0] == 1 ? 0 : p.nnz;
  p.x_head_stride = xd[0] == 1 ? 0 : p.n * p.d;
  if (heads == 0 || p.m == 0 || p.d == 0) return ffi::Error::Success();
  if (heads > 65535) return ffi::Error::InvalidArgument("spmm: at most 65535 heads");
  if (p.nnz == 0 || p.n == 0 || p.num_items == 0 || rv.num_items == 0) {
    // Nothing to add up (a valid pattern of such shapes has no nonzero; the kernels need a value
    // and an X row for every index they fold).
    if (cudaMemsetAsync(p.out, 0, size_t(heads * p.m * p.d) * (dtype == ffi::DataType::F32 ? 4 : 2),
                        stream) != cudaSuccess)
      return ffi::Error::Internal("spmm: memset failed");
    return ffi::Error::Success();
  }

  const bool exact = dtype == ffi::DataType::F32 && precision == int32_t(Precision::kHighest);
  const int esize = dtype == ffi::DataType::F32 ? 4 : 2;
  const PatternFeatures features{p.m, p.nnz, int64_t(wcp.element_count()) - 1,
                                 int64_t(bitmap.element_count()) / 2, int64_t(wc.element_count())};
  const SpmmShape shape{esize, exact, features, p.num_items, rv.num_items, p.d, heads};
  SpmmPlan plan;
  if (auto err = plan_spmm(shape, kernel, plan); err.failure()) return err;
  char* const ws = static_cast<char*>(workspace->untyped_data());
  if (workspace->size_bytes() < plan.workspace_bytes)
    return workspace_mismatch("spmm", workspace->size_bytes(), plan.workspace_bytes);
  const SpmmLaunch launch = spmm_launch(shape, plan, device_is_sm90_or_later(),
                                        reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
                                        reinterpret_cast<uintptr_t>(p.out) % 16 == 0);
  p.nslab = launch.nslab;
  p.vec = launch.vec;

  if (launch.kernel == SpmmKernel::kRows) {
    p.stream_max = plan.stream_max;
    RowSplit rs{};
    if (plan.row_slots > 0) {
      rs.ws = reinterpret_cast<float*>(ws);
      rs.count = reinterpret_cast<int*>(ws + plan.row_ws_bytes);
      rs.slots = count_int(plan.row_slots);
      if (cudaMemsetAsync(ws, 0, plan.workspace_bytes, stream) != cudaSuccess)
        return ffi::Error::Internal("spmm: workspace memset failed");
      const int64_t blocks = std::min<int64_t>((rv.num_items + 255) / 256, 1024);
      row_split_prep<<<unsigned(blocks), 256, 0, stream>>>(rv, rs, int(heads) * plan.row_nslab);
    }
    const ffi::Error e = dispatch_device_float(
        dtype, "spmm", [&](auto t) { launch_rows<decltype(t)>(p, rv, rs, plan.lanes, stream); });
    if (e.failure()) return e;
    return launch_status("spmm");
  }

  // Split-window workspace: slot = schedule index of a window's first piece, capped.
  p.cap = launch.window.cap;
  p.ws = reinterpret_cast<float*>(ws);
  p.done = reinterpret_cast<int*>(ws + launch.window.ws_bytes);
  p.slot_of = reinterpret_cast<int*>(ws + launch.window.ws_bytes + launch.window.done_bytes);
  split_prep<<<unsigned(std::min<int64_t>(p.num_items, 264)), 256, 0, stream>>>(p);
  if (launch.kernel == SpmmKernel::kExactF32) {
    const int64_t warps = p.num_items * p.nslab;
    const dim3 grid(unsigned((warps + kWarps - 1) / kWarps),
                    unsigned(std::min<int64_t>(heads, 65535)));
    spmm_f32_exact<<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    const ffi::Error e = dispatch_device_float(dtype, "spmm", [&](auto t) {
      using T = decltype(t);
      if (launch.kernel == SpmmKernel::kAsync)
        launch_async<T>(p, launch.slab, stream);
      else
        launch_registers<T>(p, launch.slab / 16, stream);
    });
    if (e.failure()) return e;
  }
  return launch_status("spmm");
}

}  // namespace
}  // namespace spmm

int64_t spmm_workspace_bytes(int esize, bool exact, int kernel, const PatternFeatures& pattern,
                             int64_t num_items, int64_t row_items, int64_t d, int64_t heads,
                             std::string* error) {
  SpmmPlan plan;
  const ffi::Error err =
      plan_spmm({esize, exact, pattern, num_items, row_items, d, heads}, kernel, plan);
  if (err.failure()) {
    *error = err.message();
    return -1;
  }
  return int64_t(plan.workspace_bytes);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    SpmmCuda, spmm::spmm_cuda,
    JAXSPARSE_TC_BIND_SPMM(JAXSPARSE_TC_CUDA_CTX, JAXSPARSE_TC_ROW_VIEW_ARGS,
                           .Ret<ffi::AnyBuffer>(),     // workspace (plan/spmm.h)
                           .Attr<int32_t>("kernel")),  // KernelChoice
    JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
