// The CPU extension: the format builder and the CPU FFI handlers, as capsules for jax.ffi.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <vector>

#include "common/select.h"
#include "cpu/pattern_build.h"
#include "cpu/reorder.h"
// The CUDA launch plans are host code without CUDA headers: kernel_choices runs them here, so
// that the choice they make can be asked on any machine.
#include "cuda/attention/plan.h"
#include "cuda/sddmm/plan.h"
#include "cuda/spmm/plan.h"
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

// The kernel family each CUDA launch plan picks for a pattern's features (common/select.h) and
// the dense operands, under the KernelOptions codes given (0: auto). Family names are
// KernelOptions': "tensor_core" is the window family, exact float32's included.
nb::dict kernel_choices(int64_t rows, int64_t nnz, int64_t windows, int64_t blocks,
                        int64_t condensed_cols, int64_t d, int esize, bool exact, int64_t row_items,
                        int64_t heads, int spmm_kernel, int sddmm_kernel, int attention_backward) {
  using namespace jaxsparse_tc;
  if (rows < 0 || nnz < 0 || windows < 0 || blocks < 0 || condensed_cols < 0 || d < 0 ||
      row_items < 0 || heads < 1)
    throw nb::value_error("kernel_choices: counts must be >= 0 (heads >= 1)");
  if (esize != 2 && esize != 4) throw nb::value_error("kernel_choices: esize must be 2 or 4");
  if (exact && esize != 4) throw nb::value_error("kernel_choices: exact needs float32 (esize 4)");
  if (attention_backward < 0 || attention_backward > 2)
    throw nb::value_error("kernel_choices: attention_backward must be 0 (auto), 1 or 2");
  const PatternFeatures f{rows, nnz, windows, blocks, condensed_cols};
  // num_items only sizes the window family's workspace, not the choice.
  SpmmPlan spmm_plan;
  if (auto err = plan_spmm({esize, exact, f, 0, row_items, d, heads}, spmm_kernel, spmm_plan);
      err.failure())
    throw nb::value_error(err.message().c_str());
  SddmmPlan sddmm_plan;
  if (auto err = plan_sddmm({esize, exact, f, 0, heads, d}, sddmm_kernel, sddmm_plan);
      err.failure())
    throw nb::value_error(err.message().c_str());
  // attention_backward: 1 fused, 2 composed; fused only where its kernels take the operands.
  const bool fused = attention_tc_shape(esize, d, d) &&
                     (attention_backward == 1 ||
                      (attention_backward == 0 && attention_backward_prefers_fused(f, d, esize)));
  const DerivedFeatures x = derived_features(f);
  nb::dict out;
  out["spmm"] = spmm_plan.rows ? "cuda_core" : "tensor_core";
  out["sddmm"] = sddmm_plan.kernel == SddmmKernel::kRows ? "cuda_core" : "tensor_core";
  out["attention_backward"] = fused ? "fused" : "composed";
  out["nnz_per_block"] = x.nnz_per_block;
  out["cols_per_window"] = x.cols_per_window;
  out["mean_row_length"] = x.mean_row_length;
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
  m.def("kernel_choices", &kernel_choices, nb::arg("rows"), nb::arg("nnz"), nb::arg("windows"),
        nb::arg("blocks"), nb::arg("condensed_cols"), nb::arg("d"), nb::arg("esize"),
        nb::arg("exact"), nb::kw_only(), nb::arg("row_items") = 0, nb::arg("heads") = 1,
        nb::arg("spmm_kernel") = 0, nb::arg("sddmm_kernel") = 0, nb::arg("attention_backward") = 0,
        "The kernel family each CUDA launch plan picks (dict: spmm and sddmm \"cuda_core\" or "
        "\"tensor_core\", attention_backward \"fused\" or \"composed\") and the derived "
        "features (nnz_per_block, cols_per_window, mean_row_length), from one orientation's "
        "pattern features (common/select.h), the dense width d and element size, exact "
        "float32, and the KernelOptions codes (0: auto; attention_backward 1 fused, 2 "
        "composed). row_items (the row schedule's length) and heads size the SpMM row kernels' "
        "workspace, which must fit for them to run; the default (no row cut into several CTA "
        "items) assumes it does. The attention answer takes dv = d.");
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
