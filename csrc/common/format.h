// The sparse format as kernels see it (docs/FORMAT.md): 8-row windows, condensed columns,
// 8x8 blocks with a column-major 64-bit bitmap (bit c*8+r), compact values in block order.
#pragma once
#include <cstdint>

namespace jaxsparse_tc {

// The constants named after a pattern.py name below are defined here only: the CPU extension
// exports them under that name (cpu/schedule.cc) and jaxsparse_tc/_src/pattern.py re-exports them.
constexpr int kWindowRows = 8;  // rows per window (FlashSparse 8x1 vectors); WINDOW_ROWS
constexpr int kBlockCols = 8;   // condensed columns per block; BLOCK_COLS
// Most blocks per piece of a split window (pattern.py SPLIT_BLOCKS). A split item's fourth field is
// its window's piece size (SPLIT_BLOCKS, or less on small graphs); piece p starts at the window's
// block p * size and is schedule item s + p, s the window's first piece; split items form the
// schedule's prefix (docs/FORMAT.md).
constexpr int kSplitBlocks = 32;
// Items per group of a grouped schedule (pattern.py GROUP_ITEMS): a split window's pieces lie in
// one group, items g * kGroupItems .. + kGroupItems - 1.
constexpr int kGroupItems = 4;
// Byte alignment the CUDA kernels need of a pattern's arrays and values (pattern.py
// OPERAND_ALIGN): schedules are read as 16-byte vectors, bitmaps and row entries as 8-byte ones,
// values copied 16 bytes at a time. XLA allocates buffers at least this aligned, but passes a
// slice of one to a custom call in place, so arrays packed into one buffer start at multiples
// of it (the sampler's batches) and the handlers refuse a pattern that is not.
constexpr int kOperandAlign = 16;
// Fields per schedule item (pattern.py SCHEDULE_FIELDS): window, block_begin, block_end, split,
// then col_begin (the item's first condensed column), col_end (its window's), first (the item of
// the window's first piece) and pieces (1 for a whole window).
constexpr int kScheduleFields = 8;
// Graphs under kSmallGraphNnz nonzeros (pattern.py SMALL_GRAPH_NNZ) are small: their time is
// their longest chain of dependent round trips rather than their bytes, and the builder (short
// pieces), several plans (plan/attention.h, plan/sddmm.h) and the selector
// (plan/select.h) treat them apart.
constexpr int64_t kSmallGraphNnz = int64_t(1) << 16;
// A small graph's split windows are cut into pieces of kSmallGraphSplit blocks (pattern.py
// SMALL_GRAPH_SPLIT), its rows into row pieces of kSmallGraphRowPiece entries (SMALL_GRAPH_PIECE;
// the row kernels' shares too, plan/row_layout.h).
constexpr int kSmallGraphSplit = 4;
constexpr int kSmallGraphRowPiece = 8;
// Most blocks of a window of a grouped schedule (pattern.py GROUPED_MAX_BLOCKS).
constexpr int kGroupedMaxBlocks = 32;
// Most row pieces' worth of entries of one CTA item of the row view (pattern.py ROW_CTA_PIECES).
constexpr int kRowCtaPieces = 16;
// row_schedule slots (pattern.py WHOLE_ROW, CTA_ROW; the row kernels read them,
// cuda/common/row_view.cuh): one lane group walks the row; one CTA walks it.
// Slots >= 0 number the rows cut into several CTA items.
constexpr int kWholeRowSlot = -1;
constexpr int kCtaRowSlot = -2;

// Most rows, columns and input entries of one format (integrity.py MAX_DIM, MAX_ENTRIES; the
// extension exports them under those names): its indices and positions are int32 and the kernels
// step past a row's or a window's end, so 2^16 of headroom stays below 2^31.
constexpr int64_t kMaxDim = (int64_t(1) << 31) - (int64_t(1) << 16);
constexpr int64_t kMaxEntries = (int64_t(1) << 31) - (int64_t(1) << 16);

struct PatternView {
  const int32_t* window_col_ptr;    // [W+1]
  const int32_t* window_cols;       // [C]
  const int32_t* window_block_ptr;  // [W+1]
  const uint32_t* block_bitmap;     // [B, 2] (lo, hi)
  const int32_t* block_value_ptr;   // [B+1]
  const int32_t* schedule;          // [S, kScheduleFields]
  int64_t num_windows;
  int64_t num_blocks;
  int64_t num_items;
};

#if defined(__CUDACC__)
#define JAXSPARSE_TC_HD __host__ __device__ __forceinline__
#else
#define JAXSPARSE_TC_HD inline
#endif

JAXSPARSE_TC_HD uint64_t block_bits(const uint32_t* bitmap, int64_t b) {
  return uint64_t(bitmap[2 * b]) | (uint64_t(bitmap[2 * b + 1]) << 32);
}

}  // namespace jaxsparse_tc
