// The op table (common/ops.h) as an extension's Python attributes and its registrations().
#pragma once
#include <nanobind/nanobind.h>

#include <cstddef>

#include "common/ops.h"

namespace jaxsparse_tc {

// OPS: {name: FFI target}; OP_PLATFORMS: {name: the platforms with a handler, of "cpu", "cuda"}.
inline void export_op_table(nanobind::module_& m) {
  nanobind::dict ops, platforms;
  for (const OpInfo& op : kOps) {
    ops[op.name] = op.target;
    nanobind::list on;
    if (op.cpu) on.append("cpu");
    if (op.cuda) on.append("cuda");
    platforms[op.name] = nanobind::tuple(on);
  }
  m.attr("OPS") = ops;
  m.attr("OP_PLATFORMS") = platforms;
}

// {name: code} of a list of codes, in code order.
template <size_t N>
nanobind::dict code_dict(const NamedCode (&codes)[N]) {
  nanobind::dict d;
  for (const NamedCode& c : codes) d[c.name] = c.code;
  return d;
}

// registrations(): {FFI target: handler capsule} of a platform's handlers, for
// jax.ffi.register_ffi_target.
template <size_t N>
void def_registrations(nanobind::module_& m, const OpHandler (&handlers)[N]) {
  const OpHandler* first = handlers;
  m.def(
      "registrations",
      [first]() {
        nanobind::dict d;
        for (size_t i = 0; i < N; ++i)
          d[op_target(first[i].op)] = nanobind::capsule(reinterpret_cast<void*>(first[i].handler));
        return d;
      },
      "This extension's handlers: {FFI target (a value of OPS): handler capsule}, for "
      "jax.ffi.register_ffi_target.");
}

}  // namespace jaxsparse_tc
