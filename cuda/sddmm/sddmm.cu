// CUDA SDDMM: out[h, idx(i, j)] = <X_h[i], Y_h[j]> at A's nonzeros, in format order: the handler
// and its launches. The kernels: rows.cuh (CUDA cores on the pattern's row view: sparse blocks,
// exact float32), windows.cuh (tensor cores on the windows), exact_f32.cuh (exact float32 on the
// windows). Which one runs: plan/sddmm.h.
#include <algorithm>
#include <cstdint>

#include "cuda/common/ffi_cuda.cuh"
#include "plan/common.h"
#include "cuda/common/row_view.cuh"
#include "cuda/sddmm/exact_f32.cuh"
#include "cuda/sddmm/params.cuh"
#include "plan/sddmm.h"
#include "cuda/sddmm/rows.cuh"
#include "cuda/sddmm/windows.cuh"

namespace jaxsparse_tc {
namespace sddmm {
namespace {

// The grid covers the whole rows (NG per CTA, p.stream per group on large graphs) and the CTA
// items (row_ctas).
template <class T, class O, int L, int NS, bool SMALL, bool VEC>
void launch_rows_k(const SddmmParams& p, const RowView& rv, cudaStream_t stream) {
  constexpr auto kernel = sddmm_rows<T, O, L, NS, SMALL, VEC>;
  const int64_t grid = row_ctas(rv.num_items, int64_t(kRowThreads / L) * (SMALL ? 1 : p.stream),
                                resident_ctas<kernel>(kRowThreads, 0), p.heads);
  kernel<<<dim3(unsigned(grid), unsigned(p.heads)), kRowThreads, 0, stream>>>(p, rv);
}

template <class T, class O, bool SMALL, bool VEC>
void launch_rows_v(const SddmmParams& p, const RowView& rv, const SddmmPlan& plan,
                   cudaStream_t stream) {
  if (plan.slabs == 2) {
    launch_rows_k<T, O, 32, 2, SMALL, VEC>(p, rv, stream);
    return;
  }
  with_lanes(plan.lanes,
             [&](auto l) { launch_rows_k<T, O, l.value, 1, SMALL, VEC>(p, rv, stream); });
}

template <class T, class O>
void launch_rows(const SddmmParams& p, const RowView& rv, const SddmmPlan& plan,
                 cudaStream_t stream) {
  if (plan.small && p.vec)
    launch_rows_v<T, O, true, true>(p, rv, plan, stream);
  else if (plan.small)
    launch_rows_v<T, O, true, false>(p, rv, plan, stream);
  else if (p.vec)
    launch_rows_v<T, O, false, true>(p, rv, plan, stream);
  else
    launch_rows_v<T, O, false, false>(p, rv, plan, stream);
}

ffi::Error sddmm_cuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer y, I32 wcp, I32 wc,
                      I32 wbp, U32 bitmap, I32 bvp, I32 schedule, I32 row_entries, I32 row_schedule,
                      ffi::Result<ffi::AnyBuffer> out, int32_t precision, int32_t kernel) {
  KernelChoice choice;
  if (auto err = kernel_choice("sddmm", kernel, choice); err.failure()) return err;
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
  if (auto err = first_failure(
          {check_pattern_aligned("sddmm", wcp, wc, wbp, bitmap, bvp, schedule),
           check_aligned("sddmm", {operand("row_entries", row_entries),
                                   operand("row_schedule", row_schedule), operand("out", *out)})});
      err.failure())
    return err;
  SddmmParams p{};
  p.x = x.untyped_data();
  p.y = y.untyped_data();
  p.out = out->untyped_data();
  p.m = xd[1];
  p.d = xd[2];
  p.n = yd[1];
  p.nnz = od[1];
  // The pattern's columns gather Y's rows, its value positions address out.
  static_cast<KernelPattern&>(p) = kernel_pattern(wcp, wc, wbp, bitmap, bvp, schedule, p.n, p.nnz);
  const int64_t heads = od[0];
  p.heads = int(heads);
  p.x_head_stride = xd[0] == 1 ? 0 : p.m * p.d;
  p.y_head_stride = yd[0] == 1 ? 0 : p.n * p.d;
  if (heads == 0 || p.nnz == 0) return ffi::Error::Success();
  const RowView rv = row_view(row_entries, row_schedule, p.m, p.n, p.nnz);
  // Empty dot products; or no row of X or Y, or no item, for the values to come from (not so
  // in a valid pattern with nonzeros; the kernels need a row for every index they fold).
  if (p.d == 0 || p.m == 0 || p.n == 0 || p.num_items == 0 || rv.num_items == 0) {
    const size_t esize_out = out->element_type() == ffi::DataType::F32 ? 4 : 2;
    const size_t bytes = size_t(heads * p.nnz) * esize_out;
    if (cudaMemsetAsync(p.out, 0, bytes, stream) != cudaSuccess)
      return ffi::Error::Internal("sddmm: memset failed");
    return ffi::Error::Success();
  }
  if (heads > 65535) return ffi::Error::InvalidArgument("sddmm: at most 65535 heads");
  const PatternFeatures features{p.m, p.nnz, int64_t(wcp.element_count()) - 1,
                                 int64_t(bitmap.element_count()) / 2, int64_t(wc.element_count())};
  const SddmmShape shape{dtype == ffi::DataType::F32 ? 4 : 2,
                         dtype == ffi::DataType::F32 && precision == int32_t(Precision::kHighest),
                         features,
                         p.num_items,
                         heads,
                         p.d};
  SddmmPlan plan;
  if (auto err = plan_sddmm(shape, kernel, plan); err.failure()) return err;
  p.vec = sddmm_vec(shape, plan, reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
                    reinterpret_cast<uintptr_t>(p.y) % 16 == 0);
  if (plan.kernel == SddmmKernel::kRows) {
    p.min_share = plan.min_share;
    p.stream = plan.stream;
    p.stream_max = plan.stream_max;
    if (dtype == ffi::DataType::F32)
      launch_rows<float, float>(p, rv, plan, stream);
    else if (dtype == ffi::DataType::F16 && f32_out)
      launch_rows<__half, float>(p, rv, plan, stream);
    else if (dtype == ffi::DataType::F16)
      launch_rows<__half, __half>(p, rv, plan, stream);
    else if (f32_out)
      launch_rows<__nv_bfloat16, float>(p, rv, plan, stream);
    else
      launch_rows<__nv_bfloat16, __nv_bfloat16>(p, rv, plan, stream);
    return launch_status("sddmm");
  }
  const dim3 grid1(unsigned((p.num_items + kWarps - 1) / kWarps),
                   unsigned(std::min<int64_t>(heads, 65535)));
  if (plan.kernel == SddmmKernel::kExactF32) {
    sddmm_f32_exact<<<grid1, kWarps * 32, 0, stream>>>(p);
  } else {
    p.sub = plan.sub;
    const dim3 grid(unsigned((p.num_items * p.sub + kWarps - 1) / kWarps), grid1.y);
    const dim3 block(kWarps * 32);
    if (dtype == ffi::DataType::F32)
      sddmm_tc<float><<<grid, block, 0, stream>>>(p);
    else if (dtype == ffi::DataType::F16 && f32_out)
      sddmm_tc<__half, float><<<grid, block, 0, stream>>>(p);
    else if (dtype == ffi::DataType::F16)
      sddmm_tc<__half><<<grid, block, 0, stream>>>(p);
    else if (f32_out)
      sddmm_tc<__nv_bfloat16, float><<<grid, block, 0, stream>>>(p);
    else
      sddmm_tc<__nv_bfloat16><<<grid, block, 0, stream>>>(p);
  }
  return launch_status("sddmm");
}

}  // namespace
}  // namespace sddmm

XLA_FFI_DEFINE_HANDLER_SYMBOL(SddmmCuda, sddmm::sddmm_cuda,
                              JAXSPARSE_TC_BIND_SDDMM(JAXSPARSE_TC_CUDA_CTX,
                                                      JAXSPARSE_TC_ROW_VIEW_ARGS, ,
                                                      .Attr<int32_t>("kernel")),  // KernelChoice
                              JAXSPARSE_TC_CAPTURABLE);

}  // namespace jaxsparse_tc
