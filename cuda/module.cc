// The CUDA extension: CUDA FFI handlers as capsules for jax.ffi (platform "CUDA").
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "common/ops.h"
#include "common/ops_python.h"
#include "plan/select.h"

namespace nb = nanobind;

namespace jaxsparse_tc {
JAXSPARSE_TC_OPS(JAXSPARSE_TC_DECLARE_CUDA)
constexpr OpHandler kCudaHandlers[] = {JAXSPARSE_TC_OPS(JAXSPARSE_TC_HANDLER_CUDA)};

// Workspace result sizes, from the same plans the handlers launch by (plan/spmm.h,
// plan/attention.h). `kernel`: the SpMM handler's attribute (common/ops.h KernelChoice);
// an invalid one sets `error` and returns -1.
int64_t spmm_workspace_bytes(int esize, bool exact, int kernel, const PatternFeatures& pattern,
                             int64_t num_items, int64_t row_items, int64_t d, int64_t heads,
                             std::string* error);
int64_t attention_workspace_bytes(int esize, int64_t d, int64_t dv, int64_t heads,
                                  int64_t num_items, bool grouped, bool merge_split_windows);
int64_t attention_grads_workspace_bytes(int64_t d, int64_t heads, int64_t m, int64_t items_a,
                                        int64_t items_t, bool grouped_a, bool grouped_t,
                                        bool merge_split_windows);
}  // namespace jaxsparse_tc

NB_MODULE(_cuda, m) {
  // The op table as this extension was built with it (Python checks it against the CPU
  // extension's) and this extension's handlers (common/ops.h).
  jaxsparse_tc::export_op_table(m);
  jaxsparse_tc::def_registrations(m, jaxsparse_tc::kCudaHandlers);
  m.def(
      "spmm_workspace_bytes",
      [](int esize, bool exact, int kernel, int64_t rows, int64_t nnz, int64_t windows,
         int64_t blocks, int64_t condensed_cols, int64_t num_items, int64_t row_items, int64_t d,
         int64_t heads) {
        std::string error;
        const int64_t bytes = jaxsparse_tc::spmm_workspace_bytes(
            esize, exact, kernel, {rows, nnz, windows, blocks, condensed_cols}, num_items,
            row_items, d, heads, &error);
        if (bytes < 0) throw nb::value_error(error.c_str());
        return bytes;
      },
      nb::arg("esize"), nb::arg("exact"), nb::arg("kernel"), nb::arg("rows"), nb::arg("nnz"),
      nb::arg("windows"), nb::arg("blocks"), nb::arg("condensed_cols"), nb::arg("num_items"),
      nb::arg("row_items"), nb::arg("d"), nb::arg("heads"),
      "Bytes of the SpMM handler's workspace result: its launch plan's (plan/spmm.h); A's "
      "pattern features as in plan/select.h.");
  m.def("attention_workspace_bytes", &jaxsparse_tc::attention_workspace_bytes);
  m.def("attention_grads_workspace_bytes", &jaxsparse_tc::attention_grads_workspace_bytes);
}
