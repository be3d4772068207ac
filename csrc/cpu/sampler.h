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

#include "cpu/pattern_build.h"

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

// The fixed lengths of one padded block (nn.batch.Budget without self-loops; the per-orientation
// lengths are Budget.format_sizes()).
struct BlockBudget {
  int64_t num_slots = 0;  // the matrix is num_slots x num_slots
  int64_t nnz = 0;        // nonzeros: the distinct edges, then zero-valued dummy entries
  int64_t edges = 0;      // edge slots (input order); nnz == edges without self-loops
  int64_t cols = 0, blocks = 0, items = 0, row_items = 0;
  bool grouped = false;  // FormatOptions(grouped=...) of both orientations
};

// One sampled layer as the padded SparseMatrix's host arrays, exactly what nn.batch.padded_matrix
// builds for edge_index [cols; rows] with unit values (in one pass, without Python in between):
// both orientations padded to the budget, values in format order (repeated edges summed),
// perm_t, perm_t_inv and input_to_format of the edge slots.
struct PaddedBlock {
  BuiltPattern a, t;
  std::vector<float> values;                // [nnz]
  std::vector<int32_t> perm_t, perm_t_inv;  // [nnz]
  std::vector<int32_t> input_to_format;     // [edges]
};

// rows (targets) and cols (sources): local indices of `count` edges, below num_real_nodes
// (checked); count <= budget.edges. Dummy entries fill dense 8x8 tiles among the padding node
// slots [ceil8(num_real_nodes), num_slots - 8), as padded_matrix places them. threads > 1 builds
// the two orientations at once.
PaddedBlock padded_block(const int32_t* rows, const int32_t* cols, int64_t count,
                         int64_t num_real_nodes, const BlockBudget& budget, int threads);

}  // namespace jaxsparse_tc
