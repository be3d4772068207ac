// Host construction of one orientation of the format from COO (docs/FORMAT.md), its two work
// schedules included (cpu/schedule.h).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "cpu/schedule.h"

namespace jaxsparse_tc {

// How the schedules are cut (FormatOptions; nullopt: the builder's rule).
struct ScheduleOptions {
  // Grouped window schedule: the rule is grouped where grouped_schedule_fits holds, unless
  // split_blocks is given; false never; true where it fits, else std::invalid_argument.
  std::optional<bool> grouped;
  std::optional<int64_t> split_blocks;  // piece size of split windows; rule: split_blocks
  std::optional<RowOrder> row_order;    // rule: row_order(nnz, condensed columns)
};

struct BuiltPattern {
  std::vector<int32_t> window_col_ptr, window_cols, window_block_ptr, block_value_ptr;
  std::vector<uint32_t> block_bitmap;    // [B, 2]
  std::vector<int32_t> schedule;         // [S, kScheduleFields]
  std::vector<int32_t> rows, cols;       // per value, format order
  std::vector<int32_t> row_entries;      // [nnz, 2] (column, format position), CSR order
  std::vector<int32_t> row_schedule;     // [R, 4]
  std::vector<int64_t> input_to_format;  // per input entry
  int64_t nnz = 0;
  bool grouped = false;  // whether `schedule` is grouped (window_schedule)
};

// rows/cols are validated by the caller (0 <= rows < m, 0 <= cols < n).
BuiltPattern build_pattern(const int64_t* rows, const int64_t* cols, int64_t count, int64_t m,
                           int64_t n, const ScheduleOptions& options = {});

}  // namespace jaxsparse_tc
