// Multi-layer neighbour sampling on a CSR graph (rows = targets, neighbours = sources), as
// mini-batch GNN training uses it: each layer's targets draw some of their in-neighbours, whose
// distinct ids (after the targets, which they include as a prefix) are the next layer's targets.
//
// Every draw of target node v in layer l comes from its own random stream, a counter-based hash
// of (seed, l, v): the result depends on the seed only, not on the thread count or the order in
// which threads reach the nodes.
#pragma once
#include <cstdint>
#include <vector>

namespace jaxsparse_tc {

struct SampledLayer {
  std::vector<int64_t> sources;   // distinct global ids; the layer's targets first, in order
  std::vector<int32_t> rows;      // per sampled edge: the target's local index
  std::vector<int32_t> cols;      // per sampled edge: the source's local index
  std::vector<int64_t> edge_ids;  // per sampled edge: its position in the CSR column array
};

struct SampleOptions {
  bool replace = false;             // draws with replacement (fanout draws for any degree > 0)
  const double* weights = nullptr;  // per CSR entry, >= 0: draws proportional to them
  int threads = 1;
};

// indptr [n + 1], indices [nnz] (validated by the caller: monotone, ids in [0, n)); targets
// distinct ids in [0, n); fanouts per layer, each >= 0 or -1 (all neighbours). Without
// replacement a target of degree <= fanout takes all its neighbours (weighted: all those of
// weight > 0); edges of a target come out in CSR order.
std::vector<SampledLayer> sample_neighbors(const int64_t* indptr, const int32_t* indices, int64_t n,
                                           const int64_t* targets, int64_t num_targets,
                                           const std::vector<int64_t>& fanouts, uint64_t seed,
                                           const SampleOptions& options);

}  // namespace jaxsparse_tc
