// CPU SpMM: out[h, i, :] = sum_j A_h[i, j] X_h[j, :], fp32 accumulation, and the max/min SpMM
// (spmm_extremum): the best product A_h[i, j] X_h[j, k] over row i's entries per feature, with
// the format position it came from. The executable specification the CUDA kernels are checked
// against. (float64, CPU only: double accumulation.) Windows are split across XLA's intra-op
// threads (cpu/parallel.h); the kernels are cpu/kernels/spmm.inc and spmm_extremum.inc.
#include <algorithm>

#include "cpu/ffi_common.h"
#include "cpu/parallel.h"
#include "cpu/pattern_check.h"

namespace jaxsparse_tc {

// What the two SpMMs share: values [Hv, nnz], x [Hx, n, d] and out [H, m, d] of one dtype, Hv
// and Hx in {1, H}. Fills the pattern's limits and the kernel's dtype index.
static ffi::Error spmm_operands(const char* target, ffi::AnyBuffer values, ffi::AnyBuffer x,
                                ffi::AnyBuffer out, PatternLimits& lim, int& dtype) {
  const auto vd = values.dimensions(), xd = x.dimensions(), od = out.dimensions();
  if (x.element_type() != values.element_type() || out.element_type() != x.element_type())
    return ffi::Error::InvalidArgument(std::string(target) +
                                       ": values, x and out must share a dtype");
  dtype = cpu_dtype(x.element_type(), /*allow_f64=*/true);
  if (dtype < 0) return unsupported_dtype();
  if (vd.size() != 2 || xd.size() != 3 || od.size() != 3 || !heads_broadcast(vd[0], od[0]) ||
      !heads_broadcast(xd[0], od[0]) || xd[2] != od[2])
    return operand_error(target, "values " + dims_string(vd) + ", x " + dims_string(xd) +
                                     " and out " + dims_string(od) +
                                     " do not fit [Hv, nnz], [Hx, n, d], [H, m, d] with Hv and "
                                     "Hx in {1, H}");
  lim.m = od[1], lim.n = xd[1], lim.nnz = vd[1];
  return ffi::Error::Success();
}

// Runs kernel(args, w0, w1) over the windows in chunks across the pool, each chunk checked just
// before the kernel reads it (pattern_check.h).
template <class Args, class Kernel>
static ffi::Error run_windows(ffi::ThreadPool pool, const char* target, KernelGuard& guard,
                              const Args& a, Kernel kernel) {
  if (auto err = guard.prologue(); err.failure()) return err;
  cpu::parallel_windows(pool, a.p, a.heads, a.x.cols + 8, 8 * a.x.cols,
                        [&](int64_t w0, int64_t w1) {
                          if (guard.windows(w0, w1)) kernel(a, w0, w1);
                        });
  return guard.status();
}

static ffi::Error spmm_cpu(ffi::ThreadPool pool, ffi::AnyBuffer values, ffi::AnyBuffer x, I32 wcp,
                           I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                           ffi::Result<ffi::AnyBuffer> out, int32_t /*precision*/) {
  constexpr const char* kTarget = op_target(Op::kSpmm);
  PatternLimits lim;
  int dtype;
  if (auto err = spmm_operands(kTarget, values, x, *out, lim, dtype); err.failure()) return err;
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  cpu::SpmmArgs a;
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.values = {values.untyped_data(), values.dimensions()[0], 1, lim.nnz};
  a.x = {x.untyped_data(), x.dimensions()[0], lim.n, x.dimensions()[2]};
  a.out = out->untyped_data();
  a.heads = out->dimensions()[0], a.m = lim.m;
  return run_windows(pool, kTarget, guard, a, cpu::kernels().spmm[dtype]);
}

static ffi::Error spmm_extremum_cpu(ffi::ThreadPool pool, ffi::AnyBuffer values, ffi::AnyBuffer x,
                                    I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                    ffi::Result<ffi::AnyBuffer> out, ffi::Result<I32> arg,
                                    int32_t is_min) {
  constexpr const char* kTarget = op_target(Op::kSpmmExtremum);
  PatternLimits lim;
  int dtype;
  if (auto err = spmm_operands(kTarget, values, x, *out, lim, dtype); err.failure()) return err;
  const auto ad = arg->dimensions(), od = out->dimensions();
  if (!std::equal(ad.begin(), ad.end(), od.begin(), od.end()))
    return operand_error(kTarget,
                         "arg " + dims_string(ad) + " must have out's shape " + dims_string(od));
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  cpu::SpmmExtremumArgs a;
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.values = {values.untyped_data(), values.dimensions()[0], 1, lim.nnz};
  a.x = {x.untyped_data(), x.dimensions()[0], lim.n, x.dimensions()[2]};
  a.out = out->untyped_data();
  a.arg = arg->typed_data();
  a.heads = out->dimensions()[0], a.m = lim.m;
  a.is_min = is_min != 0;
  return run_windows(pool, kTarget, guard, a, cpu::kernels().spmm_extremum[dtype]);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmCpu, spmm_cpu,
                              JAXSPARSE_TC_BIND_SPMM(JAXSPARSE_TC_CPU_CTX, , , ));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmExtremumCpu, spmm_extremum_cpu,
                              JAXSPARSE_TC_BIND_SPMM_EXTREMUM(JAXSPARSE_TC_CPU_CTX, , , ));

}  // namespace jaxsparse_tc
