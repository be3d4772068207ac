// The CUDA extension: CUDA FFI handlers as capsules for jax.ffi (platform "CUDA").
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

namespace jaxsparse_tc {
extern "C" XLA_FFI_Error* SpmmCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* SddmmCuda(XLA_FFI_CallFrame*);
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
    return d;
  });
}
