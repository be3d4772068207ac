// Facts about the current device, asked once per device: its architecture and how many CTAs of
// a kernel it holds at once. Kernel attributes and device properties belong to each device's
// context, so a process driving several GPUs asks (and sets) them once per device.
#pragma once
#include <cuda_runtime.h>

#include <atomic>

namespace jaxsparse_tc {

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

}  // namespace jaxsparse_tc
