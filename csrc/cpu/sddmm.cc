// CPU SDDMM: out[h, idx(i, j)] = <X_h[i, :], Y_h[j, :]> at A's nonzeros, in format order,
// fp32 accumulation.
#include <type_traits>

#include "cpu/ffi_common.h"

namespace jaxsparse_tc {

static ffi::Error sddmm_cpu(ffi::AnyBuffer x, ffi::AnyBuffer y, I32 wcp, I32 wc, I32 wbp,
                            U32 bitmap, I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> out,
                            int32_t /*precision*/) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const auto xd = x.dimensions(), yd = y.dimensions(), od = out->dimensions();
  const int64_t hx = xd[0], m = xd[1], d = xd[2], hy = yd[0], n = yd[1];
  const int64_t heads = od[0], nnz = od[1];
  // out is x's dtype, or float32 for 16-bit x (the accumulator, unrounded).
  const bool f32_out = out->element_type() == ffi::DataType::F32 &&
                       (x.element_type() == ffi::DataType::F16 || x.element_type() == ffi::DataType::BF16);
  if (x.element_type() != y.element_type() || (out->element_type() != x.element_type() && !f32_out))
    return ffi::Error::InvalidArgument("sddmm: x, y and out must share a dtype (or out float32)");
  return dispatch_float_or_double(x.element_type(), [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto* o) {
      using O = std::remove_pointer_t<decltype(o)>;
      const T* xs = static_cast<const T*>(x.untyped_data());
      const T* ys = static_cast<const T*>(y.untyped_data());
      for (int64_t h = 0; h < heads; ++h) {
        const T* xh = xs + (hx == 1 ? 0 : h) * m * d;
        const T* yh = ys + (hy == 1 ? 0 : h) * n * d;
        O* oh = o + h * nnz;
        for (int64_t w = 0; w < p.num_windows; ++w) {
          for_each_in_window(p, w, [&](int r, int32_t col, int64_t idx) {
            const T* xr = xh + (w * kWindowRows + r) * d;
            const T* yr = yh + int64_t(col) * d;
            accum_t<T> s = 0;
            for (int64_t k = 0; k < d; ++k) s += to_float(xr[k]) * to_float(yr[k]);
            oh[idx] = narrow<O>(s);
          });
        }
      }
    };
    if (f32_out) run(static_cast<float*>(out->untyped_data()));
    else run(static_cast<T*>(out->untyped_data()));
  });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SddmmCpu, sddmm_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // x [Hx, m, d]
                                  .Arg<ffi::AnyBuffer>()  // y [Hy, n, d]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()  // out [H, nnz]
                                  .Attr<int32_t>("precision"));

}  // namespace jaxsparse_tc
