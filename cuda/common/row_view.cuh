// The row view of a pattern (docs/FORMAT.md) as the CUDA-core kernels read it. Where blocks are
// sparse (R-MAT-like graphs put ~1 nonzero in each condensed column, so an 8x8 block holds ~8 of
// 64 entries) tensor cores do little useful work and the kernels are bound by gathering dense
// rows. The CUDA-core kernels walk rows in CSR order instead: few registers, so many warps per SM
// keep many gathers in flight (DA-SpMM's row-balanced, row-major access with parallel
// reduction). Their lane layout: plan/row_layout.h.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/ffi_pattern.h"
#include "cuda/common/bounds.cuh"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/ffi_cuda.cuh"
#include "plan/row_layout.h"

namespace jaxsparse_tc {

// Work items of the row view: (row, begin, end, slot) over entries [begin, end)
// (jaxsparse_tc/_src/pattern.py row_schedule; the slots: common/format.h). slot kWholeRowSlot: a
// lane group walks the row; any other slot: a CTA item, the CTA's groups share the entries.
// slot >= 0: one of several CTA items of a very long row, whose sums meet in workspace slot
// `slot`. CTA items form the schedule's prefix, slotted ones the prefix of that.
struct RowView {
  const int2* entries;  // [nnz] (column, format position), CSR order
  const int4* sched;    // [R] items
  int64_t num_items;
  // What the entries address (bounds.cuh): items' ranges fold into [0, num_entries], their rows
  // into [0, last_row], entries' columns into [0, last_col] and positions into [0, last_pos].
  int num_entries, last_row, last_col, last_pos;
};

// `rows`: rows the items' row field addresses; `cols`: rows of the table the entries' columns
// gather; `values`: positions per head the entries' positions address. No item can be walked
// where any of them is empty (the handlers write such an operator's result without the row view).
inline RowView row_view(I32 entries, I32 schedule, int64_t rows, int64_t cols, int64_t values) {
  RowView rv{reinterpret_cast<const int2*>(entries.typed_data()),
             reinterpret_cast<const int4*>(schedule.typed_data()),
             int64_t(schedule.element_count()) / 4,
             count_int(int64_t(entries.element_count()) / 2),
             last_index(rows),
             last_index(cols),
             last_index(values)};
  if (rv.last_row < 0 || rv.last_col < 0 || rv.last_pos < 0) rv.num_items = 0;
  return rv;
}

// The row view's FFI operands, in the order row_view() takes them.
#define JAXSPARSE_TC_ROW_VIEW_ARGS                           \
  .Arg<::jaxsparse_tc::I32>()     /* row_entries [nnz, 2] */ \
      .Arg<::jaxsparse_tc::I32>() /* row_schedule [R, 4] */

// Item i of the schedule, its row and entry range folded into bounds (slot as stored).
__device__ __forceinline__ int4 row_item(const RowView& rv, int64_t i) {
  int4 it = rv.sched[i];
  it.x = clamp_last(it.x, rv.last_row);
  it.y = clamp_to(it.y, 0, rv.num_entries);
  it.z = clamp_to(it.z, it.y, rv.num_entries);
  return it;
}

// An entry's column and position folded into bounds (once per loaded entry).
__device__ __forceinline__ int2 clamp_entry(const RowView& rv, int2 e) {
  return make_int2(clamp_last(e.x, rv.last_col), clamp_last(e.y, rv.last_pos));
}

// Whole-row item `item` of the schedule as (row, begin, end), or an empty range where the item
// is past the schedule or a CTA item: kernels whose warps run in lockstep call their row
// function for every group, with or without work.
__device__ __forceinline__ int3 whole_row_or_empty(const RowView& rv, int64_t item) {
  int4 it = item < rv.num_items ? row_item(rv, item) : make_int4(0, 0, 0, kCtaRowSlot);
  if (it.w != kWholeRowSlot) it.y = it.z = 0;
  return make_int3(it.x, it.y, it.z);
}

// Whether a whole-row stream walks a schedule item of slot `slot` and `len` entries: whole rows,
// and single CTA items of at most `stream_max` entries (row_stream_max). The schedule's CTA items
// come longest first and slotted ones before single ones (pattern.row_schedule), so past the
// first item the streams walk, they walk every later one, and the CTAs stop there.
__device__ __forceinline__ bool streamed(int slot, int len, int stream_max) {
  return slot == kWholeRowSlot || (slot == kCtaRowSlot && len <= stream_max);
}

// Share g of `groups` equal shares (at least min_share entries each) of a CTA item's entries
// [begin, end), as [x, y); empty for groups past the entries. Offsets are clamped to the item
// before they are added, so no position passes `end`.
__device__ __forceinline__ int2 cta_share(int begin, int end, int groups, int g, int min_share) {
  const int len = end - begin;
  const int per = max((len + groups - 1) / groups, min_share);
  const int off = min(g * per, len);
  return make_int2(begin + off, begin + min(per, len - off) + off);
}

constexpr unsigned kFullWarp = 0xffffffffu;  // shuffle mask of a warp that runs in lockstep

// A value's raw bits (widened to 32; load_raw_if) as float: 16-bit values are loaded raw and
// converted where they are used, so that their load does not stall the gathers issued after it.
template <class T>
__device__ __forceinline__ float raw_to_f32(uint32_t b) {
  if constexpr (sizeof(T) == 4)
    return __uint_as_float(b);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(__ushort_as_half((unsigned short)b));
  else
    return __uint_as_float(b << 16);  // bfloat16 -> fp32 is a shift
}

// Predicated read-only loads: where `p` is false nothing is read. The row kernels issue their
// gathers through these rather than under `if`, so that the compiler keeps straight-line code
// (with a branch per gather, ptxas re-derived the lane's row pointer at every gather to stay
// within 64 registers). ldg16_if and load_raw_if give zeros where `p` is false; ldg8_if leaves
// its result undefined there (entries are used only where they exist).
__device__ __forceinline__ uint4 ldg16_if(bool p, const void* a) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
      " @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(a), "r"(int(p)));
  return v;
}
// ldg16_if into four words (a lane's 16 bytes of a gathered row).
__device__ __forceinline__ void ldg16_words_if(bool p, const void* a, uint32_t (&w)[4]) {
  const uint4 v = ldg16_if(p, a);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}
__device__ __forceinline__ int2 ldg8_if(bool p, const void* a) {
  int2 v;
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n @q ld.global.nc.v2.s32 {%0, %1}, [%2];\n}"
      : "=r"(v.x), "=r"(v.y)
      : "l"(a), "r"(int(p)));
  return v;
}
template <class T>
__device__ __forceinline__ uint32_t load_raw_if(bool p, const T* a) {
  uint32_t v = 0u;
  if constexpr (sizeof(T) == 4)
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u32 %0, [%1];\n}"
                 : "+r"(v)
                 : "l"(a), "r"(int(p)));
  else
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u16 %0, [%1];\n}"
                 : "+r"(v)
                 : "l"(a), "r"(int(p)));
  return v;
}

// A group's next U entries from k (of a range ending at `end`, inside [0, rv.num_entries]), read
// by every lane of the group alike: a broadcast load, so gathers need no shuffles (whose
// convergence checks, when the two groups of a warp walk different rows, cost more than the
// load). Columns and positions come folded into bounds. Returns how many of the U exist.
template <int U>
__device__ __forceinline__ int load_entries(const RowView& rv, int k, int end, int2 (&en)[U]) {
  const int2* e = rv.entries + k;
#pragma unroll
  for (int u = 0; u < U; ++u) en[u] = clamp_entry(rv, ldg8_if(k + u < end, e + u));
  return max(0, min(U, end - k));
}

// The pointer's value, hidden from the optimizer: a per-thread base that is computed once and
// then only offset (ptxas otherwise folds the head offset into every gather's address).
template <class P>
__device__ __forceinline__ P* opaque(P* p) {
  uint64_t v = reinterpret_cast<uint64_t>(p);
  asm("mov.b64 %0, %0;" : "+l"(v));
  return reinterpret_cast<P*>(v);
}

// Byte offset of row c of a table with rows `pitch` bytes apart (one 32x32->64 multiply).
__device__ __forceinline__ uint64_t row_offset(int c, int pitch) {
  return uint64_t(uint32_t(c)) * uint32_t(pitch);
}

// A lane's slice of a table of dense rows the row kernels gather from: rows [*, d] of T, the
// lane owning features [f, f + E) (active: f < d). VEC (rows 16-byte aligned, d a multiple of
// E): a gather is one predicated 16-byte load at lane0 + c * pitch, lane0 kept in registers;
// otherwise element loads masked to d. pitch = d * sizeof(T) fits in int (the launches check).
template <class T, int E, bool VEC>
struct LaneRows {
  const T* rows;
  const char* lane0;
  int64_t f, d;
  int pitch;
  bool active;

  LaneRows() = default;
  __device__ __forceinline__ LaneRows(const T* rows_, int64_t f_, int64_t d_)
      : rows(rows_), f(f_), d(d_), pitch(int(d_ * int64_t(sizeof(T)))), active(f_ < d_) {
    lane0 = opaque(reinterpret_cast<const char*>(rows_ + (active ? f_ : 0)));
  }

  // The lane's words of row c where `ok`, zeros otherwise with nothing read. Callers fold
  // `active` into `ok` (the SpMM once per batch, where a test per gather would cost).
  __device__ __forceinline__ void gather(bool ok, int c, uint32_t (&w)[Words<T, E>::N]) const {
    if constexpr (VEC) {
      static_assert(Words<T, E>::N == 4, "a lane's features are 16 bytes");
      ldg16_words_if(ok, lane0 + row_offset(c, pitch), w);
    } else {
#pragma unroll
      for (int i = 0; i < Words<T, E>::N; ++i) w[i] = 0u;
      if (ok) load_row<T, E>(rows + int64_t(c) * d, f, d, false, w);
    }
  }
};

// E consecutive elements held in words -> floats (exact conversions).
template <class T, int E>
__device__ __forceinline__ void unpack_words(const uint32_t (&w)[Words<T, E>::N], float (&x)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = word_elem<T>(w, e);
}

// Sums U per-lane values over the L lanes of a group with U - 1 + log2(L / U) shuffles instead
// of U log2(L): at each of the first log2(U) steps a lane keeps half of its values and adds its
// partner's copy of that half. Afterwards lane li holds the total of value li / (L / U). U <= L.
template <int L, int U>
__device__ __forceinline__ float reduce_many(float (&s)[U], unsigned mask, int li) {
  static_assert(U <= L, "more values than lanes");
  int cnt = U;
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) {
    if (cnt > 1) {
      const bool upper = li & o;
      const int half = cnt / 2;
#pragma unroll
      for (int i = 0; i < U / 2; ++i) {
        if (i < half) {
          const float send = upper ? s[i] : s[i + half];
          const float keep = upper ? s[i + half] : s[i];
          s[i] = keep + __shfl_xor_sync(mask, send, o);
        }
      }
      cnt = half;
    } else {
      s[0] += __shfl_xor_sync(mask, s[0], o);
    }
  }
  return s[0];
}

}  // namespace jaxsparse_tc
