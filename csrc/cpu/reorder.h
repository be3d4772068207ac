// Locality reordering of a graph's nodes for the window format (docs/FORMAT.md, docs/REORDER.md):
// a permutation that puts rows sharing columns into the same 8-row window, so that windows have
// fewer condensed columns and 8x8 blocks hold more nonzeros. And the block statistics of a
// pattern under a permutation, computed without building the format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nanobind {
class module_;
}

namespace jaxsparse_tc {

enum class ReorderMethod {
  kIdentity,  // 0 .. n-1
  kDegree,    // degree bucketing: buckets of floor(log2(degree)), heaviest first, stable inside
  kRcm,       // reverse Cuthill-McKee, component by component
  kRabbit,    // community dendrogram (incremental modularity aggregation), depth-first order
  kAffinity,  // kRabbit, then rows packed into windows by shared columns (data affinity)
};

// Parses "identity", "degree", "rcm", "rabbit", "affinity"; throws std::invalid_argument.
ReorderMethod parse_reorder_method(const std::string& name);

struct ReorderResult {
  std::vector<int64_t> perm;  // perm[new] = old
  int64_t groups = 0;         // top-level communities (rabbit, affinity) or components (rcm)
  double graph_s = 0;         // building the symmetric graph
  double order_s = 0;         // the ordering proper (dendrogram + DFS, BFS, bucketing)
  double pack_s = 0;          // window packing (affinity)
};

// A permutation of the n nodes of the graph of the COO entries (rows[k], cols[k]), all in
// [0, n): the graph is symmetrized, deduplicated and stripped of self-loops first. Deterministic
// for a seed (and independent of `threads`, which is 1 or 2). `lookahead`: how many unplaced
// rows of the community order the affinity packing considers for a window (0: 256).
ReorderResult reorder_graph(const int64_t* rows, const int64_t* cols, int64_t count, int64_t n,
                            ReorderMethod method, uint64_t seed, int threads, int lookahead = 0);

struct BlockStats {
  int64_t windows = 0;                  // ceil(m / 8)
  int64_t nonempty_windows = 0;         // windows with a nonzero
  int64_t condensed_cols = 0;           // sum over windows of distinct columns
  int64_t blocks = 0;                   // 8x8 blocks (sum of ceil(columns / 8))
  int64_t nnz = 0;                      // distinct entries
  std::vector<int64_t> block_nnz_hist;  // [65]: blocks with k nonzeros
};

// The block statistics of the m x n pattern (rows[k], cols[k]) (duplicates count once) after
// moving row r to row_new[r] and column c to col_new[c] (nullptr: identity).
BlockStats block_stats(const int64_t* rows, const int64_t* cols, int64_t count, int64_t m,
                       int64_t n, const int64_t* row_new, const int64_t* col_new, int threads);

// Adds reorder() and block_stats() to the CPU extension (reorder_bindings.cc; called from
// module.cc).
void register_reorder(nanobind::module_& m);

}  // namespace jaxsparse_tc
