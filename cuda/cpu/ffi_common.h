// Shared glue for the CPU FFI handlers: buffer -> PatternView, dtype dispatch.
#pragma once
#include <cstdint>
#include <algorithm>
#include <utility>

#include "jaxsparse_tc/format.h"
#include "jaxsparse_tc/scalar.h"
#include "xla/ffi/api/ffi.h"

namespace jaxsparse_tc {
namespace ffi = xla::ffi;

using I32 = ffi::Buffer<ffi::S32>;
using U32 = ffi::Buffer<ffi::U32>;

inline PatternView make_view(I32 window_col_ptr, I32 window_cols, I32 window_block_ptr,
                             U32 block_bitmap, I32 block_value_ptr, I32 schedule) {
  PatternView v;
  v.window_col_ptr = window_col_ptr.typed_data();
  v.window_cols = window_cols.typed_data();
  v.window_block_ptr = window_block_ptr.typed_data();
  v.block_bitmap = block_bitmap.typed_data();
  v.block_value_ptr = block_value_ptr.typed_data();
  v.schedule = schedule.typed_data();
  v.num_windows = int64_t(window_col_ptr.element_count()) - 1;
  v.num_blocks = int64_t(block_value_ptr.element_count()) - 1;
  v.num_items = int64_t(schedule.element_count()) / kScheduleFields;
  return v;
}

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

// The standard operand list of one orientation's kernel arrays.
#define JAXSPARSE_TC_PATTERN_ARGS                                             \
  .Arg<::jaxsparse_tc::I32>()     /* window_col_ptr */                        \
      .Arg<::jaxsparse_tc::I32>() /* window_cols */                           \
      .Arg<::jaxsparse_tc::I32>() /* window_block_ptr */                      \
      .Arg<::jaxsparse_tc::U32>() /* block_bitmap */                          \
      .Arg<::jaxsparse_tc::I32>() /* block_value_ptr */                       \
      .Arg<::jaxsparse_tc::I32>() /* schedule */

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
