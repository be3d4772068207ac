// Locality reordering for the window format (reorder.h; the method is described in
// docs/REORDER.md). Everything here is deterministic for a seed: ties are broken by a seeded
// hash of the node, and the two threads only ever work on disjoint, fixed slices.
// The extension is built at -O3 (CMakeLists.txt: Release, NOMINSIZE); the pragma keeps these
// loops at -O3 under GCC whatever the build type.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "cpu/reorder.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>

namespace jaxsparse_tc {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// splitmix64's finalizer: the tie-breaking key of a node.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int clamp_threads(int threads, int64_t work) {
  if (work < (int64_t(1) << 15)) return 1;
  return std::max(1, std::min(threads, 2));
}

// fn(t, begin, end) on `threads` contiguous slices of [0, total); slice 0 on this thread. The
// slices depend on `threads` only, so results that combine them in slice order are
// deterministic. An exception in a worker (bad_alloc) is rethrown here.
template <typename Fn>
void parallel_slices(int threads, int64_t total, Fn&& fn) {
  if (threads <= 1) {
    fn(0, int64_t(0), total);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&fn, &errors, t, threads, total] {
      try {
        fn(t, total * t / threads, total * (t + 1) / threads);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  try {
    fn(0, int64_t(0), total / threads);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Node slices of about equal adjacency: boundaries b[0] = 0 <= ... <= b[threads] = n.
std::vector<int64_t> balanced_cuts(const std::vector<int64_t>& ptr, int threads) {
  const int64_t n = int64_t(ptr.size()) - 1;
  std::vector<int64_t> cuts(threads + 1, n);
  cuts[0] = 0;
  for (int t = 1; t < threads; ++t) {
    const int64_t target = ptr[n] * t / threads;
    cuts[t] = std::lower_bound(ptr.begin(), ptr.end(), target) - ptr.begin();
    cuts[t] = std::min(std::max(cuts[t], cuts[t - 1]), n);
  }
  return cuts;
}

// The undirected simple graph of a pattern: CSR with sorted, distinct neighbors, no loops.
struct Graph {
  int64_t n = 0;
  std::vector<int64_t> ptr;
  std::vector<int32_t> adj;
  std::vector<int32_t> deg;  // ptr[v + 1] - ptr[v], at hand (< n < 2^31)
  int64_t degree(int64_t v) const { return deg[v]; }
};

Graph symmetric_graph(const int64_t* rows, const int64_t* cols, int64_t count, int64_t n,
                      int threads) {
  threads = clamp_threads(threads, count);
  Graph g;
  g.n = n;
  // Per-slice degree counts, then per-slice cursors: slice t writes after slices < t.
  std::vector<std::vector<int64_t>> cursor(threads, std::vector<int64_t>(n + 1, 0));
  parallel_slices(threads, count, [&](int t, int64_t b, int64_t e) {
    int64_t* c = cursor[t].data();
    for (int64_t k = b; k < e; ++k) {
      if (rows[k] == cols[k]) continue;
      ++c[rows[k]];
      ++c[cols[k]];
    }
  });
  std::vector<int64_t> ptr(n + 1, 0);
  for (int64_t v = 0; v < n; ++v) {
    int64_t at = ptr[v];
    for (int t = 0; t < threads; ++t) {
      const int64_t d = cursor[t][v];
      cursor[t][v] = at;
      at += d;
    }
    ptr[v + 1] = at;
  }
  std::vector<int32_t> tmp(ptr[n]);
  parallel_slices(threads, count, [&](int t, int64_t b, int64_t e) {
    int64_t* c = cursor[t].data();
    for (int64_t k = b; k < e; ++k) {
      const int64_t r = rows[k], q = cols[k];
      if (r == q) continue;
      tmp[c[r]++] = int32_t(q);
      tmp[c[q]++] = int32_t(r);
    }
  });
  cursor.clear();
  cursor.shrink_to_fit();
  // Sort and deduplicate each row in place; then compact.
  g.deg.assign(n, 0);
  const std::vector<int64_t> cuts = balanced_cuts(ptr, threads);
  parallel_slices(threads, threads, [&](int, int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t)
      for (int64_t v = cuts[t]; v < cuts[t + 1]; ++v) {
        int32_t* b = tmp.data() + ptr[v];
        int32_t* e = tmp.data() + ptr[v + 1];
        std::sort(b, e);
        g.deg[v] = int32_t(std::unique(b, e) - b);
      }
  });
  g.ptr.assign(n + 1, 0);
  for (int64_t v = 0; v < n; ++v) g.ptr[v + 1] = g.ptr[v] + g.deg[v];
  g.adj.resize(g.ptr[n]);
  parallel_slices(threads, threads, [&](int, int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t)
      for (int64_t v = cuts[t]; v < cuts[t + 1]; ++v)
        std::copy(tmp.data() + ptr[v], tmp.data() + ptr[v] + g.deg[v], g.adj.data() + g.ptr[v]);
  });
  return g;
}

// Degree bucketing: nodes grouped by floor(log2(degree)) (degree 0 last), heaviest bucket first,
// the input order kept inside a bucket (what locality the input has survives).
std::vector<int32_t> degree_order(const Graph& g) {
  const int64_t n = g.n;
  auto bucket = [&](int64_t v) {
    const int64_t d = g.degree(v);
    return d == 0 ? 0 : 64 - __builtin_clzll(uint64_t(d));  // 1 + floor(log2 d)
  };
  std::vector<int64_t> start(66, 0);
  for (int64_t v = 0; v < n; ++v) ++start[65 - bucket(v)];
  for (int b = 0; b < 65; ++b) start[b + 1] += start[b];
  std::vector<int32_t> order(n);
  for (int64_t v = 0; v < n; ++v) order[start[64 - bucket(v)]++] = int32_t(v);
  return order;
}

// The seeded tie-breaking key of each node.
std::vector<uint64_t> node_keys(int64_t n, uint64_t seed) {
  std::vector<uint64_t> key(n);
  const uint64_t s = mix64(seed ^ 0x6a09e667f3bcc908ull);
  for (int64_t v = 0; v < n; ++v) key[v] = mix64(s ^ uint64_t(v));
  return key;
}

// (degree, key) order of nodes, the order in which Cuthill-McKee appends neighbors and the
// community pass visits nodes.
struct DegreeKeyLess {
  const Graph& g;
  const std::vector<uint64_t>& key;
  bool operator()(int32_t a, int32_t b) const {
    const int32_t da = g.deg[a], db = g.deg[b];
    return da != db ? da < db : key[a] < key[b];
  }
};

// All nodes by increasing (degree, key): one sort of packed (degree, high key bits, node).
std::vector<int32_t> by_degree(const Graph& g, const std::vector<uint64_t>& key) {
  const int64_t n = g.n;
  struct Item {
    uint64_t k;
    int32_t v;
  };
  std::vector<Item> items(n);
  for (int64_t v = 0; v < n; ++v)
    items[v] = {(uint64_t(uint32_t(g.deg[v])) << 32) | (key[v] >> 32), int32_t(v)};
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.k != b.k ? a.k < b.k : a.v < b.v; });
  std::vector<int32_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = items[i].v;
  return order;
}

// Reverse Cuthill-McKee: per connected component (taken from its lowest (degree, key) node), a
// breadth-first search from a pseudo-peripheral node (up to two more sweeps of the George-Liu
// heuristic), each node's unvisited neighbors appended in increasing (degree, key); the whole
// order reversed.
std::vector<int32_t> rcm_order(const Graph& g, uint64_t seed, int64_t* components) {
  const int64_t n = g.n;
  const std::vector<uint64_t> key = node_keys(n, seed);
  const std::vector<int32_t> starts = by_degree(g, key);
  const DegreeKeyLess lower{g, key};
  std::vector<int32_t> order;
  order.reserve(n);
  std::vector<uint8_t> visited(n, 0);
  std::vector<int32_t> mark(n, -1), queue;
  std::vector<int32_t> next;
  int32_t sweep = 0;
  // A scratch BFS from s: (eccentricity, the lowest node of the last level).
  auto probe = [&](int32_t s) {
    queue.clear();
    queue.push_back(s);
    mark[s] = sweep;
    size_t level_begin = 0;
    int64_t depth = 0;
    for (size_t head = 0; head < queue.size();) {
      const size_t level_end = queue.size();
      level_begin = head;
      for (; head < level_end; ++head) {
        const int32_t u = queue[head];
        for (int64_t p = g.ptr[u]; p < g.ptr[u + 1]; ++p) {
          const int32_t x = g.adj[p];
          if (mark[x] != sweep) {
            mark[x] = sweep;
            queue.push_back(x);
          }
        }
      }
      if (queue.size() > level_end) ++depth;
    }
    int32_t best = queue[level_begin];
    for (size_t i = level_begin; i < queue.size(); ++i)
      if (lower(queue[i], best)) best = queue[i];
    ++sweep;
    return std::make_pair(depth, best);
  };
  int64_t comps = 0;
  for (const int32_t s : starts) {
    if (visited[s]) continue;
    ++comps;
    int32_t start = s;
    if (g.degree(s) > 0) {
      auto [ecc, far] = probe(s);
      for (int it = 0; it < 2; ++it) {
        auto [ecc2, far2] = probe(far);
        if (ecc2 <= ecc) break;
        ecc = ecc2;
        far = far2;
      }
      start = far;
    }
    const size_t first = order.size();
    order.push_back(start);
    visited[start] = 1;
    for (size_t head = first; head < order.size(); ++head) {
      const int32_t u = order[head];
      next.clear();
      for (int64_t p = g.ptr[u]; p < g.ptr[u + 1]; ++p) {
        const int32_t x = g.adj[p];
        if (!visited[x]) {
          visited[x] = 1;
          next.push_back(x);
        }
      }
      std::sort(next.begin(), next.end(), lower);
      order.insert(order.end(), next.begin(), next.end());
    }
  }
  std::reverse(order.begin(), order.end());
  *components = comps;
  return order;
}

// The community dendrogram: roots of the top-level communities in visiting order, each node's
// children (linked newest first) and the isolated nodes.
struct Dendrogram {
  std::vector<int32_t> roots, first_child, next_sibling, isolated;
};

// The community pass, in the spirit of Rabbit order (Arai et al. 2016) and Acc-SpMM's
// dendrogram construction: nodes are visited by increasing (degree, key); a visited node's
// community (the node plus whatever merged into it before) joins the neighboring community
// with the largest modularity gain e_vu - tot_v tot_u / 2m, if positive, and becomes a child of
// that community's root. A node's edges to communities are gathered when it is visited, from
// its own adjacency and the compacted lists its children left (resolved to their current
// communities by a union-find with path halving).
Dendrogram aggregate(const Graph& g, const std::vector<uint64_t>& key) {
  const int64_t n = g.n;
  // An edge weight between two communities counts distinct edges (at most half the symmetric
  // adjacency's entries): uint32 holds it below 2^32 of them.
  if (g.adj.size() / 2 > UINT32_MAX)
    throw std::invalid_argument(
        "reorder: the community orderings (affinity, rabbit) take at most " +
        std::to_string(UINT32_MAX) + " distinct edges (uint32 weights); got " +
        std::to_string(g.adj.size() / 2) + ": use method=\"rcm\" or \"degree\"");
  const std::vector<int32_t> visit = by_degree(g, key);
  const double inv_two_m = 1.0 / double(std::max<size_t>(g.adj.size(), 1));
  struct State {
    int32_t uf;    // union-find parent, -1 at a community root
    uint32_t acc;  // edge weight to the community being visited (0: untouched)
    double tot;    // the community's degree sum (roots)
  };
  std::vector<State> st(n);
  for (int64_t v = 0; v < n; ++v) st[v] = {-1, 0, double(g.deg[v])};
  Dendrogram d;
  d.first_child.assign(n, -1);
  d.next_sibling.assign(n, -1);
  std::vector<uint8_t> visited(n, 0);
  struct Link {
    int32_t to;
    uint32_t w;
  };
  std::vector<Link> links;  // the compacted lists of merged nodes
  std::vector<int64_t> list_begin(n, 0), list_end(n, 0);
  std::vector<int32_t> touched;
  auto find = [&](int32_t x) {
    while (st[x].uf >= 0) {
      const int32_t p = st[x].uf, gp = st[p].uf;
      if (gp < 0) return p;
      st[x].uf = gp;
      x = gp;
    }
    return x;
  };
  for (const int32_t v : visit) {
    visited[v] = 1;
    if (g.deg[v] == 0) {  // nothing can have merged into it either
      d.isolated.push_back(v);
      continue;
    }
    touched.clear();
    auto add = [&](int32_t x, uint32_t w) {
      x = find(x);
      if (x == v) return;
      if (st[x].acc == 0) touched.push_back(x);
      st[x].acc += w;
    };
    for (int64_t p = g.ptr[v]; p < g.ptr[v + 1]; ++p) add(g.adj[p], 1);
    for (int32_t c = d.first_child[v]; c >= 0; c = d.next_sibling[c])
      for (int64_t i = list_begin[c]; i < list_end[c]; ++i) add(links[i].to, links[i].w);
    int32_t best = -1;
    double best_gain = 0.0;
    const double tv = st[v].tot * inv_two_m;
    for (const int32_t x : touched) {
      const double gain = double(st[x].acc) - tv * st[x].tot;
      if (gain > best_gain || (best >= 0 && gain == best_gain && key[x] < key[best])) {
        best = x;
        best_gain = gain;
      }
    }
    if (best >= 0) {
      if (!visited[best]) {  // best gathers its children's lists when visited: leave v's
        list_begin[v] = int64_t(links.size());
        for (const int32_t x : touched)
          if (x != best) links.push_back({x, st[x].acc});
        list_end[v] = int64_t(links.size());
      }
      st[v].uf = best;
      st[best].tot += st[v].tot;
      d.next_sibling[v] = d.first_child[best];
      d.first_child[best] = v;
    } else {
      d.roots.push_back(v);
    }
    for (const int32_t x : touched) st[x].acc = 0;
  }
  return d;
}

// The dendrogram's depth-first pre-order: a node, then its children's subtrees in merge order;
// roots in visiting order, isolated nodes last. Each top-level community is one range;
// `bounds` (if given) receives the ranges' starts and the end of the last one.
std::vector<int32_t> dendrogram_order(const Dendrogram& d, int64_t n,
                                      std::vector<int64_t>* bounds = nullptr) {
  std::vector<int32_t> order;
  order.reserve(n);
  std::vector<int32_t> stack;
  for (const int32_t r : d.roots) {
    if (bounds) bounds->push_back(int64_t(order.size()));
    stack.push_back(r);
    while (!stack.empty()) {
      const int32_t u = stack.back();
      stack.pop_back();
      order.push_back(u);
      // Children are linked newest first: pushed so, they pop oldest first.
      for (int32_t c = d.first_child[u]; c >= 0; c = d.next_sibling[c]) stack.push_back(c);
    }
  }
  if (bounds) bounds->push_back(int64_t(order.size()));
  order.insert(order.end(), d.isolated.begin(), d.isolated.end());
  return order;
}

// The communities of the dendrogram in the same sequence, each walked breadth-first instead
// (Cuthill-McKee inside the community: from its lowest (degree, key) node, unvisited neighbors
// of the community appended in (degree, key) order), so that rows next to each other tend to
// share a neighbor (siblings of one parent), isolated nodes last.
std::vector<int32_t> community_bfs_order(const Graph& g, const Dendrogram& d,
                                         const std::vector<uint64_t>& key) {
  const int64_t n = g.n;
  std::vector<int64_t> bounds;
  const std::vector<int32_t> dfs = dendrogram_order(d, n, &bounds);
  std::vector<int32_t> comm(n, -1);
  for (size_t c = 0; c + 1 < bounds.size(); ++c)
    for (int64_t i = bounds[c]; i < bounds[c + 1]; ++i) comm[dfs[i]] = int32_t(c);
  const DegreeKeyLess lower{g, key};
  std::vector<int32_t> order;
  order.reserve(n);
  std::vector<uint8_t> seen(n, 0);
  std::vector<int32_t> next;
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    int32_t start = dfs[bounds[c]];
    for (int64_t i = bounds[c]; i < bounds[c + 1]; ++i)
      if (lower(dfs[i], start)) start = dfs[i];
    const size_t first = order.size();
    order.push_back(start);
    seen[start] = 1;
    for (size_t h = first; h < order.size(); ++h) {
      const int32_t u = order[h];
      next.clear();
      for (int64_t p = g.ptr[u]; p < g.ptr[u + 1]; ++p) {
        const int32_t x = g.adj[p];
        if (!seen[x] && comm[x] == int32_t(c)) {
          seen[x] = 1;
          next.push_back(x);
        }
      }
      std::sort(next.begin(), next.end(), lower);
      order.insert(order.end(), next.begin(), next.end());
    }
    // A community is connected (every merge follows an edge); this only guards the invariant.
    for (int64_t i = bounds[c]; i < bounds[c + 1]; ++i)
      if (!seen[dfs[i]]) {
        seen[dfs[i]] = 1;
        order.push_back(dfs[i]);
      }
  }
  order.insert(order.end(), d.isolated.begin(), d.isolated.end());
  return order;
}

// Rows with at least this many neighbors are packed among themselves, ahead of the rest: such
// a row spans 8 or more blocks alone, and heavy rows share most of their columns with each other
// (the core of a power-law graph); next to light rows they would bury the light rows' sharing.
constexpr int32_t kHeavyDegree = 64;

// Window packing (the data-affinity step): walks a base order and cuts it into windows of 8.
// A window starts with the first unplaced node; each of its next 7 rows is, among the next
// `lookahead` unplaced nodes of the base order, the one sharing the most columns with the
// window so far, less an eighth per column it adds (ties: fewer new columns, then earlier in
// the base order); if none shares a column, the first unplaced node. Shared columns are counted
// incrementally: an inverted index (column -> candidates' adjacency entries, singly linked, placed
// candidates unlinked lazily) bumps a candidate's score once per column that enters the window.
// Columns of degree 1 are left out (no two rows share them).
template <typename I>
struct IndexNode {
  I next;
  int32_t owner;
};

template <typename I>
void pack_windows(const Graph& g, const int32_t* seq, int64_t len, int64_t heavy_end, int lookahead,
                  int64_t heavy_volume, IndexNode<I>* nodes, int32_t* out) {
  const int64_t n = g.n;
  std::vector<I> head(n, I(-1));
  std::vector<int32_t> stamp(n, -1), score_stamp(n, -1), score(n, 0), pos(n, -1);
  std::vector<uint8_t> placed(n, 0), in_pool(n, 0);
  for (int64_t i = 0; i < len; ++i) pos[seq[i]] = int32_t(i);
  int32_t wid = 0;
  int64_t front = 0, hi = 0, pool = 0, written = 0;
  int64_t volume = 0;  // adjacency of the pool's heavy rows
  std::vector<int32_t> touched;
  auto bump = [&](int32_t c) {
    if (score_stamp[c] != wid) {
      score_stamp[c] = wid;
      score[c] = 0;
      touched.push_back(c);
    }
    ++score[c];
  };
  auto enter = [&](int32_t c) {
    in_pool[c] = 1;
    ++pool;
    if (g.deg[c] >= kHeavyDegree) volume += g.deg[c];
    for (int64_t p = g.ptr[c]; p < g.ptr[c + 1]; ++p) {
      const int32_t x = g.adj[p];
      if (g.deg[x] < 2) continue;
      nodes[p] = {head[x], c};
      head[x] = I(p);
      if (stamp[x] == wid) bump(c);
    }
  };
  auto refill = [&] {
    while (pool < lookahead && hi < len && (hi >= heavy_end || volume < heavy_volume)) {
      const int32_t c = seq[hi++];
      if (!placed[c]) enter(c);
    }
  };
  auto place = [&](int32_t u) {
    placed[u] = 1;
    out[written++] = u;
    if (in_pool[u]) {
      in_pool[u] = 0;
      --pool;
      if (g.deg[u] >= kHeavyDegree) volume -= g.deg[u];
    }
    for (int64_t p = g.ptr[u]; p < g.ptr[u + 1]; ++p) {
      const int32_t x = g.adj[p];
      if (stamp[x] == wid) continue;
      stamp[x] = wid;
      if (g.deg[x] < 2) continue;
      I prev = I(-1);
      for (I q = head[x]; q >= 0;) {
        const IndexNode<I> node = nodes[q];
        if (!in_pool[node.owner]) {  // placed: unlink
          if (prev >= 0)
            nodes[prev].next = node.next;
          else
            head[x] = node.next;
        } else {
          bump(node.owner);
          prev = q;
        }
        q = node.next;
      }
    }
  };
  while (written < len) {
    ++wid;
    touched.clear();
    refill();
    while (placed[seq[front]]) ++front;
    place(seq[front]);
    for (int r = 1; r < 8 && written < len; ++r) {
      refill();
      // The candidate of most shared columns, each new column counting -1/8 (an eighth of a
      // block); ties: fewer new columns, then earlier in the base order.
      int32_t best = -1;
      int64_t best_gain = 0, best_new = 0;
      for (const int32_t c : touched) {
        if (placed[c]) continue;
        const int64_t fresh = g.deg[c] - score[c], gain = 8 * int64_t(score[c]) - fresh;
        if (best < 0 || gain > best_gain ||
            (gain == best_gain &&
             (fresh < best_new || (fresh == best_new && pos[c] < pos[best])))) {
          best = c;
          best_gain = gain;
          best_new = fresh;
        }
      }
      if (best < 0) {
        while (placed[seq[front]]) ++front;
        best = seq[front];
      }
      place(best);
    }
  }
}

// The affinity order: heavy rows (kHeavyDegree) first, by decreasing degree, then the rest in
// the community breadth-first order; packed into windows. Two threads pack two halves of that
// sequence (cut at a window boundary near half its adjacency) independently.
std::vector<int32_t> affinity_pack(const Graph& g, const std::vector<int32_t>& base, int lookahead,
                                   int threads) {
  const int64_t n = g.n, m = int64_t(g.adj.size());
  std::vector<int32_t> seq;
  seq.reserve(n);
  for (const int32_t v : base)
    if (g.deg[v] >= kHeavyDegree) seq.push_back(v);
  std::stable_sort(seq.begin(), seq.end(),
                   [&](int32_t a, int32_t b) { return g.deg[a] > g.deg[b]; });
  const int64_t heavy = int64_t(seq.size());
  const int64_t heavy_volume = int64_t(lookahead) * 2 * kHeavyDegree;
  for (const int32_t v : base)
    if (g.deg[v] < kHeavyDegree) seq.push_back(v);
  // The cut depends on the graph only (not on `threads`): the order is the same either way.
  const int parts = clamp_threads(2, m);
  threads = std::min(threads, parts);
  int64_t cut = n;
  if (parts > 1) {
    int64_t volume = 0;
    cut = 0;
    while (cut < n && 2 * volume < m) volume += g.deg[seq[cut++]];
    cut = std::min(n, (cut + 7) / 8 * 8);
  }
  std::vector<int32_t> out(n);
  auto run = [&](auto* nodes) {
    parallel_slices(threads, parts, [&](int, int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        const int64_t b = t == 0 ? 0 : cut, e = t == 0 ? cut : n;
        if (e > b)
          pack_windows(g, seq.data() + b, e - b, heavy - b, lookahead, heavy_volume, nodes,
                       out.data() + b);
      }
    });
  };
  if (m < (int64_t(1) << 31)) {
    std::vector<IndexNode<int32_t>> nodes(m);
    run(nodes.data());
  } else {
    std::vector<IndexNode<int64_t>> nodes(m);
    run(nodes.data());
  }
  return out;
}

}  // namespace

ReorderMethod parse_reorder_method(const std::string& name) {
  if (name == "identity") return ReorderMethod::kIdentity;
  if (name == "degree") return ReorderMethod::kDegree;
  if (name == "rcm") return ReorderMethod::kRcm;
  if (name == "rabbit") return ReorderMethod::kRabbit;
  if (name == "affinity") return ReorderMethod::kAffinity;
  throw std::invalid_argument("unknown reordering method '" + name +
                              "' (identity, degree, rcm, rabbit, affinity)");
}

ReorderResult reorder_graph(const int64_t* rows, const int64_t* cols, int64_t count, int64_t n,
                            ReorderMethod method, uint64_t seed, int threads, int lookahead) {
  if (n < 0 || n >= (int64_t(1) << 31)) throw std::invalid_argument("reorder: n out of range");
  if (lookahead <= 0) lookahead = 256;
  threads = std::max(1, threads);
  ReorderResult r;
  if (method == ReorderMethod::kIdentity) {
    r.perm.resize(n);
    std::iota(r.perm.begin(), r.perm.end(), int64_t(0));
    return r;
  }
  auto t0 = Clock::now();
  Graph g = symmetric_graph(rows, cols, count, n, threads);
  r.graph_s = seconds_since(t0);
  t0 = Clock::now();
  std::vector<int32_t> order;
  if (method == ReorderMethod::kDegree) {
    order = degree_order(g);
  } else if (method == ReorderMethod::kRcm) {
    order = rcm_order(g, seed, &r.groups);
  } else {
    const std::vector<uint64_t> key = node_keys(n, seed);
    const Dendrogram d = aggregate(g, key);
    r.groups = int64_t(d.roots.size());
    order =
        method == ReorderMethod::kRabbit ? dendrogram_order(d, n) : community_bfs_order(g, d, key);
  }
  r.order_s = seconds_since(t0);
  if (method == ReorderMethod::kAffinity) {
    t0 = Clock::now();
    order = affinity_pack(g, order, lookahead, threads);
    r.pack_s = seconds_since(t0);
  }
  r.perm.assign(order.begin(), order.end());
  return r;
}

BlockStats block_stats(const int64_t* rows, const int64_t* cols, int64_t count, int64_t m,
                       int64_t n, const int64_t* row_new, const int64_t* col_new, int threads) {
  (void)n;
  BlockStats s;
  s.windows = (m + 7) / 8;
  s.block_nnz_hist.assign(65, 0);
  const int64_t W = s.windows;
  threads = clamp_threads(threads, count);
  // Entries bucketed by window (per-slice cursors, as in symmetric_graph), keyed col * 8 + row.
  std::vector<std::vector<int64_t>> cursor(threads, std::vector<int64_t>(W + 1, 0));
  auto row_of = [&](int64_t k) { return row_new ? row_new[rows[k]] : rows[k]; };
  auto col_of = [&](int64_t k) { return col_new ? col_new[cols[k]] : cols[k]; };
  parallel_slices(threads, count, [&](int t, int64_t b, int64_t e) {
    int64_t* c = cursor[t].data();
    for (int64_t k = b; k < e; ++k) ++c[row_of(k) >> 3];
  });
  std::vector<int64_t> start(W + 1, 0);
  for (int64_t w = 0; w < W; ++w) {
    int64_t at = start[w];
    for (int t = 0; t < threads; ++t) {
      const int64_t d = cursor[t][w];
      cursor[t][w] = at;
      at += d;
    }
    start[w + 1] = at;
  }
  std::vector<uint64_t> keys(count);
  parallel_slices(threads, count, [&](int t, int64_t b, int64_t e) {
    int64_t* c = cursor[t].data();
    for (int64_t k = b; k < e; ++k) {
      const int64_t r = row_of(k);
      keys[c[r >> 3]++] = (uint64_t(col_of(k)) << 3) | uint64_t(r & 7);
    }
  });
  cursor.clear();
  const std::vector<int64_t> cuts = balanced_cuts(start, threads);
  std::vector<BlockStats> part(threads);
  parallel_slices(threads, threads, [&](int, int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      BlockStats& p = part[t];
      p.block_nnz_hist.assign(65, 0);
      for (int64_t w = cuts[t]; w < cuts[t + 1]; ++w) {
        uint64_t* b = keys.data() + start[w];
        uint64_t* e = keys.data() + start[w + 1];
        if (b == e) continue;
        std::sort(b, e);
        e = std::unique(b, e);
        ++p.nonempty_windows;
        p.nnz += e - b;
        int64_t cols_here = 0, in_block = 0;
        for (uint64_t* k = b; k < e; ++k) {
          if (k == b || (*k >> 3) != (k[-1] >> 3)) {  // a new condensed column
            if (cols_here % 8 == 0 && cols_here > 0) {
              ++p.block_nnz_hist[in_block];
              in_block = 0;
            }
            ++cols_here;
          }
          ++in_block;
        }
        ++p.block_nnz_hist[in_block];
        p.condensed_cols += cols_here;
        p.blocks += (cols_here + 7) / 8;
      }
    }
  });
  for (const BlockStats& p : part) {
    s.nonempty_windows += p.nonempty_windows;
    s.condensed_cols += p.condensed_cols;
    s.blocks += p.blocks;
    s.nnz += p.nnz;
    for (int k = 0; k <= 64; ++k) s.block_nnz_hist[k] += p.block_nnz_hist[k];
  }
  return s;
}

}  // namespace jaxsparse_tc
