// The CPU extension: the format builder and the CPU FFI handlers, as capsules for jax.ffi.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "common/ops.h"
#include "common/ops_python.h"
#include "plan/select.h"
#include "cpu/pattern_build.h"
#include "cpu/pattern_check.h"
#include "cpu/reorder.h"
#include "cpu/sampler.h"
// The CUDA launch plans are host code without CUDA headers: kernel_choices runs them here, so
// that the choice they make can be asked on any machine.
#include "plan/attention.h"
#include "plan/sddmm.h"
#include "plan/spmm.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

namespace jaxsparse_tc {
JAXSPARSE_TC_OPS(JAXSPARSE_TC_DECLARE_CPU)
constexpr OpHandler kCpuHandlers[] = {JAXSPARSE_TC_OPS(JAXSPARSE_TC_HANDLER_CPU)};
}  // namespace jaxsparse_tc

namespace {

template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape, del);
}

using IndexArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dict build_pattern(IndexArray rows, IndexArray cols, int64_t m, int64_t n,
                       std::optional<bool> grouped, std::optional<int64_t> split_blocks,
                       std::optional<std::string> row_order) {
  const int64_t count = int64_t(rows.shape(0));
  jaxsparse_tc::ScheduleOptions options{grouped, split_blocks, std::nullopt};
  if (row_order) options.row_order = jaxsparse_tc::parse_row_order(*row_order);
  jaxsparse_tc::BuiltPattern p;
  {
    nb::gil_scoped_release release;
    p = jaxsparse_tc::build_pattern(rows.data(), cols.data(), count, m, n, options);
  }
  const size_t W = p.window_col_ptr.size(), C = p.window_cols.size();
  const size_t B = p.block_bitmap.size() / 2, nnz = size_t(p.nnz);
  const size_t S = p.schedule.size() / jaxsparse_tc::kScheduleFields, R = p.row_schedule.size() / 4;
  nb::dict out;
  out["window_col_ptr"] = to_numpy(std::move(p.window_col_ptr), {W});
  out["window_cols"] = to_numpy(std::move(p.window_cols), {C});
  out["window_block_ptr"] = to_numpy(std::move(p.window_block_ptr), {W});
  out["block_bitmap"] = to_numpy(std::move(p.block_bitmap), {B, 2});
  out["block_value_ptr"] = to_numpy(std::move(p.block_value_ptr), {B + 1});
  out["schedule"] = to_numpy(std::move(p.schedule), {S, size_t(jaxsparse_tc::kScheduleFields)});
  out["rows"] = to_numpy(std::move(p.rows), {nnz});
  out["cols"] = to_numpy(std::move(p.cols), {nnz});
  out["row_entries"] = to_numpy(std::move(p.row_entries), {nnz, 2});
  out["row_schedule"] = to_numpy(std::move(p.row_schedule), {R, 4});
  out["input_to_format"] = to_numpy(std::move(p.input_to_format), {size_t(count)});
  out["grouped"] = p.grouped;
  return out;
}

using DoubleArray = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Neighbour sampling (cpu/sampler.h): a list of dicts per layer, numpy arrays sources (int64),
// rows, cols (int32, local indices) and edge_ids (int64 CSR positions).
nb::list sample_neighbors(IndexArray indptr, Int32Array indices, IndexArray targets,
                          std::vector<int64_t> fanouts, uint64_t seed, bool replace,
                          std::optional<DoubleArray> weights, std::optional<IndexArray> edge_order,
                          int threads) {
  const int64_t n = int64_t(indptr.shape(0)) - 1, nnz = int64_t(indices.shape(0));
  if (n < 0) throw nb::value_error("sample_neighbors: indptr must have n + 1 >= 1 entries");
  if (indptr.data()[0] != 0 || indptr.data()[n] != nnz)
    throw nb::value_error("sample_neighbors: indptr must start at 0 and end at len(indices)");
  if (weights && int64_t(weights->shape(0)) != nnz)
    throw nb::value_error("sample_neighbors: weights must have one entry per index");
  if (edge_order && int64_t(edge_order->shape(0)) != nnz)
    throw nb::value_error("sample_neighbors: edge_order must have one entry per index");
  for (int64_t f : fanouts)
    if (f < -1) throw nb::value_error("sample_neighbors: fanouts must be >= 0 or -1");
  jaxsparse_tc::SampleOptions options;
  options.replace = replace;
  options.weights = weights ? weights->data() : nullptr;
  options.threads = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<jaxsparse_tc::SampledLayer> layers;
  {
    nb::gil_scoped_release release;
    layers = jaxsparse_tc::sample_neighbors(indptr.data(), indices.data(), n, targets.data(),
                                            int64_t(targets.shape(0)), fanouts, seed, options);
    // CSR positions -> the caller's edge ids, here rather than as a gather in Python (random
    // reads over the graph's edges, under the GIL there).
    if (edge_order)
      for (auto& layer : layers)
        for (int64_t& e : layer.edge_ids) e = edge_order->data()[e];
  }
  nb::list out;
  for (auto& layer : layers) {
    const size_t S = layer.sources.size(), E = layer.rows.size();
    nb::dict d;
    d["sources"] = to_numpy(std::move(layer.sources), {S});
    d["rows"] = to_numpy(std::move(layer.rows), {E});
    d["cols"] = to_numpy(std::move(layer.cols), {E});
    d["edge_ids"] = to_numpy(std::move(layer.edge_ids), {E});
    out.append(d);
  }
  return out;
}

// The arrays one after another in one new buffer (bytes), copied with the GIL released: a
// sampled batch's ~60 host arrays travel to the device as one buffer per dtype.
using ByteSource = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
nb::ndarray<nb::numpy, uint8_t> concat_bytes(std::vector<ByteSource> arrays) {
  size_t total = 0;
  std::vector<std::pair<const uint8_t*, size_t>> parts;
  parts.reserve(arrays.size());
  for (const auto& a : arrays) {
    parts.emplace_back(static_cast<const uint8_t*>(a.data()), a.nbytes());
    total += a.nbytes();
  }
  std::vector<uint8_t> out;
  {
    nb::gil_scoped_release release;
    out.resize(total);
    size_t at = 0;
    for (const auto& [data, bytes] : parts) {
      if (bytes) std::memcpy(out.data() + at, data, bytes);
      at += bytes;
    }
  }
  return to_numpy(std::move(out), {total});
}

// One sampled layer's padded matrix (cpu/sampler.h padded_block): a dict of the two
// orientations' Pattern arrays (keys "a" and "t"), values, perm_t, perm_t_inv, input_to_format.
nb::dict padded_block(Int32Array rows, Int32Array cols, int64_t num_real_nodes, int64_t num_slots,
                      int64_t nnz, int64_t edges, int64_t cols_len, int64_t blocks, int64_t items,
                      int64_t row_items, bool grouped, int threads) {
  if (rows.shape(0) != cols.shape(0))
    throw nb::value_error("padded_block: rows and cols must have one entry per edge");
  jaxsparse_tc::BlockBudget budget{num_slots, nnz,   edges,     cols_len,
                                   blocks,    items, row_items, grouped};
  jaxsparse_tc::PaddedBlock b;
  {
    nb::gil_scoped_release release;
    b = jaxsparse_tc::padded_block(rows.data(), cols.data(), int64_t(rows.shape(0)), num_real_nodes,
                                   budget, threads);
  }
  auto pattern = [](jaxsparse_tc::BuiltPattern& p) {
    const size_t W = p.window_col_ptr.size(), C = p.window_cols.size();
    const size_t B = p.block_bitmap.size() / 2, nnz = size_t(p.nnz);
    const size_t S = p.schedule.size() / jaxsparse_tc::kScheduleFields;
    const size_t R = p.row_schedule.size() / 4;
    nb::dict d;
    d["window_col_ptr"] = to_numpy(std::move(p.window_col_ptr), {W});
    d["window_cols"] = to_numpy(std::move(p.window_cols), {C});
    d["window_block_ptr"] = to_numpy(std::move(p.window_block_ptr), {W});
    d["block_bitmap"] = to_numpy(std::move(p.block_bitmap), {B, 2});
    d["block_value_ptr"] = to_numpy(std::move(p.block_value_ptr), {B + 1});
    d["schedule"] = to_numpy(std::move(p.schedule), {S, size_t(jaxsparse_tc::kScheduleFields)});
    d["rows"] = to_numpy(std::move(p.rows), {nnz});
    d["cols"] = to_numpy(std::move(p.cols), {nnz});
    d["row_entries"] = to_numpy(std::move(p.row_entries), {nnz, 2});
    d["row_schedule"] = to_numpy(std::move(p.row_schedule), {R, 4});
    d["grouped"] = p.grouped;
    return d;
  };
  const size_t n = size_t(nnz);
  nb::dict out;
  out["a"] = pattern(b.a);
  out["t"] = pattern(b.t);
  out["values"] = to_numpy(std::move(b.values), {n});
  out["perm_t"] = to_numpy(std::move(b.perm_t), {n});
  out["perm_t_inv"] = to_numpy(std::move(b.perm_t_inv), {n});
  out["input_to_format"] = to_numpy(std::move(b.input_to_format), {size_t(edges)});
  return out;
}

// The names kernel_choices gives the kernels a plan launches (KernelPlan.spmm_kernel and
// .sddmm_kernel): the family, and for the window family which of its kernels.
const char* spmm_kernel_name(jaxsparse_tc::SpmmKernel k) {
  using jaxsparse_tc::SpmmKernel;
  switch (k) {
    case SpmmKernel::kRows: return "rows";
    case SpmmKernel::kAsync: return "windows_async";
    case SpmmKernel::kRegisters: return "windows_registers";
    case SpmmKernel::kExactF32: return "exact_f32";
  }
  return "?";
}

const char* sddmm_kernel_name(jaxsparse_tc::SddmmKernel k) {
  using jaxsparse_tc::SddmmKernel;
  switch (k) {
    case SddmmKernel::kRows: return "rows";
    case SddmmKernel::kTensorCores: return "windows";
    case SddmmKernel::kExactF32: return "exact_f32";
  }
  return "?";
}

// The kernel family each CUDA launch plan picks for a pattern's features (plan/select.h) and
// the dense operands, under the KernelOptions codes given (0: auto). Family names are
// KernelOptions': "windows" is the window family, exact float32's included.
nb::dict kernel_choices(int64_t rows, int64_t nnz, int64_t windows, int64_t blocks,
                        int64_t condensed_cols, int64_t d, int esize, bool exact, int64_t row_items,
                        int64_t heads, int spmm_kernel, int sddmm_kernel, int attention_backward,
                        bool sm90) {
  using namespace jaxsparse_tc;
  if (rows < 0 || nnz < 0 || windows < 0 || blocks < 0 || condensed_cols < 0 || d < 0 ||
      row_items < 0 || heads < 1)
    throw nb::value_error("kernel_choices: counts must be >= 0 (heads >= 1)");
  if (esize != 2 && esize != 4) throw nb::value_error("kernel_choices: esize must be 2 or 4");
  if (exact && esize != 4) throw nb::value_error("kernel_choices: exact needs float32 (esize 4)");
  const PatternFeatures f{rows, nnz, windows, blocks, condensed_cols};
  // num_items only sizes the window family's workspace, not the choice.
  const SpmmShape spmm_shape{esize, exact, f, 0, row_items, d, heads};
  SpmmPlan spmm_plan;
  if (auto err = plan_spmm(spmm_shape, spmm_kernel, spmm_plan); err.failure())
    throw nb::value_error(err.message().c_str());
  // The launch with 16-byte aligned operands, as XLA allocates them.
  const SpmmLaunch spmm = spmm_launch(spmm_shape, spmm_plan, sm90, true, true);
  SddmmPlan sddmm_plan;
  if (auto err = plan_sddmm({esize, exact, f, 0, heads, d}, sddmm_kernel, sddmm_plan);
      err.failure())
    throw nb::value_error(err.message().c_str());
  AttentionBwdPlan bwd_plan;
  if (auto err = plan_attention_backward({esize, d, d, f}, attention_backward, bwd_plan);
      err.failure())
    throw nb::value_error(("kernel_choices: " + err.message()).c_str());
  const DerivedFeatures x = derived_features(f);
  nb::dict out;
  const auto family = [](bool rows) {
    return code_name(kKernelChoiceCodes, rows ? KernelChoice::kRows : KernelChoice::kWindows);
  };
  out["spmm"] = family(spmm_plan.rows);
  out["sddmm"] = family(sddmm_plan.kernel == SddmmKernel::kRows);
  out["spmm_kernel"] = spmm_kernel_name(spmm.kernel);
  out["sddmm_kernel"] = sddmm_kernel_name(sddmm_plan.kernel);
  out["attention_backward"] =
      code_name(kAttentionBackwardCodes,
                bwd_plan.fused ? AttentionBackward::kFused : AttentionBackward::kComposed);
  out["nnz_per_block"] = x.nnz_per_block;
  out["cols_per_window"] = x.cols_per_window;
  out["mean_row_length"] = x.mean_row_length;
  return out;
}

// Which attention backward runs (plan/attention.h plan_attention_backward) for A's pattern
// features, the operands' element size and head dims, and the KernelOptions code.
nb::dict attention_backward_plan(int64_t rows, int64_t nnz, int64_t windows, int64_t blocks,
                                 int64_t condensed_cols, int esize, int64_t d, int64_t dv,
                                 int attention_backward) {
  using namespace jaxsparse_tc;
  if (rows < 0 || nnz < 0 || windows < 0 || blocks < 0 || condensed_cols < 0 || d < 0 || dv < 0)
    throw nb::value_error("attention_backward_plan: counts and head dims must be >= 0");
  if (esize < 1) throw nb::value_error("attention_backward_plan: esize must be >= 1");
  AttentionBwdPlan plan;
  if (auto err = plan_attention_backward(
          {esize, d, dv, {rows, nnz, windows, blocks, condensed_cols}}, attention_backward, plan);
      err.failure())
    throw nb::value_error(("attention_backward_plan: " + err.message()).c_str());
  nb::dict out;
  out["backward"] = code_name(kAttentionBackwardCodes, plan.fused ? AttentionBackward::kFused
                                                                  : AttentionBackward::kComposed);
  out["edge_kernel"] = plan.edge_kernel;
  return out;
}

// An array argument of the validator as a C-contiguous array of T with D dimensions. The dtype
// and the rank must be T's and D exactly: an implicit cast (int64 to int32) could turn a corrupt
// array into a valid-looking one. Other layouts are copied (kept alive in `keep`).
template <typename T, size_t D>
using HostArray = nb::ndarray<const T, nb::ndim<D>, nb::c_contig, nb::device::cpu>;

template <typename T, size_t D>
HostArray<T, D> host_array(nb::handle h, const char* name, std::vector<nb::object>& keep) {
  nb::ndarray<nb::ro, nb::device::cpu> any;
  HostArray<T, D> out;
  const char* want = std::is_same_v<T, uint32_t> ? "uint32" : "int32";
  if (!nb::try_cast(h, any, /*convert=*/false))
    throw nb::type_error((std::string(name) + " must be a " + want + " array on the CPU; got " +
                          nb::inst_name(h).c_str())
                             .c_str());
  if (any.dtype() != nb::dtype<T>() || any.ndim() != D) {
    std::string shape = "(";
    for (size_t i = 0; i < any.ndim(); ++i) shape += (i ? ", " : "") + std::to_string(any.shape(i));
    throw nb::type_error((std::string(name) + " must be a " + want + " array of " +
                          std::to_string(D) + " dimension" + (D > 1 ? "s" : "") + "; got dtype " +
                          nb::str(nb::getattr(h, "dtype", nb::str("?"))).c_str() + ", shape " +
                          shape + ")")
                             .c_str());
  }
  if (nb::try_cast(h, out, /*convert=*/false)) return out;
  keep.push_back(nb::module_::import_("numpy").attr("ascontiguousarray")(h));
  if (nb::try_cast(keep.back(), out, /*convert=*/false)) return out;
  throw nb::type_error((std::string(name) + ": cannot read this array").c_str());
}

std::string check_pattern(nb::handle wcp_h, nb::handle wc_h, nb::handle wbp_h, nb::handle bitmap_h,
                          nb::handle bvp_h, nb::handle schedule_h, nb::handle rows_h,
                          nb::handle cols_h, nb::handle entries_h, nb::handle row_schedule_h,
                          int64_t m, int64_t n) {
  std::vector<nb::object> keep;
  const auto wcp = host_array<int32_t, 1>(wcp_h, "window_col_ptr", keep);
  const auto wc = host_array<int32_t, 1>(wc_h, "window_cols", keep);
  const auto wbp = host_array<int32_t, 1>(wbp_h, "window_block_ptr", keep);
  const auto bitmap = host_array<uint32_t, 2>(bitmap_h, "block_bitmap", keep);
  const auto bvp = host_array<int32_t, 1>(bvp_h, "block_value_ptr", keep);
  const auto schedule = host_array<int32_t, 2>(schedule_h, "schedule", keep);
  const auto rows = host_array<int32_t, 1>(rows_h, "rows", keep);
  const auto cols = host_array<int32_t, 1>(cols_h, "cols", keep);
  const auto entries = host_array<int32_t, 2>(entries_h, "row_entries", keep);
  const auto row_schedule = host_array<int32_t, 2>(row_schedule_h, "row_schedule", keep);
  jaxsparse_tc::KernelArrays a;
  a.view.window_col_ptr = wcp.data();
  a.view.window_cols = wc.data();
  a.view.window_block_ptr = wbp.data();
  a.view.block_bitmap = bitmap.data();
  a.view.block_value_ptr = bvp.data();
  a.view.schedule = schedule.data();
  a.view.num_windows = int64_t(wcp.shape(0)) - 1;
  a.view.num_blocks = int64_t(bvp.shape(0)) - 1;
  a.view.num_items = int64_t(schedule.shape(0));
  a.window_col_ptr_len = int64_t(wcp.shape(0));
  a.window_cols_len = int64_t(wc.shape(0));
  a.window_block_ptr_len = int64_t(wbp.shape(0));
  a.block_value_ptr_len = int64_t(bvp.shape(0));
  a.bitmap_rows = int64_t(bitmap.shape(0)), a.bitmap_cols = int64_t(bitmap.shape(1));
  a.schedule_rows = int64_t(schedule.shape(0)), a.schedule_cols = int64_t(schedule.shape(1));
  const jaxsparse_tc::RowArrays rv{
      entries.data(),      int64_t(entries.shape(0)),      int64_t(entries.shape(1)),
      row_schedule.data(), int64_t(row_schedule.shape(0)), int64_t(row_schedule.shape(1))};
  nb::gil_scoped_release release;
  return jaxsparse_tc::check_pattern(a, rows.data(), int64_t(rows.shape(0)), cols.data(),
                                     int64_t(cols.shape(0)), rv, m, n);
}

std::string check_transpose(nb::handle rows_h, nb::handle cols_h, nb::handle rows_t_h,
                            nb::handle cols_t_h, nb::handle perm_t_h, nb::handle perm_t_inv_h) {
  std::vector<nb::object> keep;
  const auto rows = host_array<int32_t, 1>(rows_h, "rows", keep);
  const auto cols = host_array<int32_t, 1>(cols_h, "cols", keep);
  const auto rows_t = host_array<int32_t, 1>(rows_t_h, "rows_t", keep);
  const auto cols_t = host_array<int32_t, 1>(cols_t_h, "cols_t", keep);
  const auto perm_t = host_array<int32_t, 1>(perm_t_h, "perm_t", keep);
  const auto perm_t_inv = host_array<int32_t, 1>(perm_t_inv_h, "perm_t_inv", keep);
  nb::gil_scoped_release release;
  return jaxsparse_tc::check_transpose(
      rows.data(), int64_t(rows.shape(0)), cols.data(), int64_t(cols.shape(0)), rows_t.data(),
      int64_t(rows_t.shape(0)), cols_t.data(), int64_t(cols_t.shape(0)), perm_t.data(),
      int64_t(perm_t.shape(0)), perm_t_inv.data(), int64_t(perm_t_inv.shape(0)));
}

}  // namespace

NB_MODULE(_cpu, m) {
  jaxsparse_tc::register_reorder(m);  // reorder(), block_stats() (cpu/reorder.h)
  // The schedule functions and the format's constants (cpu/schedule.h, common/format.h).
  jaxsparse_tc::register_schedule(m);
  m.def("build_pattern", &build_pattern, nb::arg("rows"), nb::arg("cols"), nb::arg("m"),
        nb::arg("n"), nb::kw_only(), nb::arg("grouped") = nb::none(),
        nb::arg("split_blocks") = nb::none(), nb::arg("row_order") = nb::none(),
        "One orientation of the format from validated int64 COO indices (docs/FORMAT.md): a "
        "dict of Pattern's ten arrays, input_to_format and grouped (whether the schedule is). "
        "grouped, split_blocks, row_order: FormatOptions' (None: the builder's rule).");
  m.def("sample_neighbors", &sample_neighbors, nb::arg("indptr"), nb::arg("indices"),
        nb::arg("targets"), nb::arg("fanouts"), nb::kw_only(), nb::arg("seed"),
        nb::arg("replace") = false, nb::arg("weights") = nb::none(),
        nb::arg("edge_order") = nb::none(), nb::arg("threads") = 0,
        "Samples len(fanouts) layers of in-neighbours from the CSR graph (indptr int64 [n + 1], "
        "indices int32 [nnz]; rows = targets) outwards from the distinct targets (int64). Per "
        "layer a dict: sources (int64, distinct, the layer's targets first), rows and cols "
        "(int32 local indices of each sampled edge's target and source) and edge_ids (int64 "
        "CSR positions, or edge_order (int64 [nnz]) at them). fanout -1 takes every neighbour; "
        "weights (float64 [nnz], >= 0) draw "
        "proportionally. Deterministic for a seed whatever threads (0: all cores); releases "
        "the GIL. The caller validates indices and weights (cpu/sampler.h).");
  m.def("concat_bytes", &concat_bytes, nb::arg("arrays"),
        "The C-contiguous host arrays' bytes one after another in one new uint8 array, copied "
        "with the GIL released.");
  m.def("padded_block", &padded_block, nb::arg("rows"), nb::arg("cols"), nb::arg("num_real_nodes"),
        nb::kw_only(), nb::arg("num_slots"), nb::arg("nnz"), nb::arg("edges"),
        nb::arg("window_cols"), nb::arg("blocks"), nb::arg("schedule"), nb::arg("row_schedule"),
        nb::arg("grouped"), nb::arg("threads") = 1,
        "The padded SparseMatrix arrays of one sampled layer (int32 local rows = targets, cols "
        "= sources), as nn.batch.padded_matrix builds them for a Budget without self-loops "
        "(num_slots, nnz, edges; format_sizes' lengths): a dict with patterns a and t, values, "
        "perm_t, perm_t_inv and input_to_format. Releases the GIL (cpu/sampler.h).");
  m.def("kernel_choices", &kernel_choices, nb::arg("rows"), nb::arg("nnz"), nb::arg("windows"),
        nb::arg("blocks"), nb::arg("condensed_cols"), nb::arg("d"), nb::arg("esize"),
        nb::arg("exact"), nb::kw_only(), nb::arg("row_items") = 0, nb::arg("heads") = 1,
        nb::arg("spmm_kernel") = 0, nb::arg("sddmm_kernel") = 0, nb::arg("attention_backward") = 0,
        nb::arg("sm90") = true,
        "The kernel family each CUDA launch plan picks (dict: spmm and sddmm \"rows\" or "
        "\"windows\", attention_backward \"fused\" or \"composed\"), the kernel it launches "
        "(spmm_kernel \"rows\", \"windows_async\", \"windows_registers\" or \"exact_f32\"; "
        "sddmm_kernel \"rows\", \"windows\" or \"exact_f32\"; on an sm_90 or later device if sm90, "
        "with 16-byte aligned operands) and the derived "
        "features (nnz_per_block, cols_per_window, mean_row_length), from one orientation's "
        "pattern features (plan/select.h), the dense width d and element size, exact "
        "float32, and the KernelOptions codes (KERNEL_CODES, ATTENTION_BACKWARD_CODES; 0: "
        "auto). row_items (the row schedule's length) and heads size the SpMM row kernels' "
        "workspace, which must fit for them to run; the default (no row cut into several CTA "
        "items) assumes it does. The attention answer takes dv = d.");
  m.def("check_pattern", &check_pattern, nb::arg("window_col_ptr"), nb::arg("window_cols"),
        nb::arg("window_block_ptr"), nb::arg("block_bitmap"), nb::arg("block_value_ptr"),
        nb::arg("schedule"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_entries"),
        nb::arg("row_schedule"), nb::arg("m"), nb::arg("n"),
        "Checks one orientation of an m x n pattern (Pattern's arrays, in its order: int32, "
        "block_bitmap uint32 [B, 2], schedule [S, 8], row_entries [nnz, 2], row_schedule [R, 4]) "
        "against every invariant of docs/FORMAT.md that a kernel relies on. Returns \"\" when "
        "all hold, else one message naming the first broken one (array, index, value, what was "
        "expected). Raises TypeError for an argument of another dtype or rank. O(size of the "
        "arrays); releases the GIL.");
  m.def("check_transpose", &check_transpose, nb::arg("rows"), nb::arg("cols"), nb::arg("rows_t"),
        nb::arg("cols_t"), nb::arg("perm_t"), nb::arg("perm_t_inv"),
        "Checks that perm_t and perm_t_inv (int32 [nnz]) are inverse permutations and that A^T's "
        "value j (rows_t, cols_t) is A's value perm_t[j] (rows, cols) transposed. Returns \"\" or "
        "one message, as check_pattern.");
  // The contract (common/ops.h): the op table, this extension's handlers, the codes of the
  // attributes Python passes as integers, and the attention tensor-core kernels' head dims.
  jaxsparse_tc::export_op_table(m);
  jaxsparse_tc::def_registrations(m, jaxsparse_tc::kCpuHandlers);
  m.attr("KERNEL_CODES") = jaxsparse_tc::code_dict(jaxsparse_tc::kKernelChoiceCodes);
  m.attr("PRECISION_CODES") = jaxsparse_tc::code_dict(jaxsparse_tc::kPrecisionCodes);
  m.attr("ATTENTION_BACKWARD_CODES") =
      jaxsparse_tc::code_dict(jaxsparse_tc::kAttentionBackwardCodes);
  {
    nb::list dims;
    for (int d : jaxsparse_tc::kAttentionTcD) dims.append(d);
    m.attr("ATTENTION_TC_D") = nb::tuple(dims);
  }
  m.def("attention_tc_shape", &jaxsparse_tc::attention_tc_shape, nb::arg("esize"), nb::arg("d"),
        nb::arg("dv"),
        "Whether the attention tensor-core kernels (forward and fused backward) take operands of "
        "esize bytes with head dims d and dv: 16-bit, d = dv in ATTENTION_TC_D.");
  m.def("attention_backward_plan", &attention_backward_plan, nb::arg("rows"), nb::arg("nnz"),
        nb::arg("windows"), nb::arg("blocks"), nb::arg("condensed_cols"), nb::arg("esize"),
        nb::arg("d"), nb::arg("dv"), nb::kw_only(), nb::arg("attention_backward") = 0,
        "Which attention backward runs (plan_attention_backward, plan/attention.h), from A's "
        "pattern features (as kernel_choices), the operands' element size, the head dims d and "
        "dv, and the KernelOptions code (ATTENTION_BACKWARD_CODES; 0: auto). A dict: backward "
        "\"fused\" or \"composed\", and edge_kernel: whether the composed backward's per-edge "
        "pass is the attention_bwd kernel (else two SDDMMs). Whether the platform has these "
        "kernels is not part of the answer.");
}
