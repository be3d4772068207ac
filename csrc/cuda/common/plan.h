// Pieces shared by the operators' launch plans (spmm/plan.h, sddmm/plan.h, attention/plan.h). A
// plan is a pure function of the shapes and the FFI attributes (and, where a kernel needs it, the
// device's architecture): the workspace size Python asks for and the handler's launch come from
// the same function, so they cannot disagree. docs/DESIGN.md, "Which kernel runs".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ffi_pattern.h"

namespace jaxsparse_tc {

// FFI attribute `kernel` of the SpMM and SDDMM handlers (jaxsparse_tc/options.py _KERNEL_CODES).
enum class KernelChoice : int32_t {
  kAuto = 0,        // the plan's rule
  kCudaCore = 1,    // the row kernels (CUDA cores, the pattern's row view)
  kTensorCore = 2,  // the window kernels (tensor cores; exact float32 on CUDA cores)
};

// `code` as a KernelChoice; an unknown code is an InvalidArgument naming the operator.
inline ffi::Error kernel_choice(const char* op, int64_t code, KernelChoice& choice) {
  if (code < 0 || code > 2)
    return ffi::Error::InvalidArgument(std::string(op) +
                                       ": attribute kernel must be 0 (auto), 1 (cuda_core) or 2 "
                                       "(tensor_core); got " +
                                       std::to_string(code));
  choice = static_cast<KernelChoice>(code);
  return ffi::Error::Success();
}

// The block-fill rule of the SpMM and SDDMM plans: the row kernels where blocks are this sparse
// (fill = nnz / (64 blocks) <= 1/4). The row kernels gather the same dense rows as the window
// kernels (one per condensed column) but pay only for the nonzeros, with many more warps per SM;
// the tensor-core kernels pay for all 64 entries of a block. The graphs measured all sit near
// fill 1/8 (Cora 0.124, R-MAT ~1/8), where the row kernels won on H100 (fp16 d=128: SpMM
// rmat17 141 us against 166 for the tensor-core kernel, rmat20 643 against 773; SDDMM rmat17
// 123 against 137, rmat20 573 against 723).
inline bool sparse_blocks(int64_t nnz, int64_t num_blocks) {
  return double(nnz) <= 0.25 * 64.0 * double(num_blocks);
}

// A workspace smaller than the plan: Python sized it with the same plan function, so this is an
// internal error (the two were given different shapes or attributes).
inline ffi::Error workspace_mismatch(const char* op, size_t have, size_t need) {
  return ffi::Error::Internal(std::string(op) + ": workspace of " + std::to_string(have) +
                              " bytes, the launch plan needs " + std::to_string(need) +
                              " (internal error: the workspace was sized from other shapes or "
                              "attributes than the launch)");
}

}  // namespace jaxsparse_tc
