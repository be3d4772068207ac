#include "cpu/sampler.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>

#include "common/format.h"
#include "cpu/parallel.h"

namespace jaxsparse_tc {
namespace {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The random stream of one (seed, layer, node): draw k is a hash of (stream key, k), so no
// state is shared between nodes.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t layer, uint64_t node)
      : key_(splitmix64(splitmix64(splitmix64(seed) ^ layer) ^ node)) {}
  uint64_t next() { return splitmix64(key_ + 0x9E3779B97F4A7C15ull * ++count_); }
  // Uniform in [0, d) (d < 2^32: the multiply-shift's bias, d / 2^64, is far below sampling noise).
  int64_t below(int64_t d) {
    return int64_t((static_cast<unsigned __int128>(next()) * uint64_t(d)) >> 64);
  }
  // Uniform in (0, 1).
  double open01() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }

 private:
  uint64_t key_;
  uint64_t count_ = 0;
};

// Runs tasks on threads of their own, joined when it goes out of scope: the pool that
// parallel_chunks needs outside XLA's handlers.
class ThreadSpawner {
 public:
  template <typename Task>
  void Schedule(Task&& task) {
    threads_.emplace_back(std::forward<Task>(task));
  }
  ~ThreadSpawner() {
    for (auto& t : threads_) t.join();
  }

 private:
  std::vector<std::thread> threads_;
};

// Runs fn(begin, end) over chunks of [0, total) on up to `threads` threads.
template <typename Fn>
void parallel_range(int threads, int64_t total, int64_t grain, const Fn& fn) {
  const int64_t chunks =
      std::clamp<int64_t>(total / std::max<int64_t>(grain, 1), 1, cpu::kChunksPerThread * threads);
  ThreadSpawner pool;
  cpu::parallel_chunks(pool, threads, chunks, [&](int64_t c) {
    const int64_t b = total * c / chunks, e = total * (c + 1) / chunks;
    if (b < e) fn(b, e);
  });
}

// Global node id -> local index, open addressing with linear probing: the relabelling of a
// layer's sources is one lookup per sampled edge, where std::unordered_map's node allocations
// and pointer chasing dominated the sampling time.
class LocalIndex {
 public:
  explicit LocalIndex(int64_t capacity) {
    size_t size = 16;
    while (size < size_t(2 * capacity)) size <<= 1;
    mask_ = size - 1;
    keys_.assign(size, -1);
    values_.resize(size);
  }
  // The local index of `key`, or `value` (stored) when it is new; `added` tells which.
  int32_t emplace(int64_t key, int32_t value, bool& added) {
    size_t h = size_t(splitmix64(uint64_t(key))) & mask_;
    while (true) {
      if (keys_[h] == key) {
        added = false;
        return values_[h];
      }
      if (keys_[h] < 0) {
        keys_[h] = key;
        values_[h] = value;
        added = true;
        return value;
      }
      h = (h + 1) & mask_;
    }
  }

 private:
  size_t mask_ = 0;
  std::vector<int64_t> keys_;
  std::vector<int32_t> values_;
};

struct Scratch {
  std::vector<int64_t> picks;
  std::vector<std::pair<double, int64_t>> keyed;
  std::vector<double> cumulative;
  std::unordered_set<int64_t> seen;
};

// How many edges target v takes.
int64_t take_count(const int64_t* indptr, int64_t v, int64_t fanout, const SampleOptions& o) {
  const int64_t begin = indptr[v], deg = indptr[v + 1] - begin;
  if (fanout < 0) return deg;
  if (!o.weights) return o.replace ? (deg > 0 ? fanout : 0) : std::min(deg, fanout);
  int64_t positive = 0;
  for (int64_t j = begin; j < begin + deg; ++j) positive += o.weights[j] > 0;
  return o.replace ? (positive > 0 ? fanout : 0) : std::min(positive, fanout);
}

// Writes the `count` (take_count) sampled CSR positions of target v to out, ascending.
void sample_row(const int64_t* indptr, int64_t v, int64_t fanout, int64_t count, Stream& rng,
                const SampleOptions& o, Scratch& s, int64_t* out) {
  const int64_t begin = indptr[v], deg = indptr[v + 1] - begin;
  if (count == 0) return;
  const double* w = o.weights ? o.weights + begin : nullptr;
  if (fanout < 0 || (!o.replace && count == deg)) {
    for (int64_t j = 0; j < deg; ++j) out[j] = begin + j;
    return;
  }
  if (!w && o.replace) {
    for (int64_t k = 0; k < count; ++k) out[k] = begin + rng.below(deg);
  } else if (!w) {
    // Floyd's algorithm: a uniform subset of `count` positions in count draws.
    s.seen.clear();
    const bool small = count <= 64;
    int64_t k = 0;
    for (int64_t j = deg - count; j < deg; ++j) {
      const int64_t t = rng.below(j + 1);
      bool have;
      if (small)
        have = std::find(out, out + k, begin + t) != out + k;
      else
        have = !s.seen.insert(t).second;
      const int64_t pick = have ? j : t;
      if (have && !small) s.seen.insert(j);
      out[k++] = begin + pick;
    }
  } else if (o.replace) {
    s.cumulative.resize(deg);
    double total = 0;
    int64_t last = 0;
    for (int64_t j = 0; j < deg; ++j) {
      total += w[j];
      s.cumulative[j] = total;
      if (w[j] > 0) last = j;
    }
    for (int64_t k = 0; k < count; ++k) {
      const double x = rng.open01() * total;
      const int64_t j =
          std::upper_bound(s.cumulative.begin(), s.cumulative.end(), x) - s.cumulative.begin();
      out[k] = begin + std::min(j, last);
    }
  } else {
    // Efraimidis-Spirakis: the `count` largest keys log(u) / w are a draw without replacement
    // with probabilities proportional to w.
    s.keyed.clear();
    for (int64_t j = 0; j < deg; ++j)
      if (w[j] > 0)
        s.keyed.emplace_back(std::log(rng.open01()) / w[j], j);
      else
        rng.next();  // every entry consumes one draw: keys do not depend on others' weights
    if (int64_t(s.keyed.size()) > count)
      std::nth_element(s.keyed.begin(), s.keyed.begin() + count, s.keyed.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int64_t k = 0; k < count; ++k) out[k] = begin + s.keyed[k].second;
  }
  std::sort(out, out + count);
}

}  // namespace

std::vector<SampledLayer> sample_neighbors(const int64_t* indptr, const int32_t* indices, int64_t n,
                                           const int64_t* targets, int64_t num_targets,
                                           const std::vector<int64_t>& fanouts, uint64_t seed,
                                           const SampleOptions& options) {
  const int64_t nnz = indptr[n];
  const int threads = std::max(1, options.threads);
  std::vector<SampledLayer> layers(fanouts.size());
  std::vector<int64_t> current(targets, targets + num_targets);
  for (size_t l = 0; l < fanouts.size(); ++l) {
    const int64_t fanout = fanouts[l], T = int64_t(current.size());
    SampledLayer& out = layers[l];
    std::vector<int64_t> offsets(T + 1, 0);
    for (int64_t i = 0; i < T; ++i) {
      const int64_t v = current[i];
      if (v < 0 || v >= n) throw std::invalid_argument("sample_neighbors: target out of range");
      if (indptr[v] < 0 || indptr[v] > indptr[v + 1] || indptr[v + 1] > nnz)
        throw std::invalid_argument("sample_neighbors: indptr is not monotone at node " +
                                    std::to_string(v));
    }
    parallel_range(threads, T, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        offsets[i + 1] = take_count(indptr, current[i], fanout, options);
    });
    for (int64_t i = 0; i < T; ++i) offsets[i + 1] += offsets[i];
    const int64_t E = offsets[T];
    out.edge_ids.resize(E);
    out.rows.resize(E);
    parallel_range(threads, T, 256, [&](int64_t b, int64_t e) {
      Scratch scratch;
      for (int64_t i = b; i < e; ++i) {
        Stream rng(seed, uint64_t(l), uint64_t(current[i]));
        sample_row(indptr, current[i], fanout, offsets[i + 1] - offsets[i], rng, options, scratch,
                   out.edge_ids.data() + offsets[i]);
        std::fill(out.rows.begin() + offsets[i], out.rows.begin() + offsets[i + 1], int32_t(i));
      }
    });
    // Distinct sources in order of first appearance, after the targets.
    LocalIndex local(T + E);
    out.sources = current;
    bool added;
    for (int64_t i = 0; i < T; ++i) local.emplace(current[i], int32_t(i), added);
    out.cols.resize(E);
    for (int64_t k = 0; k < E; ++k) {
      const int64_t src = indices[out.edge_ids[k]];
      const int32_t at = local.emplace(src, int32_t(out.sources.size()), added);
      if (added) {
        if (out.sources.size() >= size_t(INT32_MAX))
          throw std::invalid_argument("sample_neighbors: more than 2^31 - 1 sources in a layer");
        out.sources.push_back(src);
      }
      out.cols[k] = at;
    }
    current = out.sources;
  }
  return layers;
}

namespace {

constexpr int64_t kTile = 8;                // dummy entries fill dense 8x8 tiles
constexpr int64_t kMaxTilesPerWindow = 32;  // nn.batch._MAX_TILES_PER_WINDOW

// Distinct (row, col) pairs among the edges. Sampled layers list each target's edges together
// (rows nondecreasing), so a run of one row is deduplicated on its own; other orders sort.
int64_t distinct_edges(const int32_t* rows, const int32_t* cols, int64_t count) {
  bool grouped = true;
  for (int64_t k = 1; k < count && grouped; ++k) grouped = rows[k] >= rows[k - 1];
  std::vector<int64_t> keys;
  int64_t distinct = 0;
  auto count_sorted = [&](int64_t begin) {
    std::sort(keys.begin() + begin, keys.end());
    distinct += std::unique(keys.begin() + begin, keys.end()) - (keys.begin() + begin);
  };
  if (!grouped) {
    keys.resize(count);
    for (int64_t k = 0; k < count; ++k) keys[k] = (int64_t(rows[k]) << 32) | uint32_t(cols[k]);
    count_sorted(0);
    return distinct;
  }
  for (int64_t k = 0; k < count;) {
    int64_t j = k;
    keys.clear();
    for (; j < count && rows[j] == rows[k]; ++j) keys.push_back(cols[j]);
    count_sorted(0);
    k = j;
  }
  return distinct;
}

// Pads one orientation's arrays to the budget's lengths as padding.pad_pattern does (its last
// window and row are empty, and padded items repeat them).
void pad_orientation(BuiltPattern& p, const BlockBudget& b) {
  const int64_t n = b.num_slots, nnz = p.nnz;
  const int64_t W = int64_t(p.window_block_ptr.size()) - 1;
  const int64_t C = int64_t(p.window_cols.size()), B = int64_t(p.block_bitmap.size()) / 2;
  const int64_t S = int64_t(p.schedule.size()) / kScheduleFields;
  const int64_t R = int64_t(p.row_schedule.size()) / 4;
  if (nnz != b.nnz || C > b.cols || B > b.blocks || S > b.items || R > b.row_items)
    throw std::logic_error("padded_block: internal: the block's format exceeds its budget (nnz " +
                           std::to_string(nnz) + "/" + std::to_string(b.nnz) + ", cols " +
                           std::to_string(C) + "/" + std::to_string(b.cols) + ", blocks " +
                           std::to_string(B) + "/" + std::to_string(b.blocks) + ", items " +
                           std::to_string(S) + "/" + std::to_string(b.items) + ", row items " +
                           std::to_string(R) + "/" + std::to_string(b.row_items) + ")");
  const int64_t e = W - 1;
  if (e < 0 || p.window_block_ptr[e] != p.window_block_ptr[e + 1])
    throw std::logic_error("padded_block: internal: the last window is not empty");
  const int32_t fill_col = int32_t(n - 1), empty_row = int32_t(n - 1);
  const int32_t first_block = p.window_block_ptr[e], first_col = p.window_col_ptr[e];
  p.window_cols.resize(b.cols, fill_col);
  p.block_bitmap.resize(2 * b.blocks, 0u);
  p.block_value_ptr.resize(b.blocks + 1, int32_t(nnz));
  p.schedule.resize(b.items * kScheduleFields);
  for (int64_t i = S; i < b.items; ++i) {
    int32_t* item = p.schedule.data() + i * kScheduleFields;
    const int32_t fill[kScheduleFields] = {int32_t(e), first_block, first_block, 0,
                                           first_col,  first_col,   int32_t(i),  1};
    std::copy(fill, fill + kScheduleFields, item);
  }
  p.row_schedule.reserve(b.row_items * 4);
  for (int64_t i = R; i < b.row_items; ++i) {
    const int32_t fill[4] = {empty_row, int32_t(nnz), int32_t(nnz), kWholeRowSlot};
    p.row_schedule.insert(p.row_schedule.end(), fill, fill + 4);
  }
}

}  // namespace

PaddedBlock padded_block(const int32_t* rows, const int32_t* cols, int64_t count,
                         int64_t num_real_nodes, const BlockBudget& budget, int threads) {
  const int64_t n = budget.num_slots, nnz = budget.nnz;
  if (count > budget.edges || num_real_nodes < 0 || nnz != budget.edges)
    throw std::invalid_argument("padded_block: " + std::to_string(count) + " edges exceed the " +
                                std::to_string(budget.edges) + " edge slots");
  for (int64_t k = 0; k < count; ++k)
    for (const auto& [name, index] : {std::pair{"rows", rows}, std::pair{"cols", cols}})
      if (index[k] < 0 || index[k] >= num_real_nodes)
        throw std::invalid_argument(
            std::string(name) + "[" + std::to_string(k) + "] = " + std::to_string(index[k]) +
            " is outside the layer's [0, " + std::to_string(num_real_nodes) + ") sources");
  const int64_t dummies = nnz - distinct_edges(rows, cols, count);
  // The dummy tiles (nn.batch._dummy_entries without self-loops): tile k at tile row k % span,
  // tile column (k % span + k / span) % span, so the first `span` tiles are diagonal ones.
  const int64_t first = (num_real_nodes + 7) / 8 * 8;
  const int64_t span = (n - 8 - first) / 8;
  if (dummies > 0 && (span < 1 || dummies > span * std::min(span, kMaxTilesPerWindow) * 64))
    throw std::logic_error("padded_block: internal: no room for " + std::to_string(dummies) +
                           " dummy entries in " + std::to_string(std::max<int64_t>(span, 0)) +
                           " padding windows");
  const int64_t total = count + dummies;
  std::vector<int64_t> r(total), c(total);
  for (int64_t k = 0; k < count; ++k) r[k] = rows[k], c[k] = cols[k];
  for (int64_t t = 0; t * 64 < dummies; ++t) {  // one division per tile, not per entry
    const int64_t ti = t % span, tj = (ti + t / span) % span;
    const int64_t row0 = first + 8 * ti, col0 = first + 8 * tj;
    const int64_t base = count + 64 * t, end = std::min<int64_t>(64, dummies - 64 * t);
    for (int64_t loc = 0; loc < end; ++loc) {
      r[base + loc] = row0 + loc % 8;
      c[base + loc] = col0 + loc / 8;
    }
  }
  ScheduleOptions options;
  options.grouped = budget.grouped;
  PaddedBlock out;
  {
    // An exception must not leave a thread: the transposed build's is rethrown after the join,
    // and the join happens whatever the main build throws.
    std::exception_ptr transposed_error, error;
    auto build_transposed = [&] {
      try {
        out.t = build_pattern(c.data(), r.data(), total, n, n, options);
      } catch (...) {
        transposed_error = std::current_exception();
      }
    };
    std::thread transposed;
    if (threads > 1) transposed = std::thread(build_transposed);
    try {
      out.a = build_pattern(r.data(), c.data(), total, n, n, options);
    } catch (...) {
      error = std::current_exception();
    }
    if (threads > 1)
      transposed.join();
    else if (!error)
      build_transposed();
    if (error) std::rethrow_exception(error);
    if (transposed_error) std::rethrow_exception(transposed_error);
  }
  if (out.a.nnz != nnz || out.t.nnz != nnz)
    throw std::logic_error("padded_block: internal: " + std::to_string(out.a.nnz) +
                           " nonzeros, not the budget's " + std::to_string(nnz));
  const auto& to_a = out.a.input_to_format;
  const auto& to_t = out.t.input_to_format;
  out.perm_t.resize(nnz);
  out.perm_t_inv.resize(nnz);
  for (int64_t k = 0; k < total; ++k) {
    out.perm_t[to_t[k]] = int32_t(to_a[k]);
    out.perm_t_inv[to_a[k]] = int32_t(to_t[k]);
  }
  out.values.assign(nnz, 0.0f);
  for (int64_t k = 0; k < count; ++k) out.values[to_a[k]] += 1.0f;
  out.input_to_format.resize(budget.edges);
  for (int64_t k = 0; k < budget.edges; ++k) out.input_to_format[k] = int32_t(to_a[k]);
  // input_to_format is copied out above; the per-orientation copies are not needed any more.
  out.a.input_to_format = {};
  out.t.input_to_format = {};
  pad_orientation(out.a, budget);
  pad_orientation(out.t, budget);
  return out;
}

}  // namespace jaxsparse_tc
