// The CUDA extension: CUDA FFI handlers as capsules for jax.ffi (platform "CUDA").
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "common/select.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

namespace jaxsparse_tc {
extern "C" XLA_FFI_Error* SpmmCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* SddmmCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* EdgeSoftmaxCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* EdgeSoftmaxBwdCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionFwdCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionJvpCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionBwdCuda(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionGradsCuda(XLA_FFI_CallFrame*);
// Workspace result sizes, from the same plans the handlers launch by (spmm/plan.h,
// attention/plan.h). `kernel`: the SpMM handler's attribute (cuda/common/plan.h KernelChoice);
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
    d["jaxsparse_tc_attention_bwd"] = capsule(jaxsparse_tc::AttentionBwdCuda);
    d["jaxsparse_tc_attention_grads"] = capsule(jaxsparse_tc::AttentionGradsCuda);
    return d;
  });
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
      "Bytes of the SpMM handler's workspace result: its launch plan's (spmm/plan.h); A's "
      "pattern features as in common/select.h.");
  m.def("attention_workspace_bytes", &jaxsparse_tc::attention_workspace_bytes);
  m.def("attention_grads_workspace_bytes", &jaxsparse_tc::attention_grads_workspace_bytes);
}
