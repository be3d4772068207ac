// Host construction of one orientation of the format from COO (docs/FORMAT.md).
#pragma once
#include <cstdint>
#include <vector>

namespace jaxsparse_tc {

struct BuiltPattern {
  std::vector<int32_t> window_col_ptr, window_cols, window_block_ptr, block_value_ptr;
  std::vector<uint32_t> block_bitmap;    // [B, 2]
  std::vector<int32_t> rows, cols;       // per value, format order
  std::vector<int32_t> row_ptr;          // [m+1] the row view: CSR offsets
  std::vector<int32_t> row_entries;      // [nnz, 2] (column, format position), CSR order
  std::vector<int64_t> input_to_format;  // per input entry
  int64_t nnz = 0;
};

// rows/cols are validated by the caller (0 <= rows < m, 0 <= cols < n).
BuiltPattern build_pattern(const int64_t* rows, const int64_t* cols, int64_t count, int64_t m,
                           int64_t n);

}  // namespace jaxsparse_tc
