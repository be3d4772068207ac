// Checks of the format's invariants (docs/FORMAT.md) on arrays that may be corrupt. A
// SparseMatrix's integer arrays are pytree leaves: jax.tree.map, or any edit inside jit, changes
// them where no Python check sees them, and a kernel that trusts them reads and writes out of
// bounds. One set of routines serves both users:
//   - the validator (check_pattern, check_transpose): every invariant any CPU or CUDA kernel
//     relies on, for concrete arrays (strict: pointers end at their arrays' lengths, every
//     window and row scheduled exactly once);
//   - the CPU FFI handlers (KernelGuard): the subset their kernels' memory accesses depend on,
//     checked before a kernel touches a window. Padded patterns (_src/padding.py: tails of
//     arrays that no window or row reaches, empty windows and rows scheduled more than once)
//     are valid input there.
// Every check returns the first broken invariant as one message naming the array, the index, the
// value and what was expected; "" when all hold.
#pragma once
#include <cstdint>
#include <atomic>
#include <string>

#include "common/ffi_pattern.h"
#include "common/format.h"

namespace jaxsparse_tc {

// One orientation's kernel arrays (Pattern.kernel_arrays()) and the lengths their buffers have.
struct KernelArrays {
  PatternView view;  // what the kernels take: num_windows = W, num_blocks = B, num_items = S
  int64_t window_col_ptr_len, window_cols_len, window_block_ptr_len, block_value_ptr_len;
  int64_t bitmap_rows, bitmap_cols;      // [B, 2]
  int64_t schedule_rows, schedule_cols;  // [S, kScheduleFields]
};

// What the arrays are checked against. A bound < 0 is unknown to the caller: not checked (the
// kernel at hand does not read what it bounds).
struct PatternLimits {
  int64_t m = -1;    // rows: W = ceil(m / 8), bitmap bits only for rows < m
  int64_t n = -1;    // columns: condensed columns in [0, n)
  int64_t nnz = -1;  // values: block_value_ptr within [0, nnz]
  // The validator's invariants besides the kernels' (see the file comment); with `rows` and
  // `cols` (per value, format order), also each value's row and column.
  bool strict = false;
  const int32_t* rows = nullptr;
  const int32_t* cols = nullptr;
};

namespace check {

// Buffer lengths against each other and against m. O(1).
std::string sizes(const KernelArrays& a, const PatternLimits& lim);
// The pointers' first entries and every window's first block within the blocks: what the
// handlers' fan-out reads before any window is checked (cpu/parallel.h reads block_value_ptr at
// each window's first block). O(W). Needs sizes().
std::string starts(const KernelArrays& a);
// Windows [w0, w1): their pointers (against the next window's), condensed columns, blocks'
// bitmaps and value pointers; with lim.strict and w1 = W, also the pointers' last entries.
// Needs starts().
std::string windows(const KernelArrays& a, const PatternLimits& lim, int64_t w0, int64_t w1);
// Schedule items [s0, s1): each field within its range (a window, a block, ...; what a kernel
// indexes with it), whatever the others hold.
std::string schedule_ranges(const KernelArrays& a, int64_t s0, int64_t s1);
// Schedule items [s0, s1), each against its window and its neighbours (a window's pieces
// contiguous, split items the schedule's prefix). Reads in bounds whatever the pointers hold;
// its messages assume windows() holds.
std::string schedule_items(const KernelArrays& a, int64_t s0, int64_t s1);
// Every window scheduled exactly once (with schedule_items: its blocks exactly once).
std::string schedule_cover(const KernelArrays& a);

}  // namespace check

// The full validator (docs/FORMAT.md; nanobind functions of the same names in cpu/module.cc).
// Arrays as Pattern holds them: row_entries [nnz, 2], row_schedule [R, 4] (flat, with their row
// counts).
struct RowArrays {
  const int32_t* entries;
  int64_t entries_rows, entries_cols;
  const int32_t* schedule;
  int64_t schedule_rows, schedule_cols;
};
std::string check_pattern(const KernelArrays& a, const int32_t* rows, int64_t rows_len,
                          const int32_t* cols, int64_t cols_len, const RowArrays& rv, int64_t m,
                          int64_t n);
std::string check_transpose(const int32_t* rows, int64_t rows_len, const int32_t* cols,
                            int64_t cols_len, const int32_t* rows_t, int64_t rows_t_len,
                            const int32_t* cols_t, int64_t cols_t_len, const int32_t* perm_t,
                            int64_t perm_t_len, const int32_t* perm_t_inv, int64_t perm_t_inv_len);

// -- the CPU handlers' side -------------------------------------------------------------------

inline KernelArrays kernel_arrays(I32 wcp, I32 wc, I32 wbp, U32 bitmap, I32 bvp, I32 schedule) {
  KernelArrays a;
  a.view = make_view(wcp, wc, wbp, bitmap, bvp, schedule);
  a.window_col_ptr_len = int64_t(wcp.element_count());
  a.window_cols_len = int64_t(wc.element_count());
  a.window_block_ptr_len = int64_t(wbp.element_count());
  a.block_value_ptr_len = int64_t(bvp.element_count());
  const auto bd = bitmap.dimensions(), sd = schedule.dimensions();
  a.bitmap_rows = bd.size() == 2 ? bd[0] : -1;  // sizes() names a wrong rank
  a.bitmap_cols = bd.size() == 2 ? bd[1] : -1;
  a.schedule_rows = sd.size() == 2 ? sd[0] : -1;
  a.schedule_cols = sd.size() == 2 ? sd[1] : -1;
  return a;
}

// "[2, 50, 16]".
std::string dims_string(ffi::Span<const int64_t> dims);

// A handler's operand that does not fit the others: "<target>: <what>".
inline ffi::Error operand_error(const char* target, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + what);
}

// Head counts broadcast: each operand has 1 or H heads.
inline bool heads_broadcast(int64_t h, int64_t heads) {
  return h == 1 || h == heads;
}

// The checks a CPU handler runs before its kernel (see the file comment). The sizes and what the
// fan-out reads come first (prologue, O(W) and vectorised); then each chunk of windows of the
// fan-out checks its own windows and the ranges of a like share of the schedule's fields (the
// CPU kernels do not read the schedule: its consistency is the validator's) just before the
// kernel runs on them (windows), so the arrays are read in parallel and, for the kernel, from
// cache. status(): success, or the first broken invariant (searched again in order, so the message
// does not depend on the chunking); a fan-out that did not cover every window once is a failure
// too. A handler that checks everything before its fan-out calls all(pool).
class KernelGuard {
 public:
  KernelGuard(const char* target, const KernelArrays& a, const PatternLimits& lim)
      : target_(target), a_(a), lim_(lim) {}

  ffi::Error prologue();
  // Whether the kernel may run on windows [w0, w1) (else status() fails). Thread-safe.
  bool windows(int64_t w0, int64_t w1);
  ffi::Error status();
  // prologue(), then every window (split over the pool's threads where the arrays are large),
  // then status(): for a handler that checks everything before its own fan-out.
  ffi::Error all(ffi::ThreadPool& pool);

 private:
  ffi::Error fail(const std::string& what) const;

  const char* target_;
  KernelArrays a_;
  PatternLimits lim_;
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> covered_{0};  // windows the chunks checked
};

}  // namespace jaxsparse_tc
