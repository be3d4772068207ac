// The CPU extension: the format builder and the CPU FFI handlers, as capsules for jax.ffi.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <vector>

#include "cpu/pattern_build.h"
#include "cpu/reorder.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

namespace jaxsparse_tc {
extern "C" XLA_FFI_Error* SpmmCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* SddmmCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* EdgeSoftmaxCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* EdgeSoftmaxBwdCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionFwdCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* AttentionJvpCpu(XLA_FFI_CallFrame*);
}  // namespace jaxsparse_tc

namespace {

template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape, del);
}

using IndexArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dict build_pattern(IndexArray rows, IndexArray cols, int64_t m, int64_t n) {
  const int64_t count = int64_t(rows.shape(0));
  jaxsparse_tc::BuiltPattern p;
  {
    nb::gil_scoped_release release;
    p = jaxsparse_tc::build_pattern(rows.data(), cols.data(), count, m, n);
  }
  const size_t W = p.window_col_ptr.size(), C = p.window_cols.size();
  const size_t B = p.block_bitmap.size() / 2, nnz = size_t(p.nnz);
  nb::dict out;
  out["window_col_ptr"] = to_numpy(std::move(p.window_col_ptr), {W});
  out["window_cols"] = to_numpy(std::move(p.window_cols), {C});
  out["window_block_ptr"] = to_numpy(std::move(p.window_block_ptr), {W});
  out["block_bitmap"] = to_numpy(std::move(p.block_bitmap), {B, 2});
  out["block_value_ptr"] = to_numpy(std::move(p.block_value_ptr), {B + 1});
  out["rows"] = to_numpy(std::move(p.rows), {nnz});
  out["cols"] = to_numpy(std::move(p.cols), {nnz});
  out["row_ptr"] = to_numpy(std::move(p.row_ptr), {size_t(m) + 1});
  out["row_entries"] = to_numpy(std::move(p.row_entries), {nnz, 2});
  out["input_to_format"] = to_numpy(std::move(p.input_to_format), {size_t(count)});
  return out;
}

template <typename Fn>
nb::capsule handler(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_cpu, m) {
  jaxsparse_tc::register_reorder(m);  // reorder(), block_stats() (cpu/reorder.h)
  m.def("build_pattern", &build_pattern, nb::arg("rows"), nb::arg("cols"), nb::arg("m"),
        nb::arg("n"),
        "One orientation of the format from validated int64 COO indices (docs/FORMAT.md).");
  m.def("registrations", []() {
    nb::dict d;
    d["jaxsparse_tc_spmm"] = handler(jaxsparse_tc::SpmmCpu);
    d["jaxsparse_tc_sddmm"] = handler(jaxsparse_tc::SddmmCpu);
    d["jaxsparse_tc_edge_softmax"] = handler(jaxsparse_tc::EdgeSoftmaxCpu);
    d["jaxsparse_tc_edge_softmax_bwd"] = handler(jaxsparse_tc::EdgeSoftmaxBwdCpu);
    d["jaxsparse_tc_attention_fwd"] = handler(jaxsparse_tc::AttentionFwdCpu);
    d["jaxsparse_tc_attention_jvp"] = handler(jaxsparse_tc::AttentionJvpCpu);
    return d;
  });
}
