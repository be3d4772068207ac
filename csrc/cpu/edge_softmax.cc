// CPU edge softmax: row-wise softmax over A's nonzeros (format order, values [H, nnz]),
// max-subtracted, float32 math; and its backward / JVP map
//   out = Y * (t - rowsum(Y * t))
// (linear in t and self-adjoint: the transpose of the JVP is the same map).
// The executable specification the CUDA handlers are checked against. Windows are split across
// XLA's intra-op threads (cpu/parallel.h); the kernels are in cpu/kernels_impl.inc.
#include "cpu/ffi_common.h"
#include "cpu/parallel.h"

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
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()                         // values [H, nnz]
                              JAXSPARSE_TC_PATTERN_ARGS.Ret<ffi::AnyBuffer>());  // out [H, nnz]

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxBwdCpu, edge_softmax_bwd_cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()                         // y [Hy, nnz]
                                  .Arg<ffi::AnyBuffer>()                         // t [Ht, nnz]
                              JAXSPARSE_TC_PATTERN_ARGS.Ret<ffi::AnyBuffer>());  // out [H, nnz]

}  // namespace jaxsparse_tc
