// Parameters of the attention forward and jvp kernels (forward_tc.cuh, scalar.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ffi_cuda.cuh"

namespace jaxsparse_tc {
namespace attention {

struct Heads {  // head counts of the operands (1 broadcasts)
  int64_t q, k, v, b;
};

__device__ __forceinline__ int64_t hsel(int64_t count, int64_t h) {
  return count == 1 ? 0 : h;
}

// Split-window partials of the tensor-core forward: slots for the schedule's first `cap` items
// (split items are its prefix): O [cap, heads, 8, dv] fp32, (max, sum) [cap, heads, 8] float2,
// then [cap, heads] counters (plan.h lays them out). cap = 0: no slots.
struct SplitWorkspace {
  float* ws;
  float2* ws_ml;
  int* done;
  int64_t cap;
};

// The forward: attn_fwd_scalar, and attn_fwd_tc's launch (which passes the fields).
template <class T>
struct AttnFwdParams {
  const T *q, *k, *v, *bias;
  T* out;
  float* lse;       // [H, m] row log-sum-exp
  KernelPattern a;  // A's window arrays
  int64_t heads, m, n, d, dv, nnz;
  Heads hc;
  float scale;
  int has_bias;
  SplitWorkspace split;  // attn_fwd_tc: split windows' partials merged across CTAs
  int grouped;           // attn_fwd_tc: the schedule is grouped (pieces merge inside a CTA)
};

// The jvp (attn_jvp_scalar): the primal operands, their tangents (dq, dk, dvv, dbias) and the
// output's tangent.
template <class T>
struct AttnJvpParams {
  const T *q, *k, *v, *bias;
  const float* lse;
  const T *dq, *dk, *dvv, *dbias;
  T* dout;
  KernelPattern a;
  int64_t heads, m, n, d, dv, nnz;
  Heads hc, hd;  // head counts of the operands and of their tangents
  int64_t hl;    // head count of lse
  float scale;
  int has_bias;
};

}  // namespace attention
}  // namespace jaxsparse_tc
