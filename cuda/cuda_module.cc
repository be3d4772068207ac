// The CUDA extension: CUDA FFI handlers as capsules for jax.ffi (platform "CUDA").
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

NB_MODULE(_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    return d;
  });
}
