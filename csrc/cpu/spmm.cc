// CPU SpMM: out[h, i, :] = sum_j A_h[i, j] X_h[j, :], fp32 accumulation. The executable
// specification the CUDA kernel is checked against. (float64, CPU only: double accumulation.)
// Windows are split across XLA's intra-op threads (cpu/parallel.h); the kernel is
// cpu/kernels/spmm.inc.
#include "cpu/ffi_common.h"
#include "cpu/parallel.h"
#include "cpu/pattern_check.h"

namespace jaxsparse_tc {

static ffi::Error spmm_cpu(ffi::ThreadPool pool, ffi::AnyBuffer values, ffi::AnyBuffer x, I32 wcp,
                           I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                           ffi::Result<ffi::AnyBuffer> out, int32_t /*precision*/) {
  constexpr const char* kTarget = op_target(Op::kSpmm);
  const auto vd = values.dimensions(), xd = x.dimensions(), od = out->dimensions();
  if (x.element_type() != values.element_type() || out->element_type() != x.element_type())
    return ffi::Error::InvalidArgument("spmm: values, x and out must share a dtype");
  const int dtype = cpu_dtype(x.element_type(), /*allow_f64=*/true);
  if (dtype < 0) return unsupported_dtype();
  if (vd.size() != 2 || xd.size() != 3 || od.size() != 3 || !heads_broadcast(vd[0], od[0]) ||
      !heads_broadcast(xd[0], od[0]) || xd[2] != od[2])
    return operand_error(kTarget, "values " + dims_string(vd) + ", x " + dims_string(xd) +
                                      " and out " + dims_string(od) +
                                      " do not fit [Hv, nnz], [Hx, n, d], [H, m, d] with Hv and "
                                      "Hx in {1, H}");
  PatternLimits lim;
  lim.m = od[1], lim.n = xd[1], lim.nnz = vd[1];
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  if (auto err = guard.prologue(); err.failure()) return err;
  cpu::SpmmArgs a;
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.values = {values.untyped_data(), vd[0], 1, vd[1]};
  a.x = {x.untyped_data(), xd[0], xd[1], xd[2]};
  a.out = out->untyped_data();
  a.heads = od[0], a.m = od[1];
  const auto kernel = cpu::kernels().spmm[dtype];
  // Each chunk of windows is checked just before the kernel reads it (pattern_check.h).
  cpu::parallel_windows(pool, a.p, a.heads, a.x.cols + 8, 8 * a.x.cols,
                        [&](int64_t w0, int64_t w1) {
                          if (guard.windows(w0, w1)) kernel(a, w0, w1);
                        });
  return guard.status();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmCpu, spmm_cpu,
                              JAXSPARSE_TC_BIND_SPMM(JAXSPARSE_TC_CPU_CTX, , , ));

}  // namespace jaxsparse_tc
