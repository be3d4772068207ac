#include "cpu/pattern_build.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/format.h"

namespace jaxsparse_tc {

BuiltPattern build_pattern(const int64_t* rows, const int64_t* cols, int64_t count, int64_t m,
                           int64_t n, const ScheduleOptions& options) {
  // The format's rows, columns and positions are int32: refuse what would wrap (the Python
  // builders check first, with the argument's name).
  if (count > kMaxEntries || m > kMaxDim || n > kMaxDim || count < 0 || m < 0 || n < 0)
    throw std::invalid_argument("build_pattern: at most " + std::to_string(kMaxEntries) +
                                " entries and " + std::to_string(kMaxDim) +
                                " rows and columns are supported (int32 indices); got " +
                                std::to_string(count) + " entries of a " + std::to_string(m) +
                                " x " + std::to_string(n) + " matrix");
  const int64_t W = (m + kWindowRows - 1) / kWindowRows;
  // Two stable counting sorts give entries ordered by (window, column, input order): the
  // format's order up to the row inside a column, which each column group settles below.
  std::vector<int64_t> by_col(count), order(count);
  {
    std::vector<int64_t> start(n + 1, 0);
    for (int64_t k = 0; k < count; ++k) ++start[cols[k] + 1];
    for (int64_t j = 0; j < n; ++j) start[j + 1] += start[j];
    for (int64_t k = 0; k < count; ++k) by_col[start[cols[k]]++] = k;
  }
  std::vector<int64_t> window_start(W + 1, 0);
  for (int64_t k = 0; k < count; ++k) ++window_start[rows[k] / kWindowRows + 1];
  for (int64_t w = 0; w < W; ++w) window_start[w + 1] += window_start[w];
  {
    std::vector<int64_t> next(window_start.begin(), window_start.end() - 1);
    for (int64_t i = 0; i < count; ++i) {
      int64_t k = by_col[i];
      order[next[rows[k] / kWindowRows]++] = k;
    }
  }
  by_col.clear();
  by_col.shrink_to_fit();

  BuiltPattern p;
  p.window_col_ptr.reserve(W + 1);
  p.window_block_ptr.reserve(W + 1);
  p.input_to_format.resize(count);
  p.rows.reserve(count);
  p.cols.reserve(count);
  p.window_col_ptr.push_back(0);
  p.window_block_ptr.push_back(0);
  int64_t pos = 0;
  for (int64_t w = 0; w < W; ++w) {
    int64_t i = window_start[w], end = window_start[w + 1];
    int64_t condensed = 0;
    while (i < end) {
      const int64_t col = cols[order[i]];
      int64_t j = i;
      unsigned present = 0;  // rows of this window in this column
      for (; j < end && cols[order[j]] == col; ++j) present |= 1u << (rows[order[j]] % kWindowRows);
      const int64_t c = condensed % kBlockCols;
      if (c == 0) {  // a new block starts
        p.block_value_ptr.push_back(int32_t(pos));
        p.block_bitmap.push_back(0);
        p.block_bitmap.push_back(0);
      }
      int32_t slot[kWindowRows];
      for (int r = 0; r < kWindowRows; ++r) {
        if (!(present >> r & 1u)) continue;
        slot[r] = int32_t(pos++);
        p.rows.push_back(int32_t(w * kWindowRows + r));
        p.cols.push_back(int32_t(col));
        const int bit = int(c) * kWindowRows + r;
        p.block_bitmap[p.block_bitmap.size() - 2 + bit / 32] |= 1u << (bit % 32);
      }
      for (int64_t t = i; t < j; ++t)
        p.input_to_format[order[t]] = slot[rows[order[t]] % kWindowRows];
      p.window_cols.push_back(int32_t(col));
      ++condensed;
      i = j;
    }
    p.window_col_ptr.push_back(int32_t(p.window_cols.size()));
    p.window_block_ptr.push_back(int32_t(p.block_bitmap.size() / 2));
  }
  p.block_value_ptr.push_back(int32_t(pos));
  p.nnz = pos;

  // The row view: a stable counting sort of format positions by row. Inside a window the format
  // is ordered by column, so each row's entries come out with ascending columns (CSR order).
  std::vector<int32_t> row_ptr(m + 1, 0);
  for (int64_t k = 0; k < pos; ++k) ++row_ptr[p.rows[k] + 1];
  for (int64_t r = 0; r < m; ++r) row_ptr[r + 1] += row_ptr[r];
  p.row_entries.resize(2 * pos);
  {
    std::vector<int32_t> next(row_ptr.begin(), row_ptr.end() - 1);
    for (int64_t k = 0; k < pos; ++k) {
      // 64-bit: the pair index 2 * at passes 2^31 beyond 2^30 nonzeros.
      const int64_t at = next[p.rows[k]]++;
      p.row_entries[2 * at] = p.cols[k];
      p.row_entries[2 * at + 1] = int32_t(k);
    }
  }

  // The schedules, from the window and row pointers.
  const bool fits = grouped_schedule_fits(p.window_block_ptr.data(), W, pos);
  if (options.grouped.value_or(false) && !fits) {
    int64_t most = 0;
    for (int64_t w = 0; w < W; ++w)
      most = std::max<int64_t>(most, p.window_block_ptr[w + 1] - p.window_block_ptr[w]);
    throw std::invalid_argument(
        "FormatOptions(grouped=True): a grouped schedule needs fewer than " +
        std::to_string(kSmallGraphNnz) + " nonzeros and at most " +
        std::to_string(kGroupedMaxBlocks) + " blocks per window in both orientations; the " +
        std::to_string(m) + " x " + std::to_string(n) + " orientation has " + std::to_string(pos) +
        " nonzeros and a window of " + std::to_string(most) + " blocks");
  }
  p.grouped = fits && options.grouped.value_or(true) && !options.split_blocks;
  const int64_t piece = options.split_blocks ? *options.split_blocks
                                             : split_blocks(p.window_block_ptr.data(), W, pos);
  p.schedule =
      window_schedule(p.window_block_ptr.data(), p.window_col_ptr.data(), W, piece, p.grouped);
  const RowOrder walk = options.row_order.value_or(row_order(pos, int64_t(p.window_cols.size())));
  p.row_schedule = row_schedule(row_ptr.data(), m, row_piece(pos), walk);
  return p;
}

}  // namespace jaxsparse_tc
