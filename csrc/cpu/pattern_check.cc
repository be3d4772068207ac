#include "cpu/pattern_check.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/parallel.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define JAXSPARSE_TC_CHECK_X86 1
#include <immintrin.h>
#else
#define JAXSPARSE_TC_CHECK_X86 0
#endif

namespace jaxsparse_tc {
namespace {

// Messages are assembled without iostreams: a module that carries its own copy of the C++ runtime
// can crash in the stream's locale facets when another copy is loaded in the process (seen on a
// GPU machine, where jaxlib's is).
void append(std::string& s, const std::string& x) {
  s += x;
}
void append(std::string& s, const char* x) {
  s += x;
}
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& s, T x) {
  s += std::to_string(x);
}

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (append(s, parts), ...);
  return s;
}

int64_t ceil8(int64_t x) {
  return (x + 7) / 8;
}

// -- the loops over whole arrays --------------------------------------------------------------
// A handler checks what its kernel is about to read on every call, so each check is a
// branch-free test per entry whose results are ORed over runs of entries; only a run that fails
// is searched for its first failing entry, whose message is then written by code that may be
// slow. Tests read only in-bounds entries (indices clamped) whatever the values they meet.
constexpr int64_t kRun = 1024;

// The first i in [begin, end) where bad(i), or -1.
template <typename Bad>
int64_t first_failing(int64_t begin, int64_t end, const Bad& bad) {
  for (int64_t i0 = begin; i0 < end; i0 += kRun) {
    const int64_t i1 = std::min(end, i0 + kRun);
    bool any = false;
    for (int64_t i = i0; i < i1; ++i) any |= bad(i);
    if (any)
      for (int64_t i = i0; i < i1; ++i)
        if (bad(i)) return i;
  }
  return -1;
}

// Set bits of a 64-bit word without a POPCNT instruction (the portable build's baseline).
inline int64_t popcount64(uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return int64_t((x * 0x0101010101010101ull) >> 56);
}

// The loops over the largest arrays (condensed columns, blocks) and over windows and schedule
// items are built twice, like the kernels (cpu/kernels.cc): portable, and on x86-64 for AVX2
// where the CPU has it.

// Window w against the next one's pointers (the window pointers' entries within their arrays,
// starts()): both nondecreasing from nonnegative entries, columns within window_cols (C of
// them), ceil(columns / 8) blocks, its values nondecreasing from nonnegative and within the
// values (nnz); and its last block without bits past its columns (a block has 8 condensed
// columns but the last, which has the rest: such bits would make a kernel read past the window's
// columns). bitmap: B > 0 blocks, or a zero block.
struct WindowTest {
  const int32_t *wcp, *wbp, *bvp;
  const uint32_t* bitmap;
  int64_t C, B, nnz;

  bool operator()(int64_t w) const {
    const int64_t c0 = wcp[w], c1 = wcp[w + 1], b0 = wbp[w], b1 = wbp[w + 1];
    const int64_t nb = b1 - b0, last_cols = c1 - c0 - kBlockCols * (nb - 1);  // 8 if empty
    const uint64_t bits = block_bits(bitmap, b1 > 0 && B > 0 ? b1 - 1 : 0);
    return (c0 < 0) | (c1 < c0) | (c1 > C) | (b1 < b0) | (nb != ceil8(c1 - c0)) | (bvp[b0] < 0) |
           (bvp[b1] < bvp[b0]) | (bvp[b1] > nnz) |
           ((last_cols < kBlockCols) & ((bits >> (8 * (last_cols & 7))) != 0));
  }
};

int64_t first_bad_window_portable(const WindowTest& t, int64_t w0, int64_t w1) {
  return first_failing(w0, w1, t);
}

// The first i in [0, count) with c[i] outside [0, n), or -1.
int64_t first_bad_col_portable(const int32_t* c, int64_t count, int64_t n) {
  // Unsigned: a negative column compares as >= 2^31 >= bound.
  const uint32_t bound = uint32_t(std::min<int64_t>(n, int64_t(1) << 31));
  return first_failing(0, count, [&](int64_t i) { return uint32_t(c[i]) >= bound; });
}

// The first block b in [b0, b1) whose value count block_value_ptr[b + 1] - block_value_ptr[b]
// differs from its bitmap's popcount, or -1.
int64_t first_bad_step_portable(const uint32_t* bitmap, const int32_t* bvp, int64_t b0,
                                int64_t b1) {
  return first_failing(b0, b1, [&](int64_t b) {
    return int64_t(bvp[b + 1]) - int64_t(bvp[b]) != popcount64(block_bits(bitmap, b));
  });
}

// The first schedule item i in [s0, s1) with a field f outside [lo[f], hi[f]], or -1.
int64_t first_bad_item_portable(const int32_t* sched, int64_t s0, int64_t s1, const int32_t* lo,
                                const int32_t* hi) {
  return first_failing(s0, s1, [&](int64_t i) {
    const int32_t* it = sched + i * kScheduleFields;
    bool bad = false;
    for (int f = 0; f < kScheduleFields; ++f) bad |= (it[f] < lo[f]) | (it[f] > hi[f]);
    return bad;
  });
}

#if JAXSPARSE_TC_CHECK_X86
// The first schedule item with a field out of its range: an item is one vector.
__attribute__((target("avx2"))) int64_t first_bad_item_avx2(const int32_t* sched, int64_t s0,
                                                            int64_t s1, const int32_t* lo,
                                                            const int32_t* hi) {
  static_assert(kScheduleFields == 8, "an item is one vector of 8 fields");
  const __m256i lov = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo));
  const __m256i hiv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi));
  for (int64_t i0 = s0; i0 < s1; i0 += kRun) {
    const int64_t i1 = std::min(s1, i0 + kRun);
    __m256i bad = _mm256_setzero_si256();
    for (int64_t i = i0; i < i1; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sched + 8 * i));
      bad = _mm256_or_si256(
          bad, _mm256_or_si256(_mm256_cmpgt_epi32(lov, v), _mm256_cmpgt_epi32(v, hiv)));
    }
    if (!_mm256_testz_si256(bad, bad)) return first_bad_item_portable(sched, i0, i1, lo, hi);
  }
  return -1;
}

// (No lambdas in the AVX2 functions: the target attribute does not reach them.)
__attribute__((target("avx2"))) inline __m256i load8(const int32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
__attribute__((target("avx2"))) inline __m256i i32(int64_t x) {
  return _mm256_set1_epi32(int32_t(std::min<int64_t>(x, INT32_MAX)));
}

// WindowTest for 8 windows at a time (the pointers and values in 32-bit lanes: a difference that
// wraps comes with a failed order test).
__attribute__((target("avx2"))) int64_t first_bad_window_avx2(const WindowTest& t, int64_t w0,
                                                              int64_t w1) {
  const __m256i zero = _mm256_setzero_si256(), eight = _mm256_set1_epi32(kBlockCols);
  const __m256i cols = i32(t.C), values = i32(t.nnz), one = _mm256_set1_epi32(1);
  const long long* bits64 = reinterpret_cast<const long long*>(t.bitmap);
  const __m256i last_block = i32(t.B > 0 ? t.B - 1 : 0);
  for (int64_t i0 = w0; i0 < w1; i0 += kRun) {
    const int64_t i1 = std::min(w1, i0 + kRun);
    __m256i bad = zero, bad_bits = zero;
    int64_t w = i0;
    for (; w + 8 <= i1; w += 8) {
      const __m256i c0 = load8(t.wcp + w), c1 = load8(t.wcp + w + 1);
      const __m256i b0 = load8(t.wbp + w), b1 = load8(t.wbp + w + 1);
      const __m256i v0 = _mm256_i32gather_epi32(t.bvp, b0, 4);
      const __m256i v1 = _mm256_i32gather_epi32(t.bvp, b1, 4);
      const __m256i ncols = _mm256_sub_epi32(c1, c0), nb = _mm256_sub_epi32(b1, b0);
      const __m256i ceil = _mm256_srai_epi32(_mm256_add_epi32(ncols, _mm256_set1_epi32(7)), 3);
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(zero, c0));
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(c0, c1));
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(c1, cols));
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(b0, b1));
      bad = _mm256_or_si256(bad,
                            _mm256_xor_si256(_mm256_cmpeq_epi32(nb, ceil), _mm256_set1_epi32(-1)));
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(zero, v0));
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(v0, v1));
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(v1, values));
      // The last block's bits past its columns: 8 - (8 nb - ncols) columns, 8 if empty.
      const __m256i last_cols =
          _mm256_sub_epi32(ncols, _mm256_mullo_epi32(eight, _mm256_sub_epi32(nb, one)));
      const __m256i partial = _mm256_cmpgt_epi32(eight, last_cols);
      const __m256i shift = _mm256_slli_epi32(_mm256_and_si256(last_cols, _mm256_set1_epi32(7)), 3);
      const __m256i block =
          _mm256_min_epi32(_mm256_max_epi32(_mm256_sub_epi32(b1, one), zero), last_block);
      for (int half = 0; half < 2; ++half) {
        const __m128i idx =
            half ? _mm256_extracti128_si256(block, 1) : _mm256_castsi256_si128(block);
        const __m128i sh =
            half ? _mm256_extracti128_si256(shift, 1) : _mm256_castsi256_si128(shift);
        const __m128i pa =
            half ? _mm256_extracti128_si256(partial, 1) : _mm256_castsi256_si128(partial);
        const __m256i bits = _mm256_i32gather_epi64(bits64, idx, 8);
        const __m256i past = _mm256_srlv_epi64(bits, _mm256_cvtepu32_epi64(sh));
        bad_bits = _mm256_or_si256(bad_bits, _mm256_and_si256(past, _mm256_cvtepi32_epi64(pa)));
      }
    }
    bool any = !_mm256_testz_si256(bad, bad) || !_mm256_testz_si256(bad_bits, bad_bits);
    for (; w < i1; ++w) any |= t(w);
    if (any) return first_failing(i0, i1, t);
  }
  return -1;
}

__attribute__((target("avx2"))) int64_t first_bad_col_avx2(const int32_t* c, int64_t count,
                                                           int64_t n) {
  const uint32_t bound = uint32_t(std::min<int64_t>(n, int64_t(1) << 31));
  if (bound == 0) return count ? 0 : -1;
  // The largest entry of a run, unsigned, against the bound.
  const __m256i last = _mm256_set1_epi32(int32_t(bound - 1));
  for (int64_t i0 = 0; i0 < count; i0 += kRun) {
    const int64_t i1 = std::min(count, i0 + kRun);
    __m256i mx = _mm256_setzero_si256();
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8)
      mx = _mm256_max_epu32(mx, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
    uint32_t tail = 0;
    for (; i < i1; ++i) tail = std::max(tail, uint32_t(c[i]));
    const __m256i over = _mm256_cmpeq_epi32(_mm256_max_epu32(mx, last), last);
    if (_mm256_movemask_epi8(over) != -1 || tail > bound - 1)
      for (i = i0; i < i1; ++i)
        if (uint32_t(c[i]) >= bound) return i;
  }
  return -1;
}

__attribute__((target("avx2"))) int64_t first_bad_step_avx2(const uint32_t* bitmap,
                                                            const int32_t* bvp, int64_t b0,
                                                            int64_t b1) {
  // Four blocks at a time: nibble popcounts by table lookup, summed per 64-bit block.
  const __m256i table = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2,
                                         1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i nibble = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
  for (int64_t i0 = b0; i0 < b1; i0 += kRun) {
    const int64_t i1 = std::min(b1, i0 + kRun);
    __m256i bad = zero;
    int64_t b = i0;
    for (; b + 4 <= i1; b += 4) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bitmap + 2 * b));
      const __m256i lo = _mm256_and_si256(v, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      const __m256i counts =
          _mm256_add_epi8(_mm256_shuffle_epi8(table, lo), _mm256_shuffle_epi8(table, hi));
      const __m256i pop = _mm256_sad_epu8(counts, zero);
      const __m256i p0 =
          _mm256_cvtepi32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bvp + b)));
      const __m256i p1 =
          _mm256_cvtepi32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bvp + b + 1)));
      bad = _mm256_or_si256(bad, _mm256_xor_si256(_mm256_sub_epi64(p1, p0), pop));
    }
    bool any = !_mm256_testz_si256(bad, bad);
    for (; b < i1; ++b)
      any |= int64_t(bvp[b + 1]) - int64_t(bvp[b]) != popcount64(block_bits(bitmap, b));
    if (any)
      for (b = i0; b < i1; ++b)
        if (int64_t(bvp[b + 1]) - int64_t(bvp[b]) != popcount64(block_bits(bitmap, b))) return b;
  }
  return -1;
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

struct Loops {
  int64_t (*first_bad_window)(const WindowTest&, int64_t, int64_t);
  int64_t (*first_bad_col)(const int32_t*, int64_t, int64_t);
  int64_t (*first_bad_step)(const uint32_t*, const int32_t*, int64_t, int64_t);
  int64_t (*first_bad_item)(const int32_t*, int64_t, int64_t, const int32_t*, const int32_t*);
};

const Loops& loops() {
#if JAXSPARSE_TC_CHECK_X86
  static const Loops l = cpu_has_avx2() ? Loops{&first_bad_window_avx2, &first_bad_col_avx2,
                                                &first_bad_step_avx2, &first_bad_item_avx2}
                                        : Loops{&first_bad_window_portable, &first_bad_col_portable,
                                                &first_bad_step_portable, &first_bad_item_portable};
#else
  static const Loops l{&first_bad_window_portable, &first_bad_col_portable,
                       &first_bad_step_portable, &first_bad_item_portable};
#endif
  return l;
}

// -- messages ---------------------------------------------------------------------------------
std::string bits_hex(uint64_t bits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, bits);
  return buf;
}

constexpr const char* kFieldNames[kScheduleFields] = {
    "window", "block_begin", "block_end", "split", "col_begin", "col_end", "first", "pieces"};

std::string item_string(const int32_t* it, int fields) {
  std::string s = "(";
  for (int f = 0; f < fields; ++f) s += (f ? ", " : "") + std::to_string(it[f]);
  return s + ")";
}

// "schedule[i] = (...): <field> = v; expected <what>".
std::string item_error(const int32_t* sched, int64_t i, int field, const std::string& expected) {
  const int32_t* it = sched + i * kScheduleFields;
  return cat("schedule[", i, "] = ", item_string(it, kScheduleFields), ": ", kFieldNames[field],
             " = ", it[field], "; expected ", expected);
}

// Bits 8c + r (c < 8) for the rows r >= rows of each column: the bits past a window's last row.
uint64_t rows_from(int64_t rows) {
  const uint64_t byte = (0xffu << rows) & 0xffu;
  return byte * 0x0101010101010101ull;
}

// The condensed columns block b of window w holds (1..8).
int64_t block_columns(const PatternView& p, int64_t w, int64_t b) {
  const int64_t ncols = int64_t(p.window_col_ptr[w + 1]) - p.window_col_ptr[w];
  return std::min<int64_t>(kBlockCols, ncols - kBlockCols * (b - p.window_block_ptr[w]));
}

}  // namespace

std::string dims_string(ffi::Span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

namespace check {

std::string sizes(const KernelArrays& a, const PatternLimits& lim) {
  if (a.window_col_ptr_len < 1)
    return "window_col_ptr is empty; expected W + 1 >= 1 entries (W: the row windows)";
  const int64_t W = a.window_col_ptr_len - 1;
  if (lim.m >= 0 && W != ceil8(lim.m))
    return cat("window_col_ptr has ", a.window_col_ptr_len,
               " entries; expected W + 1 = ", ceil8(lim.m) + 1, " for m = ", lim.m,
               " rows (W = ceil(m / 8) windows)");
  if (a.window_block_ptr_len != W + 1)
    return cat("window_block_ptr has ", a.window_block_ptr_len,
               " entries; expected W + 1 = ", W + 1, " (as window_col_ptr)");
  if (a.bitmap_cols != 2)
    return cat("block_bitmap must have shape [B, 2] (uint32 halves of 64-bit bitmaps); got ",
               a.bitmap_rows, " x ", a.bitmap_cols);
  if (a.block_value_ptr_len != a.bitmap_rows + 1)
    return cat("block_value_ptr has ", a.block_value_ptr_len,
               " entries; expected B + 1 = ", a.bitmap_rows + 1,
               " (block_bitmap has B = ", a.bitmap_rows, " blocks)");
  if (a.schedule_cols != kScheduleFields)
    return cat("schedule must have shape [S, ", kScheduleFields, "]; got ", a.schedule_rows, " x ",
               a.schedule_cols);
  return {};
}

std::string starts(const KernelArrays& a) {
  const PatternView& p = a.view;
  const int64_t W = p.num_windows, B = p.num_blocks;
  const int32_t* wbp = p.window_block_ptr;
  if (p.window_col_ptr[0] != 0)
    return cat("window_col_ptr[0] = ", p.window_col_ptr[0], "; expected 0");
  if (wbp[0] != 0) return cat("window_block_ptr[0] = ", wbp[0], "; expected 0");
  if (p.block_value_ptr[0] != 0)
    return cat("block_value_ptr[0] = ", p.block_value_ptr[0], "; expected 0");
  const int64_t w = first_failing(1, W + 1, [&](int64_t w) { return uint32_t(wbp[w]) > B; });
  if (w >= 0)
    return cat("window_block_ptr[", w, "] = ", wbp[w], " is not a block index in [0, ", B,
               "] (block_bitmap has ", B, " blocks)");
  return {};
}

std::string windows(const KernelArrays& a, const PatternLimits& lim, int64_t w0, int64_t w1) {
  const PatternView& p = a.view;
  if (w0 >= w1) return {};
  const int64_t W = p.num_windows, C = a.window_cols_len, B = p.num_blocks;
  const int32_t* wcp = p.window_col_ptr;
  const int32_t* wbp = p.window_block_ptr;
  const int32_t* wc = p.window_cols;
  const int32_t* bvp = p.block_value_ptr;
  // A pattern without blocks (every window empty) reads a zero bitmap here.
  static const uint32_t kNoBlock[2] = {0, 0};
  const uint32_t* bitmap = B > 0 ? p.block_bitmap : kNoBlock;
  // The validator's pointers end at their arrays' ends (a kernel's may stop short: padding).
  if (lim.strict && w1 == W) {
    if (wcp[W] != C)
      return cat("window_col_ptr[", W, "] = ", wcp[W], " (its last entry); expected ", C,
                 ", the length of window_cols");
    if (wbp[W] != B)
      return cat("window_block_ptr[", W, "] = ", wbp[W], " (its last entry); expected ", B,
                 ", the number of blocks (block_bitmap's rows)");
    if (lim.nnz >= 0 && bvp[B] != lim.nnz)
      return cat("block_value_ptr[", B, "] = ", bvp[B],
                 " (its last entry); expected nnz = ", lim.nnz);
  }
  // The streams over the windows' columns and blocks first (the ranges clamped: their pointers
  // are checked after), so that the window test's scattered reads of block_value_ptr and
  // block_bitmap find them in cache; failures are reported in the order of the checks.
  const int64_t c0 = std::clamp<int64_t>(wcp[w0], 0, C), c1 = std::clamp<int64_t>(wcp[w1], c0, C);
  const int64_t b0 = wbp[w0], b1 = std::max<int64_t>(wbp[w1], b0);  // within [0, B]: starts()
  const int64_t bad_col = lim.n >= 0 ? loops().first_bad_col(wc + c0, c1 - c0, lim.n) : -1;
  const int64_t bad_step = loops().first_bad_step(bitmap, bvp, b0, b1);
  const int64_t nnz = lim.nnz >= 0 ? lim.nnz : std::numeric_limits<int64_t>::max();
  const WindowTest test{wcp, wbp, bvp, bitmap, C, B, nnz};
  const int64_t bad_window = loops().first_bad_window(test, w0, w1);
  if (bad_window >= 0) {
    const int64_t w = bad_window, c0 = wcp[w], c1 = wcp[w + 1], b0 = wbp[w], b1 = wbp[w + 1];
    // (Negative first entries: a chunk of windows relies on its first window's, which the
    // window before checks against its own.)
    if (c0 < 0) return cat("window_col_ptr[", w, "] = ", c0, " is negative");
    if (c1 < c0)
      return cat("window_col_ptr[", w + 1, "] = ", c1, " is less than window_col_ptr[", w,
                 "] = ", c0, " (pointers must be nondecreasing)");
    if (c1 > C)
      return cat("window_col_ptr[", w + 1, "] = ", c1, " is past the end of window_cols (", C,
                 " entries)");
    if (b1 < b0)
      return cat("window_block_ptr[", w + 1, "] = ", b1, " is less than window_block_ptr[", w,
                 "] = ", b0, " (pointers must be nondecreasing)");
    if (b1 - b0 != ceil8(c1 - c0))
      return cat("window_block_ptr[", w + 1, "] - window_block_ptr[", w, "] = ", b1 - b0,
                 " blocks for window ", w, "'s ", c1 - c0, " condensed columns (window_col_ptr[", w,
                 ":", w + 2, "] = ", c0, ", ", c1, "); expected ceil(", c1 - c0,
                 " / 8) = ", ceil8(c1 - c0));
    if (bvp[b0] < 0)
      return cat("block_value_ptr[", b0, "] = ", bvp[b0], " (window_block_ptr[", w,
                 "]) is negative");
    if (bvp[b1] < bvp[b0])
      return cat("block_value_ptr[", b1, "] = ", bvp[b1], " (window_block_ptr[", w + 1, "] = ", b1,
                 ") is less than block_value_ptr[", b0, "] = ", bvp[b0], " (window_block_ptr[", w,
                 "]): pointers must be nondecreasing");
    if (bvp[b1] > nnz)
      return cat("block_value_ptr[", b1, "] = ", bvp[b1], " (window_block_ptr[", w + 1,
                 "]) is past the end of the values (nnz = ", nnz, ")");
    const int64_t b = b1 - 1, cols = block_columns(p, w, b);
    const uint64_t bits = block_bits(bitmap, b);
    return cat("block_bitmap[", b, "] = ", bits_hex(bits), " has bits in column ",
               (63 - __builtin_clzll(bits)) / kWindowRows, " of the block, which has ", cols,
               " condensed columns (the last block of window ", w, ", whose ", c1 - c0,
               " condensed columns leave it ", cols, ")");
  }
  if (bad_col >= 0)
    return cat("window_cols[", c0 + bad_col, "] = ", wc[c0 + bad_col],
               " is not a column index (n = ", lim.n, ")");
  if (lim.strict) {
    bool unsorted = false;
    for (int64_t w = w0; w < w1; ++w)
      for (int64_t c = int64_t(wcp[w]) + 1; c < wcp[w + 1]; ++c) unsorted |= wc[c] <= wc[c - 1];
    for (int64_t w = w0; w < w1 && unsorted; ++w)
      for (int64_t c = int64_t(wcp[w]) + 1; c < wcp[w + 1]; ++c)
        if (wc[c] <= wc[c - 1])
          return cat("window_cols[", c, "] = ", wc[c], " does not follow window_cols[", c - 1,
                     "] = ", wc[c - 1], " in window ", w,
                     " (condensed columns are increasing inside a window)");
  }
  // The last window's rows past m (a partial window).
  if (lim.m >= 0 && w1 == W && W > 0 && lim.m - kWindowRows * (W - 1) < kWindowRows) {
    const uint64_t past = rows_from(lim.m - kWindowRows * (W - 1));
    for (int64_t b = wbp[W - 1]; b < wbp[W]; ++b) {
      const uint64_t bits = block_bits(bitmap, b);
      if (bits & past) {
        const int r = __builtin_ctzll(bits & past) % kWindowRows;
        return cat("block_bitmap[", b, "] = ", bits_hex(bits), " has a bit for row ",
                   kWindowRows * (W - 1) + r, " (row ", r, " of the last window, ", W - 1,
                   ") but the matrix has m = ", lim.m, " rows");
      }
    }
  }
  {
    const int64_t bad = bad_step;
    if (bad >= 0)
      return cat("block_value_ptr[", bad + 1, "] - block_value_ptr[", bad,
                 "] = ", int64_t(bvp[bad + 1]) - bvp[bad], " values, but block_bitmap[", bad,
                 "] = ", bits_hex(block_bits(bitmap, bad)), " has ",
                 popcount64(block_bits(bitmap, bad)),
                 " bits set (a block's values follow each other)");
  }
  if (!lim.strict) return {};
  // Every condensed column holds a nonzero (a byte of each block's bitmap for each column), and
  // each value's row and column are those its window, block and bit say.
  const auto block_wrong = [&](int64_t w, int64_t b) {
    const int64_t cols = block_columns(p, w, b);
    // The columns past the block's count as nonempty (bytes of ones); the zero-byte test is exact
    // per byte (no carries between bytes).
    const uint64_t x = block_bits(bitmap, b) | (cols < 8 ? ~0ull << (kWindowRows * cols) : 0);
    const uint64_t low7 = 0x7f7f7f7f7f7f7f7full;
    bool wrong = ~(((x & low7) + low7) | x | low7) != 0;  // some byte of x is zero
    if (!lim.rows || !lim.cols) return wrong;
    const int64_t first_col = wcp[w] + kBlockCols * (b - wbp[w]);
    int64_t k = bvp[b];
    for (uint64_t bits = block_bits(bitmap, b); bits; bits &= bits - 1, ++k) {
      const int bit = __builtin_ctzll(bits);
      wrong |= (lim.rows[k] != kWindowRows * w + bit % kWindowRows) |
               (lim.cols[k] != wc[first_col + bit / kWindowRows]);
    }
    return wrong;
  };
  bool wrong = false;
  for (int64_t w = w0; w < w1; ++w)
    for (int64_t b = wbp[w]; b < wbp[w + 1]; ++b) wrong |= block_wrong(w, b);
  for (int64_t w = w0; w < w1 && wrong; ++w) {
    for (int64_t b = wbp[w]; b < wbp[w + 1]; ++b) {
      if (!block_wrong(w, b)) continue;
      const int64_t cols = block_columns(p, w, b), first_col = wcp[w] + 8 * (b - wbp[w]);
      const uint64_t bits = block_bits(bitmap, b);
      for (int64_t c = 0; c < cols; ++c)
        if (((bits >> (kWindowRows * c)) & 0xffu) == 0)
          return cat("block_bitmap[", b, "] = ", bits_hex(bits), " has no bit in condensed column ",
                     c, " (window_cols[", first_col + c, "] = ", wc[first_col + c],
                     "): every condensed column of a window holds a nonzero");
      int64_t k = bvp[b];
      for (uint64_t rest = bits; rest; rest &= rest - 1, ++k) {
        const int bit = __builtin_ctzll(rest);
        const int64_t row = kWindowRows * w + bit % kWindowRows;
        const int64_t col = wc[first_col + bit / kWindowRows];
        if (lim.rows[k] != row)
          return cat("rows[", k, "] = ", lim.rows[k], "; expected ", row, " (value ", k, " is bit ",
                     bit, " of block ", b, ", in window ", w, ")");
        if (lim.cols[k] != col)
          return cat("cols[", k, "] = ", lim.cols[k], "; expected ", col, " (value ", k,
                     " is in condensed column window_cols[", first_col + bit / kWindowRows, "])");
      }
    }
  }
  return {};
}

namespace {

constexpr int kWindow = 0, kBegin = 1, kEnd = 2, kSplit = 3, kColBegin = 4, kColEnd = 5, kFirst = 6,
              kPieces = 7;

// Schedule item i's fields against its window (window pointers checked) and its neighbours;
// branch-free, reading only in-bounds entries.
bool item_bad(const PatternView& p, int64_t i) {
  const int64_t W = p.num_windows, S = p.num_items;
  const int32_t* it = p.schedule + i * kScheduleFields;
  const int64_t w = it[kWindow];
  const bool bad_window = uint64_t(w) >= uint64_t(W);
  const int64_t ws = bad_window ? 0 : w;
  const int64_t wb = p.window_block_ptr[ws], we = p.window_block_ptr[ws + 1], nb = we - wb;
  const int64_t split = it[kSplit], first = it[kFirst], pieces = it[kPieces];
  const int64_t piece = i - first;
  const bool whole = split == 0, bad_split = uint64_t(split) > uint64_t(kSplitBlocks);
  const int64_t size = bad_split ? 0 : split;  // bounds the products below
  const int64_t begin = whole ? wb : wb + piece * size;
  const int64_t end = whole ? we : std::min(begin + size, we);
  bool bad = bad_window | bad_split | (first < 0) | (piece < 0) | (piece >= pieces);
  // pieces = ceil(nb / split) >= 2 for a split window, 1 for a whole one of <= 32 blocks.
  bad |= whole ? (pieces != 1) | (nb > kSplitBlocks)
               : (pieces < 2) | ((pieces - 1) * size >= nb) | (pieces * size < nb);
  bad |= (it[kBegin] != begin) | (it[kEnd] != end);
  bad |= (it[kColBegin] != int64_t(p.window_col_ptr[ws]) + kBlockCols * (begin - wb)) |
         (it[kColEnd] != p.window_col_ptr[ws + 1]);
  // Pieces are consecutive items naming their window and first piece; split items come first.
  const int32_t* prev = p.schedule + std::max<int64_t>(i - 1, 0) * kScheduleFields;
  const int32_t* next = p.schedule + std::min(i + 1, S - 1) * kScheduleFields;
  const bool has_next = i + 1 < S;
  bad |= (piece > 0) & ((i == 0) | (prev[kWindow] != w) | (prev[kFirst] != first));
  bad |= (piece + 1 < pieces) & (!has_next | (next[kWindow] != w) | (next[kFirst] != first));
  bad |= whole & has_next & (next[kSplit] != 0);
  return bad;
}

}  // namespace

std::string schedule_ranges(const KernelArrays& a, int64_t s0, int64_t s1) {
  const PatternView& p = a.view;
  const int64_t W = p.num_windows, B = p.num_blocks, C = a.window_cols_len, S = p.num_items;
  auto clamp = [](int64_t x) { return int32_t(std::min<int64_t>(x, INT32_MAX)); };
  const int32_t lo[kScheduleFields] = {0, 0, 0, 0, 0, 0, 0, 1};
  const int32_t hi[kScheduleFields] = {clamp(W - 1), clamp(B), clamp(B),     kSplitBlocks,
                                       clamp(C),     clamp(C), clamp(S - 1), clamp(S)};
  const int64_t i = loops().first_bad_item(p.schedule, s0, s1, lo, hi);
  if (i < 0) return {};
  const char* what[kScheduleFields] = {"a window index (W = ",
                                       "a block index (B = ",
                                       "a block index (B = ",
                                       "0 (a whole window) or a piece size (at most ",
                                       "a condensed column index (C = ",
                                       "a condensed column index (C = ",
                                       "an item index (S = ",
                                       "a piece count (S = "};
  const int64_t count[kScheduleFields] = {W, B, B, kSplitBlocks, C, C, S, S};
  const int32_t* it = p.schedule + i * kScheduleFields;
  int f = 0;
  while (f + 1 < kScheduleFields && it[f] >= lo[f] && it[f] <= hi[f]) ++f;
  return item_error(p.schedule, i, f,
                    cat("in [", lo[f], ", ", hi[f], "]: ", what[f], count[f], ")"));
}

std::string schedule_items(const KernelArrays& a, int64_t s0, int64_t s1) {
  const PatternView& p = a.view;
  const int64_t i = first_failing(s0, s1, [&](int64_t i) { return item_bad(p, i); });
  if (i < 0) return {};
  // Item i fails: which of its tests, in order.
  const int64_t W = p.num_windows, S = p.num_items;
  const int32_t* wcp = p.window_col_ptr;
  const int32_t* wbp = p.window_block_ptr;
  const int32_t* sched = p.schedule;
  const int32_t* it = sched + i * kScheduleFields;
  const int64_t w = it[kWindow];
  if (w < 0 || w >= W) return item_error(sched, i, kWindow, cat("a window in [0, ", W, ")"));
  const int64_t wb = wbp[w], we = wbp[w + 1], nb = we - wb;
  const int64_t split = it[kSplit], first = it[kFirst], pieces = it[kPieces];
  if (split < 0 || split > kSplitBlocks)
    return item_error(sched, i, kSplit,
                      cat("0 (a whole window) or a piece size in [1, ", kSplitBlocks, "]"));
  const int64_t want_pieces = split == 0 ? 1 : std::max<int64_t>(1, (nb + split - 1) / split);
  if (pieces != want_pieces)
    return item_error(sched, i, kPieces,
                      split == 0 ? std::string("1 (split = 0: a whole window)")
                                 : cat("ceil(", nb, " / ", split, ") = ", want_pieces, " (window ",
                                       w, " has ", nb, " blocks)"));
  if (split > 0 && pieces < 2)
    return item_error(sched, i, kSplit,
                      cat("0: window ", w, "'s ", nb, " blocks make one piece of ", split));
  if (split == 0 && nb > kSplitBlocks)
    return item_error(sched, i, kSplit,
                      cat("a piece size: window ", w, " has ", nb, " blocks, more than ",
                          kSplitBlocks, " for one item"));
  if (first < 0 || first > i || i - first >= pieces)
    return item_error(sched, i, kFirst,
                      cat("the item of the window's first piece: one of ", i - pieces + 1, " .. ",
                          i, " (pieces = ", pieces, ")"));
  const int64_t piece = i - first;
  const int64_t begin = split == 0 ? wb : wb + piece * split;
  const int64_t end = split == 0 ? we : std::min(begin + split, we);
  if (it[kBegin] != begin)
    return item_error(sched, i, kBegin,
                      cat(begin, " (piece ", piece, " of window ", w, ", whose blocks are ", wb,
                          " .. ", we - 1, ")"));
  if (it[kEnd] != end)
    return item_error(sched, i, kEnd,
                      cat(end, " (piece ", piece, " of window ", w, ", whose blocks are ", wb,
                          " .. ", we - 1, ")"));
  const int64_t col_begin = int64_t(wcp[w]) + kBlockCols * (begin - wb);
  if (it[kColBegin] != col_begin)
    return item_error(sched, i, kColBegin,
                      cat(col_begin, " (window_col_ptr[", w, "] + 8 * (block_begin - ",
                          "window_block_ptr[", w, "]))"));
  if (it[kColEnd] != wcp[w + 1])
    return item_error(sched, i, kColEnd, cat(wcp[w + 1], " (window_col_ptr[", w + 1, "])"));
  const int32_t* prev = it - kScheduleFields;
  const int32_t* next = it + kScheduleFields;
  if (piece > 0 && (prev[kWindow] != w || prev[kFirst] != first))
    return cat("schedule[", i, "] = ", item_string(it, kScheduleFields), " is piece ", piece,
               " of window ", w, " but schedule[", i - 1,
               "] = ", item_string(prev, kScheduleFields),
               " is not its piece before (a window's pieces are consecutive items)");
  if (piece + 1 < pieces && (i + 1 >= S || next[kWindow] != w || next[kFirst] != first))
    return cat("schedule[", i, "] = ", item_string(it, kScheduleFields), " is piece ", piece,
               " of ", pieces, " of window ", w, " but schedule[", i + 1, "] ",
               i + 1 >= S ? std::string("does not exist")
                          : cat("= ", item_string(it + kScheduleFields, kScheduleFields),
                                " is not its next piece"),
               " (a window's pieces are consecutive items)");
  // Split items are the schedule's prefix (kernels use their indices as workspace slots).
  return cat("schedule[", i + 1, "] = ", item_string(next, kScheduleFields),
             " is a piece of a split window after the whole-window item schedule[", i,
             "] (split items are the schedule's prefix)");
}

std::string schedule_cover(const KernelArrays& a) {
  const PatternView& p = a.view;
  const int64_t W = p.num_windows, S = p.num_items;
  std::vector<int64_t> first_item(W, -1);
  for (int64_t i = 0; i < S; ++i) {
    const int32_t* it = p.schedule + i * kScheduleFields;
    if (it[6] != i) continue;  // not a window's first piece
    if (first_item[it[0]] >= 0)
      return cat("schedule[", i, "] = ", item_string(it, kScheduleFields), " schedules window ",
                 it[0], " again (schedule[", first_item[it[0]],
                 "] did): every window is scheduled exactly once");
    first_item[it[0]] = i;
  }
  for (int64_t w = 0; w < W; ++w)
    if (first_item[w] < 0)
      return cat("window ", w, " has no schedule item (every window needs one, empty ones too)");
  return {};
}

}  // namespace check

namespace {

// The row view against rows/cols (already checked against the format): row_entries in CSR order,
// row_schedule covering each row once.
std::string check_row_view(const RowArrays& rv, const int32_t* rows, const int32_t* cols,
                           int64_t nnz, int64_t m) {
  const int32_t* e = rv.entries;
  // Entries as (row, column) keys, in CSR order: increasing. One pass with the key carried
  // from entry to entry, which also counts the rows' entries; a failing entry is searched for in
  // a second, that writes the message.
  std::vector<int64_t> row_ptr(m + 1, 0);
  const auto scan = [&](bool stop) -> int64_t {
    int64_t prev = -1;
    bool any = false;
    for (int64_t k = 0; k < nnz; ++k) {
      const int64_t pos = e[2 * k + 1], at = uint64_t(pos) < uint64_t(nnz) ? pos : 0;
      const int64_t row = rows[at], key = (row << 32) + e[2 * k];
      any |= (at != pos) | (e[2 * k] != cols[at]) | (key <= prev);
      if (stop && any) return k;
      if (!stop) ++row_ptr[row + 1];
      prev = key;
    }
    return any ? 0 : -1;
  };
  const int64_t bad = scan(false) < 0 ? -1 : scan(true);
  if (bad >= 0) {
    const int64_t k = bad, c = e[2 * k], pos = e[2 * k + 1];
    if (pos < 0 || pos >= nnz)
      return cat("row_entries[", k, "] = (", c, ", ", pos, "): position ", pos,
                 " is not a value index (nnz = ", nnz, ")");
    if (c != cols[pos])
      return cat("row_entries[", k, "] = (", c, ", ", pos, "): column ", c, " but cols[", pos,
                 "] = ", cols[pos]);
    const int64_t prev = e[2 * k - 1];
    return cat("row_entries[", k, "] = (", c, ", ", pos, ") is entry (", rows[pos], ", ", c,
               "), which does not follow row_entries[", k - 1, "]'s (", rows[prev], ", ",
               e[2 * k - 2], ") in CSR order (rows ascending, columns ascending inside a row)");
  }
  for (int64_t r = 0; r < m; ++r) row_ptr[r + 1] += row_ptr[r];

  // Items: slotted CTA items (slot >= 0), single CTA items (CTA_ROW, longest first), whole rows
  // (WHOLE_ROW), empty rows, in this order; a row's items are consecutive and cover its entries
  // in order; rows cut into several items are numbered 0, 1, ... in order.
  constexpr int64_t kWhole = -1, kCta = -2;
  const int32_t* s = rv.schedule;
  const int64_t R = rv.schedule_rows;
  std::vector<uint8_t> seen(m, 0);
  int64_t cur_row = -1, cur_end = 0, cur_items = 0, cur_slot = 0, next_slot = 0;
  int64_t phase = 0, last_cta_len = std::numeric_limits<int64_t>::max(), rows_seen = 0;
  auto here = [&](int64_t j) { return cat("row_schedule[", j, "] = ", item_string(s + 4 * j, 4)); };
  auto finish_row = [&](int64_t j) -> std::string {  // the row before item j
    if (cur_row < 0) return {};
    if (cur_end != row_ptr[cur_row + 1])
      return cat(here(j - 1), ": row ", cur_row, "'s items end at entry ", cur_end,
                 " before its last (its entries are ", row_ptr[cur_row], " .. ",
                 row_ptr[cur_row + 1] - 1, ")");
    if (cur_items == 1 && cur_slot >= 0)
      return cat(here(j - 1), ": slot ", cur_slot, " (>= 0) for a row of one item; expected ",
                 kWhole, " or ", kCta);
    return {};
  };
  for (int64_t j = 0; j < R; ++j) {
    const int64_t row = s[4 * j], b = s[4 * j + 1], e_ = s[4 * j + 2], slot = s[4 * j + 3];
    if (row < 0 || row >= m)
      return cat(here(j), ": row ", row, " is not a row index (m = ", m, ")");
    const int64_t r0 = row_ptr[row], r1 = row_ptr[row + 1];
    if (!(r0 <= b && b <= e_ && e_ <= r1))
      return cat(here(j), ": entries [", b, ", ", e_, ") are not inside row ", row, "'s [", r0,
                 ", ", r1, ")");
    if (slot < kCta) return cat(here(j), ": slot ", slot, "; expected >= ", kCta);
    const bool continues = row == cur_row && b == cur_end && cur_end < r1;
    if (continues) {
      if (slot != cur_slot || slot < 0)
        return cat(here(j), ": row ", row, " is cut into several items, which must share a slot ",
                   ">= 0 (the item before has slot ", cur_slot, ")");
    } else {
      if (auto err = finish_row(j); !err.empty()) return err;
      if (b != r0)
        return cat(here(j), ": row ", row, "'s first item begins at entry ", b, "; expected ", r0);
      if (seen[row])
        return cat(here(j), ": row ", row,
                   " is scheduled again (every row is scheduled exactly once)");
      seen[row] = 1, ++rows_seen;
      if (slot >= 0 && slot != next_slot)
        return cat(here(j), ": slot ", slot, "; expected ", next_slot,
                   " (rows cut into several items are numbered in order)");
      if (slot >= 0) ++next_slot;
      if (r0 == r1 && slot != kWhole)
        return cat(here(j), ": slot ", slot, " for empty row ", row, "; expected ", kWhole);
      cur_row = row, cur_items = 0;
    }
    if (b == e_ && r0 != r1)
      return cat(here(j), ": an empty item of row ", row, ", which has ", r1 - r0, " entries");
    cur_end = e_, cur_slot = slot, ++cur_items;
    const int64_t item_phase = slot >= 0 ? 0 : slot == kCta ? 1 : b < e_ ? 2 : 3;
    if (item_phase < phase)
      return cat(here(j), " comes too late: row items come in the order rows cut into several ",
                 "items (slot >= 0), single CTA items (slot ", kCta, "), whole rows (slot ", kWhole,
                 "), empty rows");
    phase = item_phase;
    if (slot == kCta) {
      if (e_ - b > last_cta_len)
        return cat(here(j), ": a CTA item of ", e_ - b, " entries after one of ", last_cta_len,
                   " (CTA items come longest first)");
      last_cta_len = e_ - b;
    }
  }
  if (auto err = finish_row(R); !err.empty()) return err;
  if (rows_seen != m)
    for (int64_t r = 0; r < m; ++r)
      if (!seen[r]) return cat("row ", r, " has no row_schedule item (empty rows need one too)");
  return {};
}

}  // namespace

std::string check_pattern(const KernelArrays& a, const int32_t* rows, int64_t rows_len,
                          const int32_t* cols, int64_t cols_len, const RowArrays& rv, int64_t m,
                          int64_t n) {
  if (m < 0 || n < 0) return cat("the shape (", m, ", ", n, ") must be non-negative");
  const int64_t nnz = rows_len;
  if (cols_len != nnz)
    return cat("cols has ", cols_len, " entries and rows ", rows_len, "; expected one per value");
  if (rv.entries_rows != nnz || rv.entries_cols != 2)
    return cat("row_entries has shape [", rv.entries_rows, ", ", rv.entries_cols,
               "]; expected [nnz, 2] = [", nnz, ", 2]");
  if (rv.schedule_cols != 4)
    return cat("row_schedule has shape [", rv.schedule_rows, ", ", rv.schedule_cols,
               "]; expected [R, 4]");
  PatternLimits lim;
  lim.m = m, lim.n = n, lim.nnz = nnz, lim.strict = true, lim.rows = rows, lim.cols = cols;
  if (auto err = check::sizes(a, lim); !err.empty()) return err;
  if (auto err = check::starts(a); !err.empty()) return err;
  if (auto err = check::windows(a, lim, 0, a.view.num_windows); !err.empty()) return err;
  if (auto err = check::schedule_ranges(a, 0, a.view.num_items); !err.empty()) return err;
  if (auto err = check::schedule_items(a, 0, a.view.num_items); !err.empty()) return err;
  if (auto err = check::schedule_cover(a); !err.empty()) return err;
  return check_row_view(rv, rows, cols, nnz, m);
}

std::string check_transpose(const int32_t* rows, int64_t rows_len, const int32_t* cols,
                            int64_t cols_len, const int32_t* rows_t, int64_t rows_t_len,
                            const int32_t* cols_t, int64_t cols_t_len, const int32_t* perm_t,
                            int64_t perm_t_len, const int32_t* perm_t_inv, int64_t perm_t_inv_len) {
  const int64_t nnz = rows_len;
  const std::pair<const char*, int64_t> lens[] = {{"cols", cols_len},
                                                  {"rows_t", rows_t_len},
                                                  {"cols_t", cols_t_len},
                                                  {"perm_t", perm_t_len},
                                                  {"perm_t_inv", perm_t_inv_len}};
  for (const auto& [name, len] : lens)
    if (len != nnz)
      return cat(name, " has ", len, " entries; expected nnz = ", nnz, " (the length of rows)");
  // perm_t_inv[perm_t[j]] == j for every j makes perm_t one-to-one, hence a permutation, and
  // perm_t_inv its inverse. A's entries are read in A^T's order, at random: they are prefetched a
  // few dozen j ahead, so that many misses are in flight.
  constexpr int64_t kAhead = 32;
  const auto bad = [&](int64_t j) {
    const int64_t i = perm_t[j], at = uint64_t(i) < uint64_t(nnz) ? i : 0;
    return (at != i) | (perm_t_inv[at] != j) | (rows_t[j] != cols[at]) | (cols_t[j] != rows[at]);
  };
  int64_t j = -1;
  for (int64_t j0 = 0; j0 < nnz && j < 0; j0 += kRun) {
    const int64_t j1 = std::min(nnz, j0 + kRun);
    bool any = false;
    for (int64_t k = j0; k < j1; ++k) {
      const int64_t ahead = perm_t[std::min(k + kAhead, nnz - 1)];
      if (uint64_t(ahead) < uint64_t(nnz)) {
        __builtin_prefetch(perm_t_inv + ahead);
        __builtin_prefetch(rows + ahead);
        __builtin_prefetch(cols + ahead);
      }
      any |= bad(k);
    }
    if (any) j = first_failing(j0, j1, bad);
  }
  if (j < 0) return {};
  const int64_t i = perm_t[j];
  if (i < 0 || i >= nnz)
    return cat("perm_t[", j, "] = ", i, " is not a value index (nnz = ", nnz, ")");
  if (perm_t_inv[i] != j)
    return cat("perm_t[", j, "] = ", i, " but perm_t_inv[", i, "] = ", perm_t_inv[i], "; expected ",
               j, " (perm_t and perm_t_inv are inverse permutations)");
  if (rows_t[j] != cols[i])
    return cat("rows_t[", j, "] = ", rows_t[j], "; expected cols[perm_t[", j, "]] = cols[", i,
               "] = ", cols[i], " (A^T's value ", j, " is A's value ", i, " transposed)");
  return cat("cols_t[", j, "] = ", cols_t[j], "; expected rows[perm_t[", j, "]] = rows[", i,
             "] = ", rows[i], " (A^T's value ", j, " is A's value ", i, " transposed)");
}

// -- KernelGuard -------------------------------------------------------------------------------

ffi::Error KernelGuard::fail(const std::string& what) const {
  return ffi::Error::InvalidArgument(std::string(target_) + ": invalid sparsity pattern: " + what);
}

ffi::Error KernelGuard::prologue() {
  std::string err = check::sizes(a_, lim_);
  if (err.empty()) err = check::starts(a_);
  return err.empty() ? ffi::Error::Success() : fail(err);
}

bool KernelGuard::windows(int64_t w0, int64_t w1) {
  if (w0 >= w1) return true;
  covered_.fetch_add(w1 - w0, std::memory_order_relaxed);
  // The chunk's share of the schedule: chunks that partition the windows partition the items.
  const int64_t W = a_.view.num_windows, S = a_.view.num_items;
  if (check::windows(a_, lim_, w0, w1).empty() &&
      check::schedule_ranges(a_, S * w0 / W, S * w1 / W).empty())
    return true;
  failed_.store(true, std::memory_order_relaxed);
  return false;
}

ffi::Error KernelGuard::status() {
  const int64_t W = a_.view.num_windows;
  if (!failed_.load() && covered_.load() == std::max<int64_t>(W, 0)) return ffi::Error::Success();
  // The first broken invariant, in order: a chunk's first failure depends on the chunking. (A
  // fan-out that missed or repeated windows followed window_block_ptr / block_value_ptr entries
  // that are not nondecreasing.)
  std::string err = check::windows(a_, lim_, 0, W);
  if (err.empty()) err = check::schedule_ranges(a_, 0, a_.view.num_items);
  if (err.empty())
    err =
        "the windows' first values (block_value_ptr[window_block_ptr[w]]) "
        "are not nondecreasing";
  return fail(err);
}

ffi::Error KernelGuard::all(ffi::ThreadPool& pool) {
  if (auto err = prologue(); err.failure()) return err;
  // The checks stream the arrays at tens of GB/s: below ~4 MB (~100 us) waking the pool's
  // threads gains little (cpu/parallel.h).
  const PatternView& p = a_.view;
  const int64_t W = p.num_windows;
  const int64_t bytes = 4 * a_.window_cols_len + 12 * p.num_blocks + 8 * W + 32 * p.num_items;
  const int64_t threads = bytes < (int64_t(4) << 20) ? 1 : std::max<int64_t>(1, pool.num_threads());
  const int64_t chunks = std::min<int64_t>(std::max<int64_t>(W, 1), 4 * threads);
  cpu::parallel_chunks(pool, threads, chunks,
                       [&](int64_t c) { windows(W * c / chunks, W * (c + 1) / chunks); });
  return status();
}

}  // namespace jaxsparse_tc
