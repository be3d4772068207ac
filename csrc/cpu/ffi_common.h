// Glue for the CPU FFI handlers: dtype dispatch to the kernel table (cpu/kernels.h).
#pragma once
#include <cstdint>

#include "common/ffi_ops.h"
#include "common/ffi_pattern.h"
#include "cpu/kernels.h"

// The CPU handlers' context (common/ffi_ops.h CTX): XLA's intra-op thread pool (cpu/parallel.h).
#define JAXSPARSE_TC_CPU_CTX .Ctx<::xla::ffi::ThreadPool>()

namespace jaxsparse_tc {
namespace ffi = xla::ffi;

// The kernel table's index for dtype (float32, float16, bfloat16; float64 where allowed), or -1.
inline int cpu_dtype(ffi::DataType dtype, bool allow_f64) {
  switch (dtype) {
    case ffi::DataType::F32: return cpu::kF32;
    case ffi::DataType::F16: return cpu::kF16;
    case ffi::DataType::BF16: return cpu::kBF16;
    case ffi::DataType::F64: return allow_f64 ? cpu::kF64 : -1;
    default: return -1;
  }
}

inline ffi::Error unsupported_dtype() {
  return ffi::Error::InvalidArgument(
      "jaxsparse_tc: unsupported dtype (float32, float16, bfloat16)");
}

}  // namespace jaxsparse_tc
