// The format's two work schedules (docs/FORMAT.md, "Schedule" and "Row view"), cut on the host
// from a pattern's window and row pointers: the window schedule read by the window kernels and
// the row schedule read by the CUDA-core row kernels. The rules' constants live in
// common/format.h (those the kernels rely on) and here (ordering choices only the builder makes).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/format.h"

namespace nanobind {
class module_;
}

namespace jaxsparse_tc {

// The row order rule (row_order): "locality" from this many nonzeros per condensed column (a
// window's 8 rows read each of their distinct columns this often), where neighbouring rows share
// X rows: DD in its own order (1.58) gains by it, pubmed in affinity order (1.50) loses
// (docs/DESIGN.md). pattern.py LOCALITY_REUSE.
constexpr double kLocalityReuse = 1.55;
// "locality": rows longer than this many times the mean row go first (they would hold the last
// CTAs of a row-ordered walk). pattern.py LONG_ROW_FACTOR.
constexpr int kLongRowFactor = 4;

// The split rule's finer pieces (split_blocks): at most this many windows longer than
// kSplitBlocks blocks count as "a few", and their pieces get about 1/kBlocksPerPiece of the
// pattern's blocks (about one resident warp's share: an H100/H200 runs ~4,000 warps of these
// kernels at once, 132 SMs of ~14-32), at least kFineSplitMin. Measured on one H200 (affinity
// order, forced window kernels, pieces of 8 against 32): imdb-binary (1 such window) SpMM
// 0.69-0.77x the time, the attention forward 0.72-0.77x; dense500k-imdb (4) SpMM 0.68-0.90x;
// pubmed (4) 0.74-0.81x; dense2M-imdb (22, pieces of 16) SpMM 0.88-1.01x, SDDMM 0.83-0.86x;
// facebook-page-page (87-133) and github-musae (182-273) lost 1.2-2.2x with pieces of 8.
constexpr int kFewHeavyWindows = 32;
constexpr int64_t kBlocksPerPiece = 4096;
constexpr int kFineSplitMin = 8;

inline int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0 && (a < 0) == (b < 0));
}

// floor(log2(count)) for count >= 1, -1 otherwise: lengths within 2x of each other share a class.
inline int length_class(int64_t count) {
  return count > 0 ? 63 - __builtin_clzll(uint64_t(count)) : -1;
}

// Blocks per piece of a split window (`window_block_ptr` has windows + 1 entries). On a graph too
// small to fill the GPU a kernel's time is its longest piece's chain of dependent block loads
// (the attention forward walks a piece two blocks per round trip), so small graphs get short
// pieces. Larger graphs get kSplitBlocks, but where only a few windows (1 to kFewHeavyWindows)
// are longer than that: their pieces, not the whole, then set the time, and pieces of about
// blocks / kBlocksPerPiece (at least kFineSplitMin, at most kSplitBlocks) shorten them. Where
// many windows are long, splitting finer only adds the pieces' atomics (docs/DESIGN.md,
// "Schedules").
template <class T>
int64_t split_blocks(const T* window_block_ptr, int64_t windows, int64_t nnz);

// The most items a window schedule of a pattern of `nnz` nonzeros, `windows` windows and at
// most `blocks` blocks can have, whatever its windows' lengths (split_blocks' smallest pieces).
int64_t window_items_bound(int64_t windows, int64_t blocks, int64_t nnz);

// Longest row one lane group walks alone: small graphs get short rows per group (a shorter
// longest chain of dependent loads; on Cora, from 32 to 16 to 8, fp16 SpMM device time went
// ~9-10 -> ~6 -> ~4-4.5 us, scripts/piece_probe.py), large ones longer (fewer rows need a whole
// CTA): the largest power of two <= nnz / 16384, within [32, 256].
inline int64_t row_piece(int64_t nnz) {
  if (nnz < kSmallGraphNnz) return kSmallGraphRowPiece;
  const int64_t q = nnz / 16384;  // >= 4
  return std::min<int64_t>(256, std::max<int64_t>(32, int64_t(1) << length_class(q)));
}

// Most entries of one CTA item: kRowCtaPieces pieces of at least 16 entries (a small graph's short
// pieces shorten each group's walk, not a CTA's share: Cora's longest row, 169 entries, stays one
// CTA item and needs no workspace).
inline int64_t row_cta_entries(int64_t piece) {
  return kRowCtaPieces * std::max<int64_t>(piece, 16);
}

// Pieces of a window of `count` blocks in a grouped schedule: up to kSmallGraphSplit blocks one
// item, up to 9 two pieces, more four (from 10 blocks on, four pieces of ceil(count / 4) blocks
// are exactly four). Sorted by block count, the four-piece windows come first, then the two-piece
// ones, so each lands in one aligned group of kGroupItems items.
inline int64_t grouped_pieces(int64_t count) {
  return count <= kSmallGraphSplit ? 1 : count <= 9 ? 2 : kGroupItems;
}

// Whether a pattern can take a grouped schedule: a small graph (kSmallGraphNnz) whose windows have
// at most kGroupedMaxBlocks blocks (larger ones keep pieces of kSmallGraphSplit blocks, merged
// across CTAs). `window_block_ptr` has windows + 1 entries.
template <class T>
bool grouped_schedule_fits(const T* window_block_ptr, int64_t windows, int64_t nnz) {
  if (nnz >= kSmallGraphNnz) return false;
  for (int64_t w = 0; w < windows; ++w)
    if (int64_t(window_block_ptr[w + 1]) - int64_t(window_block_ptr[w]) > kGroupedMaxBlocks)
      return false;
  return true;
}

// The window schedule, int32 [S, kScheduleFields]: items (window, block_begin, block_end, split,
// col_begin, col_end, first, pieces). Split windows first by decreasing block count, then the
// whole windows by length class (block counts within 2x, length_class), heaviest class first and
// in window order inside a class. A window of more than `size` blocks is cut into pieces of that
// many (split = the piece size; 0 for a whole window), a split window's pieces contiguous and in
// order (so split items are the schedule's prefix and piece p of a window whose first piece is
// item s is item s + p; kernels rely on both). The last four fields spare a kernel a round trip
// to the window pointers: the item's first condensed column, the window's end column, the item
// index of the window's first piece and the window's piece count (the item itself and 1 for a
// whole window). `window_col_ptr` may be null: 8 condensed columns per block.
//
// Why classes rather than strictly heaviest first: windows running at the same time on the GPU
// are then neighbours, which in a reordered graph read the same X rows (L2 hits; on H100 at d =
// 128 fp16, DD's tensor-core SpMM 92.7 us against 100.8, a dense-community graph's 159 against
// 175), while blocks within 2x keep the balance.
//
// `grouped` (grouped_schedule_fits must hold; `size` is then unused): each window is cut into
// grouped_pieces() pieces of equal size instead (1, 2 or 4), so that every split window's pieces
// lie in one aligned group of kGroupItems items, which the attention forward merges inside one
// CTA; such a schedule stays strictly by decreasing block count (window order among equals).
// Throws std::invalid_argument for size < 1 (not grouped).
template <class T>
std::vector<int32_t> window_schedule(const T* window_block_ptr, const T* window_col_ptr,
                                     int64_t windows, int64_t size, bool grouped);

enum class RowOrder { kLength, kLocality };

// "length" or "locality" (pattern.py ROW_ORDERS); throws std::invalid_argument for another name.
RowOrder parse_row_order(const std::string& name);
const char* row_order_name(RowOrder order);

// The row order for a pattern of nnz nonzeros and condensed_cols condensed columns: kLocality
// where its windows reuse their columns (nnz / condensed columns >= kLocalityReuse), else kLength.
inline RowOrder row_order(int64_t nnz, int64_t condensed_cols) {
  return double(nnz) >= kLocalityReuse * double(std::max<int64_t>(condensed_cols, 1))
             ? RowOrder::kLocality
             : RowOrder::kLength;
}

// The row schedule, int32 [R, 4]: items (row, begin, end, slot) of the row view. A row of at most
// `piece` entries is one item with slot kWholeRowSlot (empty rows included). A longer row is one
// item per row_cta_entries(piece) entries, each walked by a whole CTA: a single such item has
// slot kCtaRowSlot; the items of a row with several (slot >= 0, numbering those rows in order)
// add their CTAs' sums in a workspace slot. CTA items come first, longest rows first (so slotted
// items are the prefix of that) and a row's items are contiguous; empty rows come last (the SDDMM
// stream stops at its first empty item). The whole rows between, by `order`:
//
// - kLength: by length class (lengths within 2x, length_class), longest class first, in row
//   order inside a class: groups of a CTA get rows of like length, and rows running at once are
//   near each other (on H100, fp16 d = 128 SpMM, R-MAT 17/16 83.8 us against 87.1 strictly
//   longest first, R-MAT 20/8 455 against 468);
// - kLocality: rows longer than kLongRowFactor x the mean row first (longest first), then the
//   rest in row order: where neighbouring rows share columns (row_order's rule) a CTA's groups
//   then read the same X rows from L1 and the rows running at once fit the L2 (DD 83.6 us
//   against 100.3 by length class and 139.5 strictly longest first; R-MAT 17/16, whose
//   neighbours share little, 89.7).
//
// `row_ptr` has rows + 1 entries (CSR offsets); `piece` is row_piece(nnz) (>= 8) in the format.
template <class T>
std::vector<int32_t> row_schedule(const T* row_ptr, int64_t rows, int64_t piece, RowOrder order);

// Adds the schedule functions and the format's constants to the CPU extension (module.cc).
void register_schedule(nanobind::module_& m);

}  // namespace jaxsparse_tc
