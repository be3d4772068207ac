// The reordering's Python binding: reorder() and block_stats() of the CPU extension (argument
// checks, arrays in and out) over the orderings and statistics of reorder.cc.
#include "cpu/reorder.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <stdexcept>

namespace jaxsparse_tc {
namespace {

namespace nb = nanobind;
using IndexArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T>
nb::ndarray<nb::numpy, T> owned_array(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), {owned->size()}, del);
}

void check_coo(const IndexArray& rows, const IndexArray& cols, int64_t m, int64_t n) {
  if (rows.shape(0) != cols.shape(0)) throw std::invalid_argument("rows and cols differ in length");
  if (m < 0 || n < 0 || m >= (int64_t(1) << 31) || n >= (int64_t(1) << 31))
    throw std::invalid_argument("dimensions must be in [0, 2^31)");
  const int64_t* r = rows.data();
  const int64_t* c = cols.data();
  for (size_t k = 0; k < rows.shape(0); ++k)
    if (r[k] < 0 || r[k] >= m || c[k] < 0 || c[k] >= n)
      throw std::invalid_argument("an index is out of range");
}

void check_perm(const std::optional<IndexArray>& p, int64_t size, const char* what) {
  if (!p) return;
  if (int64_t(p->shape(0)) != size)
    throw std::invalid_argument(std::string(what) + " has the wrong length");
  const int64_t* d = p->data();
  for (int64_t i = 0; i < size; ++i)
    if (d[i] < 0 || d[i] >= size) throw std::invalid_argument(std::string(what) + " out of range");
}

nb::dict py_reorder(IndexArray rows, IndexArray cols, int64_t n, const std::string& method,
                    uint64_t seed, int threads, int lookahead) {
  check_coo(rows, cols, n, n);
  const ReorderMethod how = parse_reorder_method(method);
  ReorderResult r;
  {
    nb::gil_scoped_release release;
    r = reorder_graph(rows.data(), cols.data(), int64_t(rows.shape(0)), n, how, seed, threads,
                      lookahead);
  }
  nb::dict out;
  out["perm"] = owned_array(std::move(r.perm));
  out["groups"] = r.groups;
  out["graph_s"] = r.graph_s;
  out["order_s"] = r.order_s;
  out["pack_s"] = r.pack_s;
  return out;
}

nb::dict py_block_stats(IndexArray rows, IndexArray cols, int64_t m, int64_t n,
                        std::optional<IndexArray> row_new, std::optional<IndexArray> col_new,
                        int threads) {
  check_coo(rows, cols, m, n);
  check_perm(row_new, m, "row_new");
  check_perm(col_new, n, "col_new");
  BlockStats s;
  {
    nb::gil_scoped_release release;
    s = block_stats(rows.data(), cols.data(), int64_t(rows.shape(0)), m, n,
                    row_new ? row_new->data() : nullptr, col_new ? col_new->data() : nullptr,
                    threads);
  }
  nb::dict out;
  out["windows"] = s.windows;
  out["nonempty_windows"] = s.nonempty_windows;
  out["condensed_cols"] = s.condensed_cols;
  out["blocks"] = s.blocks;
  out["nnz"] = s.nnz;
  out["block_nnz_hist"] = owned_array(std::move(s.block_nnz_hist));
  return out;
}

}  // namespace

void register_reorder(nb::module_& m) {
  m.def("reorder", &py_reorder, nb::arg("rows"), nb::arg("cols"), nb::arg("n"), nb::arg("method"),
        nb::arg("seed") = 0, nb::arg("threads") = 2, nb::arg("lookahead") = 0,
        "A node permutation perm[new] = old of the graph of int64 COO entries (reorder.h).");
  m.def("block_stats", &py_block_stats, nb::arg("rows"), nb::arg("cols"), nb::arg("m"),
        nb::arg("n"), nb::arg("row_new") = nb::none(), nb::arg("col_new") = nb::none(),
        nb::arg("threads") = 2,
        "Window/block statistics of a COO pattern after row_new/col_new (old -> new).");
}

}  // namespace jaxsparse_tc
