// CPU edge softmax: row-wise softmax over A's nonzeros (format order, values [H, nnz]),
// max-subtracted, float32 math; and its backward / JVP map
//   out = Y * (t - rowsum(Y * t))
// (linear in t and self-adjoint: the transpose of the JVP is the same map).
// The executable specification the CUDA handlers are checked against.
#include <cmath>
#include <limits>

#include "cpu/ffi_common.h"

namespace jaxsparse_tc {

static ffi::Error edge_softmax_cpu(ffi::AnyBuffer values, I32 wcp, I32 wc, I32 wbp, U32 bitmap,
                                   I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> out) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const auto vd = values.dimensions();
  const int64_t heads = vd[0], nnz = vd[1];
  if (out->element_type() != values.element_type())
    return ffi::Error::InvalidArgument("edge_softmax: values and out must share a dtype");
  return dispatch_float(values.element_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* v = static_cast<const T*>(values.untyped_data());
    T* o = static_cast<T*>(out->untyped_data());
    for (int64_t h = 0; h < heads; ++h) {
      const T* vh = v + h * nnz;
      T* oh = o + h * nnz;
      for (int64_t w = 0; w < p.num_windows; ++w) {
        float mx[kWindowRows], sum[kWindowRows];
        for (int r = 0; r < kWindowRows; ++r) {
          mx[r] = -std::numeric_limits<float>::infinity();
          sum[r] = 0.0f;
        }
        for_each_in_window(p, w, [&](int r, int32_t, int64_t idx) {
          mx[r] = std::max(mx[r], to_float(vh[idx]));
        });
        for (int r = 0; r < kWindowRows; ++r)
          if (!std::isfinite(mx[r])) mx[r] = mx[r] > 0 ? mx[r] : 0.0f;
        for_each_in_window(p, w, [&](int r, int32_t, int64_t idx) {
          sum[r] += std::exp(to_float(vh[idx]) - mx[r]);
        });
        for_each_in_window(p, w, [&](int r, int32_t, int64_t idx) {
          const float e = std::exp(to_float(vh[idx]) - mx[r]);
          oh[idx] = from_float<T>(sum[r] > 0.0f ? e / sum[r] : 0.0f);
        });
      }
    }
  });
}

static ffi::Error edge_softmax_bwd_cpu(ffi::AnyBuffer y, ffi::AnyBuffer t, I32 wcp, I32 wc,
                                       I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                       ffi::Result<ffi::AnyBuffer> out) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const int64_t hy = y.dimensions()[0], ht = t.dimensions()[0];
  const int64_t heads = out->dimensions()[0], nnz = out->dimensions()[1];
  if (y.element_type() != t.element_type() || out->element_type() != y.element_type())
    return ffi::Error::InvalidArgument("edge_softmax_bwd: y, t and out must share a dtype");
  return dispatch_float(y.element_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* ys = static_cast<const T*>(y.untyped_data());
    const T* ts = static_cast<const T*>(t.untyped_data());
    T* o = static_cast<T*>(out->untyped_data());
    for (int64_t h = 0; h < heads; ++h) {
      const T* yh = ys + (hy == 1 ? 0 : h) * nnz;
      const T* th = ts + (ht == 1 ? 0 : h) * nnz;
      T* oh = o + h * nnz;
      for (int64_t w = 0; w < p.num_windows; ++w) {
        float dot[kWindowRows] = {0, 0, 0, 0, 0, 0, 0, 0};
        for_each_in_window(p, w, [&](int r, int32_t, int64_t idx) {
          dot[r] += to_float(yh[idx]) * to_float(th[idx]);
        });
        for_each_in_window(p, w, [&](int r, int32_t, int64_t idx) {
          oh[idx] = from_float<T>(to_float(yh[idx]) * (to_float(th[idx]) - dot[r]));
        });
      }
    }
  });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxCpu, edge_softmax_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // values [H, nnz]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>());  // out [H, nnz]

XLA_FFI_DEFINE_HANDLER_SYMBOL(EdgeSoftmaxBwdCpu, edge_softmax_bwd_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // y [Hy, nnz]
                                  .Arg<ffi::AnyBuffer>()  // t [Ht, nnz]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>());  // out [H, nnz]

}  // namespace jaxsparse_tc
