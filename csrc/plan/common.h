// Pieces shared by the operators' launch plans (plan/spmm.h, plan/sddmm.h, plan/attention.h). A
// plan is a pure function of the shapes and the FFI attributes (and, where a kernel needs it, the
// device's architecture): the workspace size Python asks for and the handler's launch come from
// the same function, so they cannot disagree. docs/DESIGN.md, "Which kernel runs".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ffi_pattern.h"
#include "common/ops.h"

namespace jaxsparse_tc {

// `code` (FFI attribute `kernel`) as a KernelChoice (common/ops.h); an unknown code is an
// InvalidArgument naming the operator.
inline ffi::Error kernel_choice(const char* op, int64_t code, KernelChoice& choice) {
  if (code < 0 || code >= code_count(kKernelChoiceCodes))
    return ffi::Error::InvalidArgument(std::string(op) +
                                       ": attribute kernel must be 0 (auto), 1 (rows) or 2 "
                                       "(windows); got " +
                                       std::to_string(code));
  choice = static_cast<KernelChoice>(code);
  return ffi::Error::Success();
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
