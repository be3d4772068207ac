// CPU edge softmax: row-wise softmax over A's nonzeros (format order, values [H, nnz]),
// max-subtracted, float32 math; and its backward / JVP map
//   out = Y * (t - rowsum(Y * t))
// (linear in t and self-adjoint: the transpose of the JVP is the same map).
// The executable specification the CUDA handlers are checked against. Windows are split across
// XLA's intra-op threads (cpu/parallel.h); the kernels are in cpu/kernels/edge_softmax.inc.
#include "cpu/ffi_common.h"
#include "cpu/parallel.h"
#include "cpu/pattern_check.h"

namespace jaxsparse_tc {

// Work units per value and per window (cpu/parallel.h): an exp is a few tens of multiply-adds.
constexpr int64_t kSoftmaxPerValue = 32, kSoftmaxPerWindow = 64;

static ffi::Error edge_softmax_cpu(ffi::ThreadPool pool, ffi::AnyBuffer values, I32 wcp, I32 wc,
                                   I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                   ffi::Result<ffi::AnyBuffer> out) {
  if (out->element_type() != values.element_type())
    return ffi::Error::InvalidArgument("edge_softmax: values and out must share a dtype");
  const int dtype = cpu_dtype(values.element_type(), /*allow_f64=*/false);
  if (dtype < 0) return unsupported_dtype();
  const auto vd = values.dimensions();
  constexpr const char* kTarget = op_target(Op::kEdgeSoftmax);
  if (vd.size() != 2 || out->dimensions().size() != 2 || out->dimensions()[0] != vd[0] ||
      out->dimensions()[1] != vd[1])
    return operand_error(kTarget, "values " + dims_string(vd) + " and out " +
                                      dims_string(out->dimensions()) + " must both be [H, nnz]");
  PatternLimits lim;
  lim.nnz = vd[1];  // rows and columns are not read
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  if (auto err = guard.all(pool); err.failure()) return err;
  cpu::SoftmaxArgs a;
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.y = {values.untyped_data(), vd[0], 1, vd[1]};
  a.t = a.y;
  a.out = out->untyped_data();
  a.heads = vd[0], a.nnz = vd[1];
  const auto kernel = cpu::kernels().edge_softmax[dtype];
  cpu::parallel_windows(pool, a.p, a.heads, kSoftmaxPerValue, kSoftmaxPerWindow,
                        [&](int64_t w0, int64_t w1) { kernel(a, w0, w1); });
  return ffi::Error::Success();
}

static ffi::Error edge_softmax_bwd_cpu(ffi::ThreadPool pool, ffi::AnyBuffer y, ffi::AnyBuffer t,
                                       I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                       ffi::Result<ffi::AnyBuffer> out) {
  if (y.element_type() != t.element_type() || out->element_type() != y.element_type())
    return ffi::Error::InvalidArgument("edge_softmax_bwd: y, t and out must share a dtype");
  const int dtype = cpu_dtype(y.element_type(), /*allow_f64=*/false);
  if (dtype < 0) return unsupported_dtype();
  constexpr const char* kTarget = op_target(Op::kEdgeSoftmaxBwd);
  const auto yd = y.dimensions(), td = t.dimensions(), od = out->dimensions();
  if (yd.size() != 2 || td.size() != 2 || od.size() != 2 || !heads_broadcast(yd[0], od[0]) ||
      !heads_broadcast(td[0], od[0]) || yd[1] != od[1] || td[1] != od[1])
    return operand_error(kTarget, "y " + dims_string(yd) + ", t " + dims_string(td) + " and out " +
                                      dims_string(od) +
                                      " do not fit [Hy, nnz], [Ht, nnz], [H, nnz] with Hy and Ht "
                                      "in {1, H}");
  PatternLimits lim;
  lim.nnz = od[1];  // rows and columns are not read
  KernelGuard guard(kTarget, kernel_arrays(wcp, wc, wbp, bitmap, bvp, schedule), lim);
  if (auto err = guard.all(pool); err.failure()) return err;
  cpu::SoftmaxArgs a;
  a.p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.heads = out->dimensions()[0], a.nnz = out->dimensions()[1];
  a.y = {y.untyped_data(), y.dimensions()[0], 1, a.nnz};
  a.t = {t.untyped_data(), t.dimensions()[0], 1, a.nnz};
  a.out = out->untyped_data();
  const auto kernel = cpu::kernels().edge_softmax_bwd[dtype];
  cpu::parallel_windows(pool, a.p, a.heads, 8, kSoftmaxPerWindow,
                        [&](int64_t w0, int64_t w1) { kernel(a, w0, w1); });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxCpu, edge_softmax_cpu,
                              JAXSPARSE_TC_BIND_EDGE_SOFTMAX(JAXSPARSE_TC_CPU_CTX, , , ));

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxBwdCpu, edge_softmax_bwd_cpu,
                              JAXSPARSE_TC_BIND_EDGE_SOFTMAX_BWD(JAXSPARSE_TC_CPU_CTX, , , ));

}  // namespace jaxsparse_tc
