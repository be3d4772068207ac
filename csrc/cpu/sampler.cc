#include "cpu/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

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
    std::unordered_map<int64_t, int32_t> local;
    local.reserve(size_t(T + E));
    out.sources = current;
    for (int64_t i = 0; i < T; ++i) local.emplace(current[i], int32_t(i));
    out.cols.resize(E);
    for (int64_t k = 0; k < E; ++k) {
      const int64_t src = indices[out.edge_ids[k]];
      auto [it, added] = local.emplace(src, int32_t(out.sources.size()));
      if (added) {
        if (out.sources.size() >= size_t(INT32_MAX))
          throw std::invalid_argument("sample_neighbors: more than 2^31 - 1 sources in a layer");
        out.sources.push_back(src);
      }
      out.cols[k] = it->second;
    }
    current = out.sources;
  }
  return layers;
}

}  // namespace jaxsparse_tc
