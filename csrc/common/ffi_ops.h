// Each operator's FFI binding (common/ops.h lists the operators), written once for both
// platforms: the operands, results and attributes both handlers take, in the order Python's
// lowering passes them (jaxsparse_tc/_src/lowering.py register_ffi_lowering: the dense operands,
// then the pattern arrays its pick returns, then the results; attributes by name). A platform
// fills four slots with what is its own, each a chain of binding calls or empty:
//   CTX    its context (CPU: the thread pool; CUDA: the stream), first
//   ARGS   operands after the shared ones (CUDA: the row view, or each value's row)
//   RETS   results after the shared ones (CUDA: a workspace)
//   ATTRS  attributes after the shared ones (CUDA: the kernel choice, launch-plan switches)
// e.g. XLA_FFI_DEFINE_HANDLER_SYMBOL(SpmmCpu, spmm_cpu,
//                                    JAXSPARSE_TC_BIND_SPMM(.Ctx<ffi::ThreadPool>(), , , ));
// A change to a binding is a change of the operator's ABI: bump its version in common/ops.h.
#pragma once
#include <cstdint>

#include "common/ffi_pattern.h"
#include "common/ops.h"
#include "xla/ffi/api/ffi.h"

// spmm: out[h] = A_h X_h. precision: Precision (common/ops.h).
#define JAXSPARSE_TC_BIND_SPMM(CTX, ARGS, RETS, ATTRS)         \
  ::xla::ffi::Ffi::Bind()                                      \
      CTX.Arg<::xla::ffi::AnyBuffer>()  /* values [Hv, nnz] */ \
          .Arg<::xla::ffi::AnyBuffer>() /* x [Hx, n, d] */     \
      JAXSPARSE_TC_PATTERN_ARGS ARGS                           \
          .Ret<::xla::ffi::AnyBuffer>() /* out [H, m, d] */    \
      RETS.Attr<int32_t>("precision") ATTRS

// spmm_extremum: out[h, i, k] = max (is_min: min) over A's entries (i, j) of A_h[i, j] X_h[j, k],
// 0 in a row without entries; arg[h, i, k] the format position of the entry that gave it (the
// first on a tie; -1 in a row without entries), which the gradients gather through.
#define JAXSPARSE_TC_BIND_SPMM_EXTREMUM(CTX, ARGS, RETS, ATTRS) \
  ::xla::ffi::Ffi::Bind()                                       \
      CTX.Arg<::xla::ffi::AnyBuffer>()  /* values [Hv, nnz] */  \
          .Arg<::xla::ffi::AnyBuffer>() /* x [Hx, n, d] */      \
      JAXSPARSE_TC_PATTERN_ARGS ARGS                            \
          .Ret<::xla::ffi::AnyBuffer>() /* out [H, m, d] */     \
          .Ret<::jaxsparse_tc::I32>()   /* arg [H, m, d] */     \
      RETS.Attr<int32_t>("is_min") ATTRS

// sddmm: out[h, idx(i, j)] = <X_h[i], Y_h[j]> at A's nonzeros. out: x's dtype, or float32 for
// 16-bit x.
#define JAXSPARSE_TC_BIND_SDDMM(CTX, ARGS, RETS, ATTRS)    \
  ::xla::ffi::Ffi::Bind()                                  \
      CTX.Arg<::xla::ffi::AnyBuffer>()  /* x [Hx, m, d] */ \
          .Arg<::xla::ffi::AnyBuffer>() /* y [Hy, n, d] */ \
      JAXSPARSE_TC_PATTERN_ARGS ARGS                       \
          .Ret<::xla::ffi::AnyBuffer>() /* out [H, nnz] */ \
      RETS.Attr<int32_t>("precision") ATTRS

// edge_softmax: row-wise softmax of A's values.
#define JAXSPARSE_TC_BIND_EDGE_SOFTMAX(CTX, ARGS, RETS, ATTRS)                          \
  ::xla::ffi::Ffi::Bind()                                                               \
      CTX.Arg<::xla::ffi::AnyBuffer>()                            /* values [H, nnz] */ \
      JAXSPARSE_TC_PATTERN_ARGS ARGS.Ret<::xla::ffi::AnyBuffer>() /* out [H, nnz] */    \
      RETS ATTRS

// edge_softmax_bwd: out = y * (t - rowsum(y * t)).
#define JAXSPARSE_TC_BIND_EDGE_SOFTMAX_BWD(CTX, ARGS, RETS, ATTRS)                   \
  ::xla::ffi::Ffi::Bind()                                                            \
      CTX.Arg<::xla::ffi::AnyBuffer>()                            /* y [Hy, nnz] */  \
          .Arg<::xla::ffi::AnyBuffer>()                           /* t [Ht, nnz] */  \
      JAXSPARSE_TC_PATTERN_ARGS ARGS.Ret<::xla::ffi::AnyBuffer>() /* out [H, nnz] */ \
      RETS ATTRS

// The attention operators' shared attributes: the logits' scale, and whether bias is read (else
// it is a [1, 1] placeholder).
#define JAXSPARSE_TC_ATTENTION_ATTRS .Attr<float>("scale").Attr<int32_t>("has_bias")

// The attention operators' first operands: q, k, v and the float32 bias.
#define JAXSPARSE_TC_ATTENTION_QKVB                                   \
  .Arg<::xla::ffi::AnyBuffer>()                   /* q [Hq, m, d] */  \
      .Arg<::xla::ffi::AnyBuffer>()               /* k [Hk, n, d] */  \
      .Arg<::xla::ffi::AnyBuffer>()               /* v [Hv, n, dv] */ \
      .Arg<::xla::ffi::Buffer<::xla::ffi::F32>>() /* bias [Hb, nnz] */

// attention_fwd: O = softmax_row(mask_A(scale Q K^T + bias)) V and the rows' log-sum-exp.
#define JAXSPARSE_TC_BIND_ATTENTION_FWD(CTX, ARGS, RETS, ATTRS)                     \
  ::xla::ffi::Ffi::Bind() CTX JAXSPARSE_TC_ATTENTION_QKVB JAXSPARSE_TC_PATTERN_ARGS \
      ARGS.Ret<::xla::ffi::AnyBuffer>()               /* o [H, m, dv] */            \
          .Ret<::xla::ffi::Buffer<::xla::ffi::F32>>() /* lse [H, m] */              \
      RETS JAXSPARSE_TC_ATTENTION_ATTRS ATTRS

// attention_jvp: dO for the tangents (dq, dk, dv, dbias) from the saved lse. dbias: float32 (as
// Python passes it; each handler checks its dtype where has_bias).
#define JAXSPARSE_TC_BIND_ATTENTION_JVP(CTX, ARGS, RETS, ATTRS)                        \
  ::xla::ffi::Ffi::Bind() CTX JAXSPARSE_TC_ATTENTION_QKVB                              \
      .Arg<::xla::ffi::AnyBuffer>()                               /* o [Ho, m, dv] */  \
      .Arg<::xla::ffi::Buffer<::xla::ffi::F32>>()                 /* lse [Hl, m] */    \
      .Arg<::xla::ffi::AnyBuffer>()                               /* dq, as q */       \
      .Arg<::xla::ffi::AnyBuffer>()                               /* dk, as k */       \
      .Arg<::xla::ffi::AnyBuffer>()                               /* dv, as v */       \
      .Arg<::xla::ffi::AnyBuffer>()                               /* dbias, as bias */ \
      JAXSPARSE_TC_PATTERN_ARGS ARGS.Ret<::xla::ffi::AnyBuffer>() /* do [H, m, dv] */  \
      RETS JAXSPARSE_TC_ATTENTION_ATTRS ATTRS

// The attention backwards' operands: the forward's, its outputs and the output's cotangent.
#define JAXSPARSE_TC_ATTENTION_BWD_OPERANDS                           \
  JAXSPARSE_TC_ATTENTION_QKVB                                         \
      .Arg<::xla::ffi::AnyBuffer>()               /* o [Ho, m, dv] */ \
      .Arg<::xla::ffi::Buffer<::xla::ffi::F32>>() /* lse [Hl, m] */   \
      .Arg<::xla::ffi::AnyBuffer>()               /* do [Hd, m, dv] */

// attention_bwd: the composed backward's per-edge pass, P and dS in A's format order. Its
// pattern operands are the platform's (CUDA: A's row view).
#define JAXSPARSE_TC_BIND_ATTENTION_BWD(CTX, ARGS, RETS, ATTRS)   \
  ::xla::ffi::Ffi::Bind() CTX JAXSPARSE_TC_ATTENTION_BWD_OPERANDS \
      ARGS.Ret<::xla::ffi::AnyBuffer>() /* p [H, nnz] */          \
          .Ret<::xla::ffi::AnyBuffer>() /* ds [H, nnz] */         \
      RETS JAXSPARSE_TC_ATTENTION_ATTRS ATTRS

// attention_grads: the whole backward (dq, dk, dv, dbias) over A's windows and A^T's.
#define JAXSPARSE_TC_BIND_ATTENTION_GRADS(CTX, ARGS, RETS, ATTRS)                           \
  ::xla::ffi::Ffi::Bind()                                                                   \
      CTX JAXSPARSE_TC_ATTENTION_BWD_OPERANDS JAXSPARSE_TC_PATTERN_ARGS /* A's */           \
          JAXSPARSE_TC_PATTERN_ARGS                                     /* A^T's */         \
              .Arg<::jaxsparse_tc::I32>()                               /* perm_t [nnz] */  \
      ARGS.Ret<::xla::ffi::AnyBuffer>()                                 /* dq [H, m, d] */  \
              .Ret<::xla::ffi::AnyBuffer>()                             /* dk [H, n, d] */  \
              .Ret<::xla::ffi::AnyBuffer>()                             /* dv [H, n, dv] */ \
              .Ret<::xla::ffi::AnyBuffer>() /* dbias [H, nnz] (or [H, 0]) */                \
      RETS JAXSPARSE_TC_ATTENTION_ATTRS ATTRS
