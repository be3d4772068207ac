// CPU SDDMM: out[h, idx(i, j)] = <X_h[i, :], Y_h[j, :]> at A's nonzeros, in format order,
// fp32 accumulation (float64, CPU only: double). Windows are split across XLA's intra-op threads
// (cpu/parallel.h); the kernel is cpu/kernels/sddmm.inc.
#include "cpu/ffi_common.h"
#include "cpu/parallel.h"
#include "cpu/pattern_check.h"

namespace jaxsparse_tc {

static ffi::Error sddmm_cpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer y, I32 wcp,
                            I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                            ffi::Result<ffi::AnyBuffer> out, int32_t /*precision*/) {
  constexpr const char* kTarget = op_target(Op::kSddmm);
  const auto xd = x.dimensions(), yd = y.dimensions(), od = out->dimensions();
  // out is x's dtype, or float32 for 16-bit x (the accumulator, unrounded).
  const bool f32_out =
      out->element_type() == ffi::DataType::F32 &&
      (x.element_type() == ffi::DataType::F16 || x.element_type() == ffi::DataType::BF16);
  if (x.element_type() != y.element_type() || (out->element_type() != x.element_type() && !f32_out))
    return ffi::Error::InvalidArgument("sddmm: x, y and out must share a dtype (or out float32)");
  const int dtype = cpu_dtype(x.element_type(), /*allow_f64=*/true);
  if (dtype < 0) return unsupported_dtype();
  if (xd.size() != 3 || yd.size() != 3 || od.size() != 2 || !heads_broadcast(xd[0], od[0]) ||
      !heads_broadcast(yd[0], od[0]) || xd[2] != yd[2])
    return operand_error(kTarget, "x " + dims_string(xd) + ", y " + dims_string(yd) + " and out " +
                                      dims_string(od) +
                                      " do not fit [Hx, m, d], [Hy, n, d], [H, nnz] with Hx and "
                                      "Hy in {1, H}");
  PatternLimits lim;
  lim.m = xd[1], lim.n = yd[1], lim.nnz = od[1];
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  if (auto err = guard.prologue(); err.failure()) return err;
  cpu::SddmmArgs a;
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.x = {x.untyped_data(), xd[0], xd[1], xd[2]};
  a.y = {y.untyped_data(), yd[0], yd[1], yd[2]};
  a.out = out->untyped_data();
  a.heads = od[0], a.nnz = od[1];
  a.f32_out = f32_out;
  const auto kernel = cpu::kernels().sddmm[dtype];
  // Each chunk of windows is checked just before the kernel reads it (pattern_check.h).
  cpu::parallel_windows(pool, a.p, a.heads, a.x.cols + 8, 8 * a.x.cols,
                        [&](int64_t w0, int64_t w1) {
                          if (guard.windows(w0, w1)) kernel(a, w0, w1);
                        });
  return guard.status();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SddmmCpu, sddmm_cpu,
                              JAXSPARSE_TC_BIND_SDDMM(JAXSPARSE_TC_CPU_CTX, , , ));

}  // namespace jaxsparse_tc
