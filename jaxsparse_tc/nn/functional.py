"""The layers' math as pure functions of arrays, shared by the Flax and Equinox modules.

Every function takes a message-passing matrix `A` (a SparseMatrix with rows = targets, columns
= sources: messages flow edge_index[0] -> edge_index[1], see `jaxsparse_tc.nn.graph`) and node
features `x` [n, f], plus the layer's parameters as arrays. Layers that PyG lets take bipartite
inputs (SAGE, GIN, GAT, GATv2, Transformer) also take `x = (x_src, x_dst)` with A of shape
[n_dst, n_src]; a non-square A with a single x is refused. Weights are stored [in, out]
(`x @ kernel`). `attn_dropout`, where taken, is None (no dropout) or a function applied to the
attention coefficients ([H, nnz], format order).

Only the library's operators touch the graph: `spmm`, `sddmm`, `edge_softmax`,
`sparse_attention`. Gathers by `A.rows` / `A.cols` build per-edge logits from per-node scores.
Operand errors are raised at trace time and say how to build the right operand.

Dtypes: a layer computes in the dtype of its features. The layers that use A's values (GCN,
SAGE, GIN) cast them to the dtype of the features they propagate (`SparseMatrix.astype`, which
refuses concrete values past that dtype's range), so a float16 model runs the 16-bit kernels
with a float32 `gcn_norm` matrix, as PyG computes its normalisation in the features' dtype.
The attention layers build their coefficients from the features and use only A's pattern.

`message_passing(A, x, message=..., aggregate=..., update=..., edge_attr=...)` builds custom
layers from per-edge message functions, on the same kernels where the pattern allows.
"""

from jaxsparse_tc._src.nn.functional import (
  Dropout,
  agnn_conv,
  check_inputs,
  gat_conv,
  gatv2_conv,
  gcn_conv,
  gin_conv,
  heads_from_pyg,
  heads_to_pyg,
  multihead_attention,
  sage_conv,
  transformer_conv,
)
from jaxsparse_tc._src.nn.message_passing import message_passing

__all__ = [
  "gcn_conv",
  "gat_conv",
  "gatv2_conv",
  "agnn_conv",
  "sage_conv",
  "gin_conv",
  "transformer_conv",
  "multihead_attention",
  "heads_to_pyg",
  "heads_from_pyg",
  "check_inputs",
  "Dropout",
  "message_passing",
]
