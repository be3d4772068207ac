// Glue for the CPU FFI handlers: dtype dispatch and a window's nonzeros.
#pragma once
#include <cstdint>
#include <algorithm>
#include <utility>

#include "common/ffi_pattern.h"
#include "common/scalar.h"

namespace jaxsparse_tc {
namespace ffi = xla::ffi;

// Calls f.template operator()<T>() with T the C++ type of dtype.
template <typename F>
ffi::Error dispatch_float(ffi::DataType dtype, F&& f) {
  switch (dtype) {
    case ffi::DataType::F32: f(float{}); return ffi::Error::Success();
    case ffi::DataType::F16: f(half_t{}); return ffi::Error::Success();
    case ffi::DataType::BF16: f(bfloat16_t{}); return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("jaxsparse_tc: unsupported dtype (float32, float16, bfloat16)");
  }
}

// dispatch_float plus float64 (double accumulation): for kernels that support x64 on CPU.
template <typename F>
ffi::Error dispatch_float_or_double(ffi::DataType dtype, F&& f) {
  if (dtype == ffi::DataType::F64) {
    f(double{});
    return ffi::Error::Success();
  }
  return dispatch_float(dtype, f);
}

// Visits every nonzero of window w: f(row_in_window, column, value_index).
template <typename F>
inline void for_each_in_window(const PatternView& p, int64_t w, F&& f) {
  const int32_t col0 = p.window_col_ptr[w];
  for (int64_t b = p.window_block_ptr[w]; b < p.window_block_ptr[w + 1]; ++b) {
    uint64_t bits = block_bits(p.block_bitmap, b);
    int64_t idx = p.block_value_ptr[b];
    const int32_t* cols = p.window_cols + col0 + (b - p.window_block_ptr[w]) * kBlockCols;
    while (bits) {
      const int bit = __builtin_ctzll(bits);
      bits &= bits - 1;
      f(bit % kWindowRows, cols[bit / kWindowRows], idx++);
    }
  }
}

}  // namespace jaxsparse_tc
