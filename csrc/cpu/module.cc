// The CPU extension: the format builder and the CPU FFI handlers, as capsules for jax.ffi.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
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

// A sampled batch's host buffers in one call (the GIL released throughout): per layer its padded
// block (padded_block), then the batch's arrays laid one after another per dtype, in the leaf
// order of sampling.py's batch tree (_batch_layout), each starting at a multiple of
// kOperandAlign bytes: float32 the layers' values; int32 per layer
// A's and A^T's Pattern arrays (window_col_ptr, window_cols, window_block_ptr, block_value_ptr,
// schedule, rows, cols, row_entries, row_schedule), perm_t, perm_t_inv, input_to_format, the
// edge ids padded to the edge slots and the counts (edges, sources, targets), then the input
// nodes and the seeds, each padded, and their counts; uint32 per layer A's and A^T's bitmaps.
// budgets: per layer (num_slots, nnz, edges, window_cols, blocks, schedule, row_schedule,
// grouped). Returns (float32, int32, uint32) numpy arrays.
nb::tuple pad_batch(std::vector<Int32Array> rows, std::vector<Int32Array> cols,
                    std::vector<IndexArray> edge_ids, std::vector<int64_t> num_sources,
                    std::vector<int64_t> num_targets, std::vector<std::vector<int64_t>> budgets,
                    IndexArray inputs, int64_t input_slots, IndexArray seeds, int64_t batch_size,
                    int threads) {
  const size_t L = rows.size();
  if (cols.size() != L || edge_ids.size() != L || num_sources.size() != L ||
      num_targets.size() != L || budgets.size() != L)
    throw nb::value_error("pad_batch: one entry per layer in every list");
  for (size_t l = 0; l < L; ++l) {
    if (rows[l].shape(0) != cols[l].shape(0) || rows[l].shape(0) != edge_ids[l].shape(0))
      throw nb::value_error("pad_batch: rows, cols and edge_ids must have one entry per edge");
    if (budgets[l].size() != 8) throw nb::value_error("pad_batch: a budget has 8 fields");
    if (int64_t(rows[l].shape(0)) > budgets[l][2])
      throw nb::value_error(
          ("pad_batch: layer " + std::to_string(l) + " has more edges than slots").c_str());
  }
  if (int64_t(inputs.shape(0)) > input_slots || int64_t(seeds.shape(0)) > batch_size)
    throw nb::value_error("pad_batch: more input nodes or seeds than slots");
  std::vector<float> f32;
  std::vector<int32_t> i32;
  std::vector<uint32_t> u32;
  {
    nb::gil_scoped_release release;
    std::vector<jaxsparse_tc::PaddedBlock> blocks(L);
    for (size_t l = 0; l < L; ++l) {
      const auto& b = budgets[l];
      const jaxsparse_tc::BlockBudget budget{b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7] != 0};
      try {
        blocks[l] =
            jaxsparse_tc::padded_block(rows[l].data(), cols[l].data(), int64_t(rows[l].shape(0)),
                                       num_sources[l], budget, threads);
      } catch (const std::invalid_argument& e) {  // the indices' check names the layer
        throw std::invalid_argument("NeighborSampler.pad: layers[" + std::to_string(l) + "]." +
                                    e.what());
      }
    }
    // The int64 pieces as int32, padded to their slots; then every piece of each dtype in
    // order, copied once into a buffer of its exact size.
    auto padded = [](const int64_t* v, int64_t count, int64_t slots) {
      std::vector<int32_t> out(size_t(slots), 0);
      for (int64_t k = 0; k < count; ++k) out[k] = int32_t(v[k]);
      return out;
    };
    std::vector<std::vector<int32_t>> extra;  // edge ids and counts per layer, then the tail's
    extra.reserve(2 * L + 3);
    std::vector<const std::vector<float>*> f32_parts;
    std::vector<const std::vector<int32_t>*> i32_parts;
    std::vector<const std::vector<uint32_t>*> u32_parts;
    for (size_t l = 0; l < L; ++l) {
      const jaxsparse_tc::PaddedBlock& b = blocks[l];
      f32_parts.push_back(&b.values);
      for (const jaxsparse_tc::BuiltPattern* p : {&b.a, &b.t}) {
        i32_parts.insert(i32_parts.end(), {&p->window_col_ptr, &p->window_cols,
                                           &p->window_block_ptr, &p->block_value_ptr, &p->schedule,
                                           &p->rows, &p->cols, &p->row_entries, &p->row_schedule});
        u32_parts.push_back(&p->block_bitmap);
      }
      const int64_t E = int64_t(edge_ids[l].shape(0));
      extra.push_back(padded(edge_ids[l].data(), E, budgets[l][2]));
      extra.push_back({int32_t(E), int32_t(num_sources[l]), int32_t(num_targets[l])});
      i32_parts.insert(i32_parts.end(), {&b.perm_t, &b.perm_t_inv, &b.input_to_format,
                                         &extra[extra.size() - 2], &extra.back()});
    }
    extra.push_back(padded(inputs.data(), int64_t(inputs.shape(0)), input_slots));
    extra.push_back(padded(seeds.data(), int64_t(seeds.shape(0)), batch_size));
    extra.push_back({int32_t(inputs.shape(0)), int32_t(seeds.shape(0))});
    for (size_t k = extra.size() - 3; k < extra.size(); ++k) i32_parts.push_back(&extra[k]);
    // Each piece starts at a multiple of kOperandAlign bytes (zeros between): the jitted step
    // cuts the pieces out as slices, which XLA hands to the kernels in place.
    auto join = [](const auto& parts, auto& out) {
      constexpr size_t kAlign = size_t(jaxsparse_tc::kOperandAlign) / 4;  // 4-byte elements
      auto padded_size = [&](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
      size_t total = 0;
      for (const auto* v : parts) total += padded_size(v->size());
      out.reserve(total);
      for (const auto* v : parts) {
        out.insert(out.end(), v->begin(), v->end());
        out.resize(out.size() + padded_size(v->size()) - v->size());
      }
    };
    join(f32_parts, f32);
    join(i32_parts, i32);
    join(u32_parts, u32);
  }
  const size_t nf = f32.size(), ni = i32.size(), nu = u32.size();
  return nb::make_tuple(to_numpy(std::move(f32), {nf}), to_numpy(std::move(i32), {ni}),
                        to_numpy(std::move(u32), {nu}));
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
  m.def("pad_batch", &pad_batch, nb::arg("rows"), nb::arg("cols"), nb::arg("edge_ids"),
        nb::arg("num_sources"), nb::arg("num_targets"), nb::arg("budgets"), nb::arg("inputs"),
        nb::arg("input_slots"), nb::arg("seeds"), nb::arg("batch_size"), nb::kw_only(),
        nb::arg("threads") = 1,
        "A sampled batch's padded layers as its float32, int32 and uint32 host buffers, in the "
        "leaf order of jaxsparse_tc._src.sampling's batch tree; releases the GIL.");
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
