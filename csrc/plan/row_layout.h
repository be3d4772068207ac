// Host-side facts of the row kernels' lane layout (cuda/common/row_view.cuh has the device side),
// read by the launch plans and the launches: a warp is cut into G = 32 / L groups of L lanes;
// each group owns one work item (a row, or a piece of a long row). Lane li of a group owns the
// kRowVec<T> consecutive features (16 bytes) starting at (slab * L + li) * kRowVec<T>, so one
// gathered dense row is one coalesced 16-byte load per lane. L is the smallest power of two in
// [2, 32] covering d.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/format.h"

namespace jaxsparse_tc {

constexpr int kRowThreads = 256;  // threads per CTA of the row kernels

template <class T>
constexpr int kRowVec = 16 / int(sizeof(T));  // features per lane

// Fewest entries of a CTA item one lane group takes, where entries need no combining (the
// SDDMM and attention-backward row kernels): 32, so that a group's fixed cost per share (its
// row operands, first entries) is paid on enough entries; on small graphs, whose time is their
// longest chain, a row piece (docs/DESIGN.md, SDDMM table: Cora).
inline int cta_min_share(int64_t nnz) {
  return nnz < kSmallGraphNnz ? kSmallGraphRowPiece : 32;
}

// Longest single CTA item (a row cut into one CTA item, a little past the row piece) that the
// row kernels' whole-row streams walk like a whole row: none below 2^18 nonzeros, 64 entries
// below `long_from` nonzeros (each op's plan gives it), 128 past it. A CTA item of a few dozen
// entries keeps a whole CTA on it with each of its groups taking a few entries (the SpMM) or
// most groups idle (the SDDMM's groups take >= cta_min_share entries); a group's stream walks it
// at four gathers per round trip, a chain that stays short against the launch on such graphs. On
// smaller graphs that chain is the launch's time; past 2^21 nonzeros the row piece is >= 128
// entries, so no single CTA item is short enough. Figures: docs/PERFORMANCE.md, "Row kernels:
// schedules and CTA items".
constexpr int64_t kStreamCtaItemsNnz = int64_t(1) << 18;
inline int row_stream_max(int64_t nnz, int64_t long_from) {
  return nnz < kStreamCtaItemsNnz ? 0 : nnz < long_from ? 64 : 128;
}

// CTAs of a row kernel per slab and head (`copies` = slabs x heads of them): enough for its
// whole-row items, `per_cta` per CTA, and one per item up to the CTAs the GPU holds at once
// (`resident`, 0 where unknown) shared by the copies. CTAs take the CTA items (the schedule's
// prefix) strided, so a grid sized for the whole rows alone would leave narrow groups (small d:
// 128 groups of 2 lanes per CTA) few CTAs, each walking many CTA items one after another
// (docs/DESIGN.md, SpMM: Cora float32 at d = 7).
inline int64_t row_ctas(int64_t items, int64_t per_cta, int resident, int64_t copies) {
  const int64_t whole = (items + per_cta - 1) / per_cta;
  return std::max(whole, std::min<int64_t>(items, resident / std::max<int64_t>(copies, 1)));
}

// Lanes per group for d features of `esize` bytes (16 bytes per lane).
inline int row_lanes(int esize, int64_t d) {
  int lanes = 2;
  while (lanes < 32 && int64_t(lanes) * (16 / esize) < d) lanes *= 2;
  return lanes;
}
template <class T>
int row_lanes(int64_t d) {
  return row_lanes(int(sizeof(T)), d);
}

// Calls f(std::integral_constant<int, L>{}) with L = lanes (a power of two in [2, 32]): the
// launch of a row kernel instantiated per group width.
template <class F>
void with_lanes(int lanes, F&& f) {
  switch (lanes) {
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;
  }
}

}  // namespace jaxsparse_tc
