// SDDMM kernels' parameters.
#pragma once
#include <cstdint>

#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace sddmm {

constexpr int kWarps = 4;

struct SddmmParams : KernelPattern {
  const void* x;
  const void* y;
  void* out;
  int64_t nnz, m, n, d;
  int64_t x_head_stride, y_head_stride;  // 0 where the operand broadcasts over heads
  int heads;
  int sub;         // warps per schedule item (each takes an equal, even share of its blocks)
  int min_share;   // row kernels: fewest entries of a CTA item one group takes (cta_min_share)
  int stream;      // row kernels on large graphs: whole rows per group's stream
  int stream_max;  // row kernels on large graphs: single CTA items the streams walk
  bool vec;        // a thread's features load as whole vectors (each kernel's rule: plan/sddmm.h)
};

}  // namespace sddmm
}  // namespace jaxsparse_tc
