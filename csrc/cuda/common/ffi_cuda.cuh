// FFI glue shared by the CUDA handlers: dtype dispatch to device element types, the launch
// status, and the pattern pointers every kernel's parameters carry.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "common/ffi_pattern.h"

// Every CUDA handler may be captured into XLA's command buffers (CUDA graphs), which removes
// the host's per-call dispatch between kernels. That holds because a handler only launches
// work on its stream, allocates nothing (workspaces are XLA-planned result buffers, not scratch
// memory that would be freed after the capture while the graph keeps its address) and does
// the same thing each time it runs with the same shapes.
#define JAXSPARSE_TC_CAPTURABLE \
  { ffi::Traits::kCmdBufferCompatible }

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
    return ffi::Error::Internal(std::string(op) + ": kernel launch failed: " +
                               cudaGetErrorString(err));
  return ffi::Error::Success();
}

// The kernel family a launch is forced to by environment variable `name` (read per launch; tests
// and benchmarks): sets `variant` ("" for unset or auto); an unknown value is an error naming the
// accepted ones, so a misspelt switch never times the default kernel silently.
inline ffi::Error kernel_variant(const char* op, const char* name,
                                 std::initializer_list<const char*> accepted, std::string& variant) {
  const char* v = std::getenv(name);
  variant = v && std::string(v) != "auto" ? v : "";
  if (variant.empty()) return ffi::Error::Success();
  std::string names;
  for (const char* a : accepted) {
    if (variant == a) return ffi::Error::Success();
    names += std::string(", ") + a;
  }
  return ffi::Error::InvalidArgument(std::string(op) + ": " + name + " must be unset, auto" + names +
                                     "; got " + variant);
}

// Per-device facts are cached per device: kernel attributes and device properties belong to
// each device's context, so a process driving several GPUs asks (and sets) them once per device.
constexpr int kMaxDevices = 64;
inline int current_device() {
  int dev = -1;
  return cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kMaxDevices ? dev : -1;
}

// Whether the current device is sm_90 or later (the pipelined SpMM, dependent launches).
inline bool device_is_sm90_or_later() {
  static std::atomic<int> major[kMaxDevices] = {};  // 0: not asked yet
  const int dev = current_device();
  if (dev < 0) return false;
  int mj = major[dev].load(std::memory_order_relaxed);
  if (!mj) {
    if (cudaDeviceGetAttribute(&mj, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    major[dev].store(mj, std::memory_order_relaxed);
  }
  return mj >= 9;
}

// CTAs of `Kernel` (`threads` threads, `smem` bytes of dynamic shared memory) the current device
// holds at once, asked once per device (0 where unknown); persistent kernels launch that many.
// Asking first raises the kernel's dynamic shared-memory limit (over 48 KB needs an opt-in, per
// kernel and device; a failure there shows up as the launch's error).
template <auto Kernel>
int resident_ctas(int threads, int smem) {
  static std::atomic<int> cached[kMaxDevices] = {};
  const int dev = current_device();
  if (dev < 0) return 0;
  int ctas = cached[dev].load(std::memory_order_relaxed);
  if (ctas == 0) {
    if (smem > 48 * 1024)
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int per_sm = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, smem) ==
            cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) {
      ctas = per_sm * sms;
      cached[dev].store(ctas, std::memory_order_relaxed);
    }
  }
  return ctas;
}

// One orientation's kernel arrays as kernel parameters (a base of each operator's params).
struct KernelPattern {
  const int32_t* wcp;     // window_col_ptr
  const int32_t* wc;      // window_cols
  const int32_t* wbp;     // window_block_ptr
  const uint32_t* bitmap;  // block_bitmap [B, 2]
  const int32_t* bvp;     // block_value_ptr
  const int4* sched;      // schedule items: sched[2 * item] = (window, block_begin, block_end,
                          // split), sched[2 * item + 1] = (col_begin, col_end, first, pieces)
  int64_t num_items;
};

inline KernelPattern kernel_pattern(I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule) {
  const PatternView v = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  return {v.window_col_ptr, v.window_cols, v.window_block_ptr, v.block_bitmap,
          v.block_value_ptr, reinterpret_cast<const int4*>(v.schedule), v.num_items};
}

}  // namespace jaxsparse_tc
