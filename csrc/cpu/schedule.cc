#include "cpu/schedule.h"

#include <numeric>
#include <stdexcept>
#include <string>

namespace jaxsparse_tc {

namespace {

// Rows (or windows) by decreasing count, ascending index among equal counts.
template <class Count>
void sort_heaviest_first(std::vector<int64_t>& ids, Count count) {
  std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
    const int64_t ca = count(a), cb = count(b);
    return ca != cb ? ca > cb : a < b;
  });
}

// Appends `ids` to `out` by decreasing length class, in their order within a class: `cls` holds
// length_class() + 1 (0: empty) of each.
void append_by_class(const std::vector<int64_t>& ids, const std::vector<int8_t>& cls,
                     std::vector<int64_t>& out) {
  constexpr int kClasses = 65;  // -1 .. 63
  int64_t start[kClasses + 1] = {};
  for (int8_t c : cls) ++start[kClasses - c];  // heaviest class first
  for (int c = 0; c < kClasses; ++c) start[c + 1] += start[c];
  const size_t base = out.size();
  out.resize(base + ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[base + start[kClasses - 1 - cls[i]]++] = ids[i];
}

}  // namespace

// Schedule fields are int32 (the kernels read them so): pointers past that are refused, not
// wrapped (int64 pointer arrays reach here from Python).
static int32_t schedule_field(int64_t value, const char* what) {
  if (value < INT32_MIN || value > INT32_MAX)
    throw std::invalid_argument(std::string(what) + ": a schedule field of " +
                                std::to_string(value) + " does not fit int32 (at most " +
                                std::to_string(INT32_MAX) + ")");
  return int32_t(value);
}

template <class T>
int64_t split_blocks(const T* window_block_ptr, int64_t windows, int64_t nnz) {
  if (nnz < kSmallGraphNnz) return kSmallGraphSplit;
  int64_t heavy = 0;
  for (int64_t w = 0; w < windows && heavy <= kFewHeavyWindows; ++w)
    heavy += int64_t(window_block_ptr[w + 1]) - int64_t(window_block_ptr[w]) > kSplitBlocks;
  if (heavy == 0 || heavy > kFewHeavyWindows) return kSplitBlocks;
  const int64_t blocks = windows > 0 ? int64_t(window_block_ptr[windows]) - window_block_ptr[0] : 0;
  const int64_t share = blocks / kBlocksPerPiece;
  return std::clamp<int64_t>(share > 0 ? int64_t(1) << length_class(share) : 1, kFineSplitMin,
                             kSplitBlocks);
}

int64_t window_items_bound(int64_t windows, int64_t blocks, int64_t nnz) {
  // Pieces past each window's first: fewer than blocks / piece. Finer pieces than kSplitBlocks
  // (small graphs aside) come only from patterns of B < kSplitBlocks * kBlocksPerPiece blocks,
  // as pieces of 8 under 16 * kBlocksPerPiece blocks and of 16 above: fewer than
  // min(B / 8, 2 * kBlocksPerPiece) pieces, which grows with B.
  if (nnz < kSmallGraphNnz) return windows + blocks / kSmallGraphSplit;
  return windows +
         std::max(blocks / kSplitBlocks, std::min(blocks / kFineSplitMin, 2 * kBlocksPerPiece));
}

template <class T>
std::vector<int32_t> window_schedule(const T* window_block_ptr, const T* window_col_ptr,
                                     int64_t windows, int64_t size, bool grouped) {
  if (!grouped && size < 1)
    throw std::invalid_argument("window_schedule: size must be >= 1; got " + std::to_string(size));
  const T* ptr = window_block_ptr;
  auto count = [&](int64_t w) { return int64_t(ptr[w + 1]) - int64_t(ptr[w]); };
  auto pieces_of = [&](int64_t c) {
    return grouped ? grouped_pieces(c) : std::max<int64_t>(1, ceil_div(c, size));
  };
  std::vector<int64_t> walk;  // the windows in schedule order
  walk.reserve(windows);
  int64_t items = 0;
  if (grouped) {  // by decreasing block count, window order among equals (a stable sort)
    int64_t most = 0, least = 0;
    for (int64_t w = 0; w < windows; ++w) {
      most = std::max(most, count(w)), least = std::min(least, count(w));
      items += pieces_of(count(w));
    }
    if (least >= 0 && most <= 4 * kGroupedMaxBlocks) {  // the grouped patterns: counting sort
      std::vector<int64_t> start(most + 2, 0);
      for (int64_t w = 0; w < windows; ++w) ++start[most - count(w) + 1];
      for (int64_t c = 0; c <= most; ++c) start[c + 1] += start[c];
      walk.resize(windows);
      for (int64_t w = 0; w < windows; ++w) walk[start[most - count(w)]++] = w;
    } else {
      walk.resize(windows);
      std::iota(walk.begin(), walk.end(), int64_t(0));
      std::stable_sort(walk.begin(), walk.end(),
                       [&](int64_t a, int64_t b) { return count(a) > count(b); });
    }
  } else {  // split windows heaviest first, then whole windows by decreasing length class
    std::vector<int64_t> whole;
    std::vector<int8_t> cls;
    whole.reserve(windows), cls.reserve(windows);
    for (int64_t w = 0; w < windows; ++w) {
      const int64_t c = count(w), pieces = pieces_of(c);
      items += pieces;
      if (pieces > 1) {
        walk.push_back(w);
      } else {
        whole.push_back(w);
        cls.push_back(int8_t(length_class(c) + 1));
      }
    }
    sort_heaviest_first(walk, count);
    append_by_class(whole, cls, walk);
  }

  std::vector<int32_t> out(size_t(items) * kScheduleFields);
  int32_t* it = out.data();
  int64_t item = 0;
  for (const int64_t w : walk) {
    const int64_t c = count(w), pieces = pieces_of(c);
    const int64_t piece = grouped ? std::max<int64_t>(1, ceil_div(c, pieces)) : size;
    const int64_t b0 = ptr[w], b1 = ptr[w + 1];
    const int64_t c0 = window_col_ptr ? int64_t(window_col_ptr[w]) : kBlockCols * b0;
    const int64_t c1 = window_col_ptr ? int64_t(window_col_ptr[w + 1]) : kBlockCols * b1;
    const int64_t first = item;
    for (int64_t p = 0; p < pieces; ++p, ++item, it += kScheduleFields) {
      const int64_t begin = b0 + p * piece;
      constexpr const char* what = "window_schedule";
      it[0] = schedule_field(w, what);
      it[1] = schedule_field(begin, what);
      it[2] = schedule_field(std::min(begin + piece, b1), what);
      it[3] = schedule_field(pieces > 1 ? piece : 0, what);
      it[4] = schedule_field(c0 + kBlockCols * (begin - b0), what);
      it[5] = schedule_field(c1, what);
      it[6] = schedule_field(first, what);
      it[7] = schedule_field(pieces, what);
    }
  }
  return out;
}

template <class T>
std::vector<int32_t> row_schedule(const T* row_ptr, int64_t rows, int64_t piece, RowOrder order) {
  const T* ptr = row_ptr;
  auto count = [&](int64_t r) { return int64_t(ptr[r + 1]) - int64_t(ptr[r]); };
  const int64_t cap = row_cta_entries(piece);
  const double long_from =
      kLongRowFactor * std::max(double(ptr[rows]) / double(std::max<int64_t>(rows, 1)), 1.0);
  // Rows by kind: CTA rows (count > piece), whole rows, empty rows; in row order.
  std::vector<int64_t> walk, whole, empty, long_rows;
  std::vector<int8_t> cls;
  int64_t items = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = count(r);
    items += std::max<int64_t>(1, ceil_div(c, cap));
    if (c > piece) {
      walk.push_back(r);
    } else if (c <= 0) {
      empty.push_back(r);
    } else if (order == RowOrder::kLength) {
      whole.push_back(r);
      cls.push_back(int8_t(length_class(c) + 1));
    } else if (double(c) > long_from) {
      long_rows.push_back(r);
    } else {
      whole.push_back(r);
    }
  }
  sort_heaviest_first(walk, count);
  if (order == RowOrder::kLength) {
    append_by_class(whole, cls, walk);
  } else {
    sort_heaviest_first(long_rows, count);
    walk.insert(walk.end(), long_rows.begin(), long_rows.end());
    walk.insert(walk.end(), whole.begin(), whole.end());
  }
  walk.insert(walk.end(), empty.begin(), empty.end());

  std::vector<int32_t> out(size_t(items) * 4);
  int32_t* it = out.data();
  int32_t next_slot = 0;
  for (const int64_t r : walk) {
    const int64_t c = count(r), pieces = std::max<int64_t>(1, ceil_div(c, cap));
    const int32_t slot = pieces > 1 ? next_slot++ : c > piece ? kCtaRowSlot : kWholeRowSlot;
    for (int64_t p = 0; p < pieces; ++p, it += 4) {
      const int64_t begin = int64_t(ptr[r]) + p * cap;
      it[0] = schedule_field(r, "row_schedule");
      it[1] = schedule_field(begin, "row_schedule");
      it[2] = schedule_field(std::min(begin + cap, int64_t(ptr[r + 1])), "row_schedule");
      it[3] = slot;
    }
  }
  return out;
}

template std::vector<int32_t> window_schedule(const int32_t*, const int32_t*, int64_t, int64_t,
                                              bool);
template std::vector<int32_t> window_schedule(const int64_t*, const int64_t*, int64_t, int64_t,
                                              bool);
template int64_t split_blocks(const int32_t*, int64_t, int64_t);
template int64_t split_blocks(const int64_t*, int64_t, int64_t);
template std::vector<int32_t> row_schedule(const int32_t*, int64_t, int64_t, RowOrder);
template std::vector<int32_t> row_schedule(const int64_t*, int64_t, int64_t, RowOrder);

}  // namespace jaxsparse_tc

// The Python bindings (register_schedule).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>

namespace jaxsparse_tc {
namespace {

namespace nb = nanobind;
template <class T>
using Pointers = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::numpy, int32_t> items_array(std::vector<int32_t>&& v, size_t fields) {
  auto* owned = new std::vector<int32_t>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return nb::ndarray<nb::numpy, int32_t>(owned->data(), {owned->size() / fields, fields}, del);
}

// Windows of a pointer array: an empty one has none (as an array of one pointer).
template <class T>
int64_t window_count(const Pointers<T>& block_ptr) {
  return std::max<int64_t>(int64_t(block_ptr.shape(0)) - 1, 0);
}

template <class T>
nb::ndarray<nb::numpy, int32_t> py_window_schedule(Pointers<T> block_ptr, int64_t size,
                                                   bool grouped,
                                                   std::optional<Pointers<T>> col_ptr) {
  const int64_t windows = window_count(block_ptr);
  if (col_ptr && col_ptr->shape(0) != block_ptr.shape(0))
    throw std::invalid_argument("window_col_ptr must have as many entries as window_block_ptr (" +
                                std::to_string(block_ptr.shape(0)) + "); got " +
                                std::to_string(col_ptr->shape(0)));
  std::vector<int32_t> items;
  {
    nb::gil_scoped_release release;
    items = window_schedule(block_ptr.data(), col_ptr ? col_ptr->data() : nullptr, windows, size,
                            grouped);
  }
  return items_array(std::move(items), kScheduleFields);
}

template <class T>
nb::ndarray<nb::numpy, int32_t> py_row_schedule(Pointers<T> row_ptr, int64_t piece,
                                                const std::string& order) {
  if (row_ptr.shape(0) == 0) throw std::invalid_argument("row_ptr must have rows + 1 entries");
  const int64_t rows = int64_t(row_ptr.shape(0)) - 1;
  const RowOrder how = parse_row_order(order);
  std::vector<int32_t> items;
  {
    nb::gil_scoped_release release;
    items = row_schedule(row_ptr.data(), rows, piece, how);
  }
  return items_array(std::move(items), 4);
}

template <class T>
bool py_grouped_schedule_fits(Pointers<T> block_ptr, int64_t nnz) {
  return grouped_schedule_fits(block_ptr.data(), window_count(block_ptr), nnz);
}

template <class T>
int64_t py_split_blocks(Pointers<T> block_ptr, int64_t nnz) {
  return split_blocks(block_ptr.data(), window_count(block_ptr), nnz);
}

template <class T>
void def_pointer_functions(nb::module_& m) {
  m.def("split_blocks", &py_split_blocks<T>, nb::arg("window_block_ptr"), nb::arg("nnz"),
        "Blocks per piece of a split window of a pattern (cpu/schedule.h).");
  m.def("window_schedule", &py_window_schedule<T>, nb::arg("window_block_ptr"),
        nb::arg("size") = kSplitBlocks, nb::arg("grouped") = false,
        nb::arg("window_col_ptr") = nb::none(),
        "The window schedule (int32 [S, SCHEDULE_FIELDS]) of window pointers (cpu/schedule.h).");
  m.def("row_schedule", &py_row_schedule<T>, nb::arg("row_ptr"), nb::arg("piece"),
        nb::arg("order") = "length",
        "The row schedule (int32 [R, 4]) of CSR row offsets (cpu/schedule.h).");
  m.def("grouped_schedule_fits", &py_grouped_schedule_fits<T>, nb::arg("window_block_ptr"),
        nb::arg("nnz"), "Whether a pattern can take a grouped schedule (cpu/schedule.h).");
}

}  // namespace

RowOrder parse_row_order(const std::string& name) {
  if (name == "length") return RowOrder::kLength;
  if (name == "locality") return RowOrder::kLocality;
  throw std::invalid_argument("row order must be one of ('length', 'locality'); got '" + name +
                              "'");
}

const char* row_order_name(RowOrder order) {
  return order == RowOrder::kLocality ? "locality" : "length";
}

void register_schedule(nb::module_& m) {
  m.attr("WINDOW_ROWS") = kWindowRows;
  m.attr("BLOCK_COLS") = kBlockCols;
  m.attr("SCHEDULE_FIELDS") = kScheduleFields;
  m.attr("OPERAND_ALIGN") = kOperandAlign;
  m.attr("SPLIT_BLOCKS") = kSplitBlocks;
  m.attr("GROUP_ITEMS") = kGroupItems;
  m.attr("GROUPED_MAX_BLOCKS") = kGroupedMaxBlocks;
  m.attr("SMALL_GRAPH_NNZ") = kSmallGraphNnz;
  m.attr("SMALL_GRAPH_SPLIT") = kSmallGraphSplit;
  m.attr("FEW_HEAVY_WINDOWS") = kFewHeavyWindows;
  m.attr("BLOCKS_PER_PIECE") = kBlocksPerPiece;
  m.attr("FINE_SPLIT_MIN") = kFineSplitMin;
  m.attr("SMALL_GRAPH_PIECE") = kSmallGraphRowPiece;
  m.attr("ROW_CTA_PIECES") = kRowCtaPieces;
  m.attr("WHOLE_ROW") = kWholeRowSlot;
  m.attr("CTA_ROW") = kCtaRowSlot;
  m.attr("LOCALITY_REUSE") = kLocalityReuse;
  m.attr("LONG_ROW_FACTOR") = kLongRowFactor;
  m.attr("ROW_ORDERS") = nb::make_tuple("length", "locality");
  m.attr("MAX_DIM") = kMaxDim;
  m.attr("MAX_ENTRIES") = kMaxEntries;
  // int32 pointers (a pattern's own) without a copy, others converted to int64.
  def_pointer_functions<int32_t>(m);
  def_pointer_functions<int64_t>(m);
  m.def("window_items_bound", &window_items_bound, nb::arg("windows"), nb::arg("blocks"),
        nb::arg("nnz"), "The most items of a window schedule (cpu/schedule.h).");
  m.def("row_piece", &row_piece, nb::arg("nnz"), "Longest row one lane group walks alone.");
  m.def("row_cta_entries", &row_cta_entries, nb::arg("piece"), "Most entries of one CTA item.");
  m.def("grouped_pieces", &grouped_pieces, nb::arg("count"),
        "Pieces of a window of `count` blocks in a grouped schedule.");
  m.def(
      "row_order",
      [](int64_t nnz, int64_t condensed_cols) {
        return row_order_name(row_order(nnz, condensed_cols));
      },
      nb::arg("nnz"), nb::arg("condensed_cols"),
      "The row schedule's order by the rule: \"locality\" or \"length\".");
}

}  // namespace jaxsparse_tc
