// CPU SpMM: out[h, i, :] = sum_j A_h[i, j] X_h[j, :], fp32 accumulation. The executable
// specification the CUDA kernel is checked against. (float64, CPU only: double accumulation.)
#include <vector>

#include "cpu/ffi_common.h"

namespace jaxsparse_tc {

static ffi::Error spmm_cpu(ffi::AnyBuffer values, ffi::AnyBuffer x, I32 wcp, I32 wc, I32 wbp,
                           U32 bitmap, I32 bvp, I32 schedule, ffi::Result<ffi::AnyBuffer> out,
                           int32_t /*precision*/) {
  const PatternView p = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  const auto vd = values.dimensions(), xd = x.dimensions(), od = out->dimensions();
  const int64_t hv = vd[0], nnz = vd[1], hx = xd[0], n = xd[1], d = xd[2];
  const int64_t heads = od[0], m = od[1];
  if (x.element_type() != values.element_type() || out->element_type() != x.element_type())
    return ffi::Error::InvalidArgument("spmm: values, x and out must share a dtype");
  return dispatch_float_or_double(x.element_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* v = static_cast<const T*>(values.untyped_data());
    const T* xs = static_cast<const T*>(x.untyped_data());
    T* o = static_cast<T*>(out->untyped_data());
    std::vector<accum_t<T>> acc(kWindowRows * d);
    for (int64_t h = 0; h < heads; ++h) {
      const T* vh = v + (hv == 1 ? 0 : h) * nnz;
      const T* xh = xs + (hx == 1 ? 0 : h) * n * d;
      T* oh = o + h * m * d;
      for (int64_t w = 0; w < p.num_windows; ++w) {
        std::fill(acc.begin(), acc.end(), accum_t<T>(0));
        for_each_in_window(p, w, [&](int r, int32_t col, int64_t idx) {
          const accum_t<T> a = to_float(vh[idx]);
          const T* xr = xh + int64_t(col) * d;
          accum_t<T>* ar = acc.data() + r * d;
          for (int64_t k = 0; k < d; ++k) ar[k] += a * to_float(xr[k]);
        });
        const int64_t rows = std::min<int64_t>(kWindowRows, m - w * kWindowRows);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < d; ++k)
            oh[(w * kWindowRows + r) * d + k] = narrow<T>(acc[r * d + k]);
      }
    }
  });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmCpu, spmm_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // values [Hv, nnz]
                                  .Arg<ffi::AnyBuffer>()  // x [Hx, n, d]
                                  JAXSPARSE_TC_PATTERN_ARGS
                                  .Ret<ffi::AnyBuffer>()  // out [H, m, d]
                                  .Attr<int32_t>("precision"));

}  // namespace jaxsparse_tc
