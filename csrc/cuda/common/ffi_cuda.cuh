// FFI glue shared by the CUDA handlers: dtype dispatch to device element types, the launch
// status, and the pattern pointers every kernel's parameters carry.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "common/ffi_pattern.h"
#include "cuda/common/device.h"

// Every CUDA handler may be captured into XLA's command buffers (CUDA graphs), which removes
// the host's per-call dispatch between kernels. That holds because a handler only launches
// work on its stream, allocates nothing (workspaces are XLA-planned result buffers, not scratch
// memory that would be freed after the capture while the graph keeps its address) and does
// the same thing each time it runs with the same shapes and attributes.
#define JAXSPARSE_TC_CAPTURABLE {ffi::Traits::kCmdBufferCompatible}

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

// One orientation's kernel arrays as kernel parameters (a base of each operator's params).
struct KernelPattern {
  const int32_t* wcp;      // window_col_ptr
  const int32_t* wc;       // window_cols
  const int32_t* wbp;      // window_block_ptr
  const uint32_t* bitmap;  // block_bitmap [B, 2]
  const int32_t* bvp;      // block_value_ptr
  const int4* sched;       // schedule items: sched[2 * item] = (window, block_begin, block_end,
                           // split), sched[2 * item + 1] = (col_begin, col_end, first, pieces)
  int64_t num_items;
};

inline KernelPattern kernel_pattern(I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule) {
  const PatternView v = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  return {v.window_col_ptr, v.window_cols,     v.window_block_ptr,
          v.block_bitmap,   v.block_value_ptr, reinterpret_cast<const int4*>(v.schedule),
          v.num_items};
}

}  // namespace jaxsparse_tc
