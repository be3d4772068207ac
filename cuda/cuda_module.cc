// The CUDA extension: CUDA FFI handlers as capsules for jax.ffi (platform "CUDA").
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

namespace jaxsparse_tc {
extern "C" XLA_FFI_Error* SpmmCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* SddmmCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* EdgeSoftmaxCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* EdgeSoftmaxBwdCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionFwdCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionJvpCuda(XLA_FFI_CallFrame*);
}  // namespace jaxsparse_tc

namespace {
template <typename F>
nb::capsule capsule(F* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["jaxsparse_tc_spmm"] = capsule(jaxsparse_tc::SpmmCuda);
    d["jaxsparse_tc_sddmm"] = capsule(jaxsparse_tc::SddmmCuda);
    d["jaxsparse_tc_edge_softmax"] = capsule(jaxsparse_tc::EdgeSoftmaxCuda);
    d["jaxsparse_tc_edge_softmax_bwd"] = capsule(jaxsparse_tc::EdgeSoftmaxBwdCuda);
    d["jaxsparse_tc_attention_fwd"] = capsule(jaxsparse_tc::AttentionFwdCuda);
    d["jaxsparse_tc_attention_jvp"] = capsule(jaxsparse_tc::AttentionJvpCuda);
    return d;
  });
}
