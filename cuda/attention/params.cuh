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
// then [cap, heads] counters (plan/attention.h lays them out). cap = 0: no slots.
struct SplitWorkspace {
  float* ws;
  float2* ws_ml;
  int* done;
  int64_t cap;
};

// What the forward and the jvp share: A's window arrays and the shapes, q [Hq, m, d],
// k [Hk, n, d], v [Hv, n, dv], bias [Hb, nnz] float32 (a dummy unless has_bias); H output heads.
struct AttnShape {
  KernelPattern a;
  int64_t heads, m, n, d, dv, nnz;
  Heads hc;
  float scale;
  int has_bias;
};

// The shapes of a handler's operands, `out` being its [H, m, dv] result; `a` A's kernel arrays
// (kernel_pattern with K's rows and the bias's positions as its bounds). Without a bias (or with
// an empty one) nothing reads it.
inline AttnShape attn_shape(const KernelPattern& a, const ffi::AnyBuffer& q,
                            const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                            const ffi::Buffer<ffi::F32>& bias, ffi::Span<const int64_t> out,
                            float scale, int has_bias) {
  return AttnShape{
      a,
      out[0],
      out[1],
      k.dimensions()[1],
      q.dimensions()[2],
      out[2],
      bias.dimensions()[1],
      Heads{q.dimensions()[0], k.dimensions()[0], v.dimensions()[0], bias.dimensions()[0]},
      scale,
      has_bias && bias.element_count() > 0};
}

template <class T>
struct AttnOperands : AttnShape {
  const T *q, *k, *v;
  const float* bias;

  void set(const AttnShape& s, const ffi::AnyBuffer& q_, const ffi::AnyBuffer& k_,
           const ffi::AnyBuffer& v_, const ffi::Buffer<ffi::F32>& bias_) {
    static_cast<AttnShape&>(*this) = s;
    q = static_cast<const T*>(q_.untyped_data());
    k = static_cast<const T*>(k_.untyped_data());
    v = static_cast<const T*>(v_.untyped_data());
    bias = bias_.typed_data();
  }
};

// The forward: attn_fwd_scalar, and attn_fwd_tc's launch (which passes the fields).
template <class T>
struct AttnFwdParams : AttnOperands<T> {
  T* out;
  float* lse;            // [H, m] row log-sum-exp
  SplitWorkspace split;  // attn_fwd_tc: split windows' partials merged across CTAs
  int grouped;           // attn_fwd_tc: the schedule is grouped (pieces merge inside a CTA)
};

// The jvp (attn_jvp_scalar): the primal operands, their tangents (dq, dk, dvv, dbias: float32
// like the bias where dbias_f32, else T) and the output's tangent.
template <class T>
struct AttnJvpParams : AttnOperands<T> {
  const float* lse;
  const T *dq, *dk, *dvv;
  const void* dbias;
  int dbias_f32;
  T* dout;
  Heads hd;    // head counts of the tangents
  int64_t hl;  // head count of lse
};

}  // namespace attention
}  // namespace jaxsparse_tc
