// FFI glue shared by the CPU and CUDA handlers: the pattern operands (one orientation's kernel
// arrays) as buffers, a PatternView over them, and the operand list every handler binds.
#pragma once
#include <cstdint>

#include "common/format.h"
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

// The standard operand list of one orientation's kernel arrays.
#define JAXSPARSE_TC_PATTERN_ARGS                        \
  .Arg<::jaxsparse_tc::I32>()     /* window_col_ptr */   \
      .Arg<::jaxsparse_tc::I32>() /* window_cols */      \
      .Arg<::jaxsparse_tc::I32>() /* window_block_ptr */ \
      .Arg<::jaxsparse_tc::U32>() /* block_bitmap */     \
      .Arg<::jaxsparse_tc::I32>() /* block_value_ptr */  \
      .Arg<::jaxsparse_tc::I32>() /* schedule */

}  // namespace jaxsparse_tc
