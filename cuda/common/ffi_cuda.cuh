// FFI glue shared by the CUDA handlers: dtype dispatch to device element types, the launch
// status, and the pattern pointers every kernel's parameters carry.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/ffi_ops.h"
#include "common/ffi_pattern.h"
#include "common/format.h"
#include "cuda/common/bounds.cuh"
#include "cuda/common/device.h"

// Every CUDA handler may be captured into XLA's command buffers (CUDA graphs), which removes
// the host's per-call dispatch between kernels. That holds because a handler only launches
// work on its stream, allocates nothing (workspaces are XLA-planned result buffers, not scratch
// memory that would be freed after the capture while the graph keeps its address) and does
// the same thing each time it runs with the same shapes and attributes.
#define JAXSPARSE_TC_CAPTURABLE {ffi::Traits::kCmdBufferCompatible}

// The CUDA handlers' context (common/ffi_ops.h CTX): XLA's stream, which every launch goes on.
#define JAXSPARSE_TC_CUDA_CTX .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()

namespace jaxsparse_tc {

// Calls f(T{}) with T the device type of dt (float, __half, __nv_bfloat16).
template <class F>
ffi::Error dispatch_device_float(ffi::DataType dt, const char* op, F&& f) {
  switch (dt) {
    case ffi::DataType::F32: f(float{}); return ffi::Error::Success();
    case ffi::DataType::F16: f(__half{}); return ffi::Error::Success();
    case ffi::DataType::BF16: f(__nv_bfloat16{}); return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(std::string(op) +
                                         ": unsupported dtype (float32, float16, bfloat16)");
  }
}

// The error of the last launch, if any, as an FFI error naming the operator.
inline ffi::Error launch_status(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string(op) +
                                ": kernel launch failed: " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

// A device operand's name and address, for check_aligned (empty arrays are never read).
struct NamedOperand {
  const char* name;
  const void* data;
  size_t elements;
};
template <class B>
NamedOperand operand(const char* name, const B& b) {
  return {name, b.untyped_data(), size_t(b.element_count())};
}

// An InvalidArgument naming the first operand that does not start at a multiple of
// kOperandAlign bytes (format.h): the kernels read them in vectors. XLA allocates every buffer
// so aligned, but hands a custom call a slice of a larger buffer in place (its dynamic-slice
// fusion), where the slice starts.
inline ffi::Error check_aligned(const char* op, std::initializer_list<NamedOperand> operands) {
  for (const NamedOperand& a : operands)
    if (a.elements > 0 && reinterpret_cast<uintptr_t>(a.data) % kOperandAlign != 0)
      return ffi::Error::InvalidArgument(
          std::string(op) + ": operand " + a.name + " does not start at a multiple of " +
          std::to_string(kOperandAlign) +
          " bytes (XLA passed a slice of a larger array in place); slice it at a multiple of " +
          std::to_string(kOperandAlign) + " bytes, or copy it first");
  return ffi::Error::Success();
}

// The first failure among a handler's checks (all made), or Success: one statement per handler.
inline ffi::Error first_failure(std::initializer_list<ffi::Error> checks) {
  for (const ffi::Error& e : checks)
    if (e.failure()) return e;
  return ffi::Error::Success();
}

// check_aligned over one orientation's kernel arrays (what kernel_pattern reads).
inline ffi::Error check_pattern_aligned(const char* op, I32 wcp, I32 wc, I32 wbp, U32 bitmap,
                                        I32 bvp, I32 schedule) {
  return check_aligned(op, {operand("window_col_ptr", wcp), operand("window_cols", wc),
                            operand("window_block_ptr", wbp), operand("block_bitmap", bitmap),
                            operand("block_value_ptr", bvp), operand("schedule", schedule)});
}

// An element count as an int (saturated), and the last index of an array of `count` elements
// (-1: the array is empty, so nothing may index it; each handler makes sure nothing does).
inline int count_int(int64_t count) {
  return int(std::clamp<int64_t>(count, 0, INT32_MAX));
}
inline int last_index(int64_t count) {
  return count_int(count) - 1;
}

// What a pattern's entries address, from the buffers' element counts (bounds.cuh): the schedule's
// windows fold into [0, last_window], block pointers into [0, num_blocks], column pointers into
// [0, num_cols], condensed columns into the rows of the table they gather ([0, last_col]) and
// value positions into [0, last_value] (the operator's nonzeros per head).
struct PatternBounds {
  int last_window;  // W - 1 (window_col_ptr and window_block_ptr have W + 1 entries)
  int num_blocks;   // B (block_bitmap [B, 2], block_value_ptr [B + 1])
  int num_cols;     // C (window_cols [C])
  int last_col;     // rows of the gathered table - 1 (A @ X: n - 1; A^T's windows: m - 1)
  int last_value;   // values per head - 1
};

// One orientation's kernel arrays as kernel parameters (a base of each operator's params).
struct KernelPattern : PatternBounds {
  const int32_t* wcp;      // window_col_ptr
  const int32_t* wc;       // window_cols
  const int32_t* wbp;      // window_block_ptr
  const uint32_t* bitmap;  // block_bitmap [B, 2]
  const int32_t* bvp;      // block_value_ptr
  const int4* sched;       // schedule items: sched[2 * item] = (window, block_begin, block_end,
                           // split), sched[2 * item + 1] = (col_begin, col_end, first, pieces)
  int64_t num_items;       // 0 where there is no window an item could name
};

// `table_rows`: rows of the dense table the condensed columns index; `values`: the operator's
// values per head (positions the bitmap's ranks address).
inline KernelPattern kernel_pattern(I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule,
                                    int64_t table_rows, int64_t values) {
  const PatternView v = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  KernelPattern p{};
  p.wcp = v.window_col_ptr;
  p.wc = v.window_cols;
  p.wbp = v.window_block_ptr;
  p.bitmap = v.block_bitmap;
  p.bvp = v.block_value_ptr;
  p.sched = reinterpret_cast<const int4*>(v.schedule);
  const int64_t windows =
      std::min<int64_t>(wcp.element_count(), wbp.element_count()) - 1;  // both W + 1
  p.last_window = last_index(windows);
  p.num_blocks = count_int(
      std::min<int64_t>(int64_t(bitmap.element_count()) / 2, int64_t(bvp.element_count()) - 1));
  p.num_cols = count_int(wc.element_count());
  p.last_col = last_index(table_rows);
  p.last_value = last_index(values);
  p.num_items = windows > 0 ? v.num_items : 0;
  return p;
}

// Window w's blocks [wb, wend) and condensed columns [cb, cb + ncols), folded into the arrays
// (w folded by the caller), with at most one block per 8 of its columns: a block's column
// offsets 8 * (b - wb) + c then stay below ncols + 8. (A valid window has exactly that many.)
struct WindowSpan {
  int wb, wend, cb, ncols;
};
__device__ __forceinline__ WindowSpan window_span(const KernelPattern& a, int w) {
  WindowSpan s;
  s.wb = clamp_to(a.wbp[w], 0, a.num_blocks);
  s.wend = clamp_to(a.wbp[w + 1], s.wb, a.num_blocks);
  s.cb = clamp_to(a.wcp[w], 0, a.num_cols);
  s.ncols = clamp_to(a.wcp[w + 1], s.cb, a.num_cols) - s.cb;
  s.wend = s.wb + min(s.wend - s.wb, (s.ncols + kBlockCols - 1) / kBlockCols);
  return s;
}

}  // namespace jaxsparse_tc
