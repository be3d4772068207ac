// Fan-out of a handler's windows over XLA's intra-op thread pool (xla::ffi::ThreadPool).
//
// The windows are cut into chunks of about equal work (nonzeros x row width); the calling thread
// and num_threads - 1 pool tasks claim chunks from a shared counter until none is left, and the
// caller returns once every claimed chunk has finished. XLA may run a task late (its pool busy
// with other thunks) or inline: the caller never waits for a task to start, only for chunks in
// progress, and the shared state outlives the call for tasks that start after it. Each window is
// computed whole by one thread, so results do not depend on the thread count or the chunking.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "common/ffi_pattern.h"

namespace jaxsparse_tc {
namespace cpu {

// Work units are about one multiply-add over a row element (some 0.1 ns). Below kInlineWork
// (~100 us) waking the pool's threads (tens of us) gains little or loses; chunks are at least
// kChunkWork, and kChunksPerThread per thread balance uneven windows.
constexpr int64_t kInlineWork = int64_t(1) << 20;
constexpr int64_t kChunkWork = int64_t(1) << 17;
constexpr int64_t kChunksPerThread = 4;

namespace detail {

struct FanOut {
  int64_t chunks = 0;
  std::atomic<int64_t> next{0}, left{0};
  void (*run)(const void* fn, int64_t chunk) = nullptr;
  const void* fn = nullptr;  // valid while left > 0
  std::mutex mu;
  std::condition_variable done;

  void drain() {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      run(fn, c);
      if (left.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mu);
        done.notify_all();
      }
    }
  }
};

}  // namespace detail

// Runs fn(c) for every chunk c in [0, chunks), on the caller and up to threads - 1 pool tasks.
// Pool: anything with Schedule(task) (ffi::ThreadPool in the handlers; host code outside XLA
// passes its own).
template <typename Pool, typename Fn>
void parallel_chunks(Pool& pool, int64_t threads, int64_t chunks, const Fn& fn) {
  if (chunks <= 1 || threads <= 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  auto state = std::make_shared<detail::FanOut>();
  state->chunks = chunks;
  state->left.store(chunks);
  state->fn = &fn;
  state->run = [](const void* f, int64_t c) { (*static_cast<const Fn*>(f))(c); };
  const int64_t helpers = std::min(threads, chunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([state] { state->drain(); });
  state->drain();
  std::unique_lock<std::mutex> lock(state->mu);
  state->done.wait(lock, [&] { return state->left.load() == 0; });
}

// Runs fn(w_begin, w_end) over all windows of p, split by work: per_nnz units per nonzero and
// per_window per window, for `heads` heads each.
template <typename Fn>
void parallel_windows(ffi::ThreadPool& pool, const PatternView& p, int64_t heads, int64_t per_nnz,
                      int64_t per_window, const Fn& fn) {
  const int64_t W = p.num_windows;
  if (W <= 0) return;
  // Work before window w, which is nondecreasing in w.
  auto work_before = [&](int64_t w) {
    return heads * (per_nnz * int64_t(p.block_value_ptr[p.window_block_ptr[w]]) + per_window * w);
  };
  const int64_t total = work_before(W);
  const int64_t threads = total < kInlineWork ? 1 : std::max<int64_t>(1, pool.num_threads());
  const int64_t chunks =
      threads <= 1 ? 1 : std::clamp<int64_t>(total / kChunkWork, 1, kChunksPerThread * threads);
  if (chunks == 1) {
    fn(int64_t(0), W);
    return;
  }
  // Chunk c covers the windows whose work starts in [c, c + 1) * total / chunks.
  auto first_window = [&](int64_t c) {
    if (c >= chunks) return W;
    const int64_t target = int64_t(double(total) * double(c) / double(chunks));
    int64_t lo = 0, hi = W;  // the first w with work_before(w) >= target
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (work_before(mid) < target)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  };
  parallel_chunks(pool, threads, chunks, [&](int64_t c) {
    const int64_t w0 = first_window(c), w1 = first_window(c + 1);
    if (w0 < w1) fn(w0, w1);
  });
}

}  // namespace cpu
}  // namespace jaxsparse_tc
