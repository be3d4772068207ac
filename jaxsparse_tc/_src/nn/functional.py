"""The implementation of jaxsparse_tc.nn.functional, whose docstring documents it."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src.attention import sparse_attention
from jaxsparse_tc._src.checks import OperandError
from jaxsparse_tc._src.edge_softmax import edge_softmax
from jaxsparse_tc._src.nn import graph as graph_lib
from jaxsparse_tc._src.sddmm import sddmm
from jaxsparse_tc._src.sparse_matrix import SparseMatrix
from jaxsparse_tc._src.spmm import spmm

Dropout = Optional[Callable[[jax.Array], jax.Array]]


_BUILD = (
  "build one with jaxsparse_tc.nn.graph.message_passing_matrix(edge_index, num_nodes) "
  "(graph.gcn_norm(edge_index, num_nodes) for GCN; nn.batch.batch_graphs for many "
  "graphs)"
)


def check_inputs(op: str, A, x, *, bipartite: bool = False):
  """Validates (A, x) for layer `op`; returns (x_src, x_dst) as arrays (x_dst is x_src for a
  single x). Raises TypeError / ValueError naming what was passed and how to build A."""
  if not isinstance(A, SparseMatrix):
    if isinstance(x, SparseMatrix):
      raise TypeError(f"{op}: called as layer(x, A); layers take the matrix first: layer(A, x)")
    shape = np.shape(A) if not isinstance(A, (tuple, list)) else None
    if (
      shape is not None
      and len(shape) == 2
      and shape[0] == 2
      and (
        np.issubdtype(np.asarray(A).dtype, np.integer)
        if not isinstance(A, jax.core.Tracer)
        else jnp.issubdtype(A.dtype, jnp.integer)
      )
    ):
      raise TypeError(
        f"{op}: got an edge_index array of shape {shape} where a SparseMatrix "
        f"message-passing matrix is expected; {_BUILD}"
      )
    raise TypeError(
      f"{op}: expected a SparseMatrix message-passing matrix as the first "
      f"argument; got {type(A).__name__}; {_BUILD}"
    )
  m, n = A.shape
  if isinstance(x, (tuple, list)):
    if not bipartite:
      raise TypeError(f"{op} takes node features x [n, f], not a (x_src, x_dst) pair")
    if len(x) != 2:
      raise TypeError(f"{op}: bipartite inputs are a pair (x_src, x_dst); got {len(x)} items")
    x_src = _features(op, "x_src", x[0])
    x_dst = x_src if x[1] is None and m == n else _features(op, "x_dst", x[1])
    if x_src.shape[0] != n or x_dst.shape[0] != m:
      raise ValueError(
        f"{op}: A has shape {A.shape} ([targets, sources]), so x_src must have "
        f"{n} rows and x_dst {m}; got {x_src.shape} and {x_dst.shape}"
      )
    return x_src, x_dst
  x = _features(op, "x", x)
  if m != n:
    hint = (
      f"pass x as a pair (x_src [{n}, f], x_dst [{m}, f])"
      if bipartite
      else f"{op} needs a square matrix"
    )
    raise ValueError(
      f"{op}: A has shape {A.shape} (a bipartite graph: {m} targets, {n} sources); {hint}"
    )
  if x.shape[0] != n:
    raise ValueError(
      f"{op}: A has shape {A.shape}, so x must have {n} rows; got x with shape {x.shape}"
    )
  return x, x


def _in_dtype(A, dtype):
  """A with its values in `dtype`, the features' dtype the layer computes in (spmm would
  otherwise promote float16 features with float32 values to float32)."""
  if A.values.dtype == dtype or not jnp.issubdtype(dtype, jnp.floating):
    return A  # non-float features: spmm names them in its error
  if isinstance(A, SparseMatrix):
    return A.astype(dtype)  # refuses concrete values past dtype's range
  return A.with_values(A.values.astype(dtype))  # a container of matrices (ShardedMatrix)


def _one_value_set(op: str, A) -> None:
  """The layers that weight messages by A's values take one value set: values [H, nnz] would
  give every output a head axis the layer does not expect."""
  if jnp.ndim(A.values) != 1:
    raise ValueError(
      f"{op}: A's values have shape {jnp.shape(A.values)}; a message-passing matrix holds one "
      f"value per entry, [{A.nnz}] (pick one value set: A.with_values(A.values[h]))"
    )


def _check_heads(op: str, name: str, width: int, heads: int) -> None:
  if not isinstance(heads, (int, np.integer)) or isinstance(heads, bool) or heads < 1:
    raise ValueError(f"{op}: heads must be a positive integer; got {heads!r}")
  if width % heads:
    raise ValueError(
      f"{op}: {name} has {width} output features, not a multiple of heads={heads} "
      "(kernels are [in, heads * channels])"
    )


def _check_att(op: str, name: str, att, heads: int, channels: int) -> None:
  if att is not None and jnp.shape(att) != (heads, channels):
    raise ValueError(
      f"{op}: {name} must have shape [heads, channels] = [{heads}, {channels}]; got "
      f"{jnp.shape(att)}"
    )


def _exchanged_features(A, x) -> bool:
  """x is a ShardedMatrix's already exchanged operand (`distributed.exchange`), which the
  SpMM-only layers take as they are."""
  is_exchanged = getattr(A, "is_exchanged", None)
  return (
    is_exchanged is not None
    and not isinstance(x, (tuple, list, SparseMatrix))
    and jnp.ndim(x) == 2
    and is_exchanged(x)
  )


def _features(op: str, name: str, x):
  if isinstance(x, SparseMatrix):
    raise TypeError(
      f"{op}: {name} is a SparseMatrix; node features are a dense [n, f] array "
      f"(layers are called layer(A, x))"
    )
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"{op}: {name} must be a [n, features] array; got shape {x.shape}")
  return x


def _check_self_loops(op: str, A: SparseMatrix) -> None:
  """PyG's attention layers attend over self-loops they add; ours needs them in A's pattern."""
  if A.shape[0] != A.shape[1]:
    raise ValueError(
      f"{op}: add_self_loops=True needs a square matrix; A has shape {A.shape}. "
      "For a bipartite graph pass add_self_loops=False"
    )
  if graph_lib.has_self_loops(A) is False:
    raise ValueError(
      f"{op}: add_self_loops=True (PyG's default) attends over each node's self-loop, but "
      f"A's pattern lacks self-loops. Build A with graph.message_passing_matrix(edge_index, "
      f"n, add_self_loops=True) (or batch with Budget(add_self_loops=True)), or pass "
      f"add_self_loops=False to attend over A's pattern as it is"
    )


class _SelfLoops(NamedTuple):
  """Where an attention layer's self-loops are. entry_mask: A's entries in the softmax (None:
  all); loop_mask: rows attending over a loop outside A's pattern (None: none); pattern_fill:
  the edge-feature fill of the loops inside A's pattern (None: A holds no loops to fill)."""

  entry_mask: object
  loop_mask: object
  pattern_fill: object


def _self_loops(op: str, A, add_self_loops: bool, self_loop_mask, entry_mask, fill_value):
  """An attention layer's _SelfLoops. Without `self_loop_mask`, the loops add_self_loops=True
  attends over must be in A's pattern. With it, they lie outside: the rows where it holds attend
  over their own loop besides their entries (their edge features filled apart,
  _loop_embedding), and A's diagonal entries leave the softmax (PyG's remove_self_loops before
  add_self_loops), so what the pattern holds there does not matter."""
  if self_loop_mask is None:
    if add_self_loops:
      _check_self_loops(op, A)
    return _SelfLoops(entry_mask, None, fill_value if add_self_loops else None)
  if not add_self_loops:
    raise ValueError(
      f"{op}: self_loop_mask names the rows whose self-loops add_self_loops=True attends "
      f"over; got add_self_loops=False (pass self_loop_mask=None)"
    )
  n_dst, n_src = A.shape
  mask = jnp.asarray(self_loop_mask)
  if mask.shape != (n_dst,) or mask.dtype != jnp.bool_:
    raise OperandError(
      f"{op}: self_loop_mask must be bool [{n_dst}] (one per row of A); got {mask.dtype} "
      f"{mask.shape}"
    )
  if n_dst > n_src:
    raise OperandError(
      f"{op}: self_loop_mask attends row i over source i, so A needs at least as many "
      f"columns as rows; A has shape {A.shape}"
    )
  off_diagonal = A.rows != A.cols
  return _SelfLoops(off_diagonal if entry_mask is None else entry_mask & off_diagonal, mask, None)


def _edge_softmax(S: SparseMatrix) -> SparseMatrix:
  return edge_softmax(S)


def _split_heads(h: jax.Array, heads: int) -> jax.Array:
  """[n, H*C] -> [H, n, C]."""
  n = h.shape[0]
  return jnp.transpose(h.reshape(n, heads, -1), (1, 0, 2))


def _merge_heads(out: jax.Array, concat: bool) -> jax.Array:
  """[H, n, C] -> [n, H*C] (concat) or [n, C] (mean over heads)."""
  if concat:
    h, n, c = out.shape
    return jnp.transpose(out, (1, 0, 2)).reshape(n, h * c)
  return jnp.mean(out, axis=0)


def heads_to_pyg(h) -> jax.Array:
  """Heads-first [H, n, d] (this library's head axis) -> PyG's [n, H, d]."""
  h = jnp.asarray(h)
  if h.ndim != 3:
    raise ValueError(f"heads_to_pyg takes [H, n, d]; got shape {h.shape}")
  return jnp.transpose(h, (1, 0, 2))


def heads_from_pyg(h) -> jax.Array:
  """PyG's [n, H, d] -> heads-first [H, n, d] (what spmm/sddmm/sparse_attention take)."""
  h = jnp.asarray(h)
  if h.ndim != 3:
    raise ValueError(f"heads_from_pyg takes [n, H, d]; got shape {h.shape}")
  return jnp.transpose(h, (1, 0, 2))


def _edge_attr(edge_attr, edge_kernel):
  """edge_attr as [E, edge_dim] in the edge kernel's dtype, checked against it."""
  if edge_kernel is None:
    raise ValueError(
      "edge_attr was given but the layer has no edge weights: construct it "
      "with edge_dim=<edge feature width>"
    )
  attr = jnp.asarray(edge_attr)
  if attr.ndim == 1:
    attr = attr[:, None]
  if attr.ndim != 2 or attr.shape[1] != edge_kernel.shape[0]:
    raise ValueError(
      f"edge_attr must have shape [E, {edge_kernel.shape[0]}] (edge_dim); got "
      f"{jnp.shape(edge_attr)}"
    )
  return attr.astype(edge_kernel.dtype)


def _edge_embedding(A, edge_attr, edge_kernel, heads, loop_fill):
  """PyG's lin_edge(edge_attr) on A's pattern: [H, nnz, C] (format order)."""
  e = graph_lib.edge_features(A, _edge_attr(edge_attr, edge_kernel), loop_fill=loop_fill)
  return _split_heads(e @ edge_kernel, heads)  # [H, nnz, C]


def _loop_embedding(A, edge_attr, edge_kernel, heads, fill_value):
  """PyG's lin_edge on each row's self-loop outside A's pattern: [H, n_dst, C]."""
  loops = graph_lib.loop_features(A, _edge_attr(edge_attr, edge_kernel), fill_value)
  return _split_heads(loops @ edge_kernel, heads)


def gcn_conv(A: SparseMatrix, x, kernel, bias=None):
  """GCN (Kipf & Welling): A @ (x @ kernel) + bias, A = D^-1/2 (A+I) D^-1/2 (`graph.gcn_norm`).

  The smaller of the two feature widths is the one propagated (same result, cheaper SpMM); at
  equal widths x is propagated first, so that where x needs no gradient (input features) the
  backward needs no SpMM at all: the gradient of `kernel` is (A x)^T g. With a ShardedMatrix, x
  may be already exchanged (`distributed.exchange(A, x)`, e.g. input features exchanged once
  before training): the layer then exchanges nothing. A's values are cast to the dtype of
  the features propagated (module docstring).
  """
  if not _exchanged_features(A, x):
    x, _ = check_inputs("GCNConv", A, x)
  _one_value_set("GCNConv", A)
  if kernel.shape[0] <= kernel.shape[1]:
    out = spmm(_in_dtype(A, x.dtype), x) @ kernel
  else:
    h = x @ kernel
    out = spmm(_in_dtype(A, h.dtype), h)
  return out if bias is None else out + bias


def gat_conv(
  A: SparseMatrix,
  x,
  kernel,
  att_src,
  att_dst,
  bias=None,
  *,
  heads: int,
  concat: bool = True,
  negative_slope: float = 0.2,
  attn_dropout: Dropout = None,
  add_self_loops: bool = True,
  kernel_dst=None,
  edge_attr=None,
  edge_kernel=None,
  att_edge=None,
  fill_value="mean",
  return_attention_weights: bool = False,
  entry_mask=None,
  self_loop_mask=None,
):
  """GAT (Velickovic et al.), PyG's GATConv: multi-head additive attention over A's edges.

  h = x @ kernel viewed [n, H, C]; e_ij = leaky_relu(<att_dst_h, h_i> + <att_src_h, h_j>
  [+ <att_edge_h, edge_attr_ij @ edge_kernel>]) for each edge j -> i (A[i, j] != 0); alpha =
  row softmax of e; out_i = sum_j alpha_ij h_j, heads concatenated [n, H*C] or averaged
  [n, C]; plus bias. att_src, att_dst: [H, C]. A's values are ignored.

  add_self_loops=True (PyG's default) requires A's pattern to hold every node's self-loop
  (checked where A is concrete) unless `self_loop_mask` (below) puts them outside it; edge
  features of loops are `fill_value` ("mean" of the target's incoming edges, PyG's default).
  Bipartite: x = (x_src, x_dst), A [n_dst, n_src], add_self_loops=False or a `self_loop_mask`;
  `kernel_dst` (PyG's lin_dst) defaults to `kernel`. With `return_attention_weights`, returns
  (out, alpha) with alpha a SparseMatrix on A's pattern holding the coefficients [H, nnz]
  (before dropout; `alpha.values_to_input()` for input order).
  `entry_mask` (bool [nnz], format order; a sampled Block's real entries): entries where it is
  False are padding, left out of the softmax (weight 0, no gradient). `self_loop_mask` (bool
  [n_dst], with add_self_loops=True; a sampled Block's real targets): the self-loops lie outside
  A's pattern, which need not hold them: row i where it holds attends over its entries and its
  own loop to source i (n_dst <= n_src) in one softmax, the loop's edge features `fill_value`;
  A's diagonal entries are left out (PyG removes a graph's own loops before adding them). alpha
  then holds the entries' coefficients only: a row's loop has the rest, 1 - its row's sum.
  """
  x_src, x_dst = check_inputs("GATConv", A, x, bipartite=True)
  _check_heads("GATConv", "kernel", kernel.shape[-1], heads)
  channels = kernel.shape[-1] // heads
  _check_att("GATConv", "att_src", att_src, heads, channels)
  _check_att("GATConv", "att_dst", att_dst, heads, channels)
  if edge_attr is not None:
    _check_att("GATConv", "att_edge", att_edge, heads, channels)
  loops = _self_loops("GATConv", A, add_self_loops, self_loop_mask, entry_mask, fill_value)
  h_src = _split_heads(x_src @ kernel, heads)  # [H, n_src, C]
  h_dst = (
    h_src
    if x_dst is x_src and kernel_dst is None
    else _split_heads(x_dst @ (kernel if kernel_dst is None else kernel_dst), heads)
  )
  a_src = jnp.einsum("hnc,hc->hn", h_src, att_src)  # [H, n_src]
  a_dst = jnp.einsum("hnc,hc->hn", h_dst, att_dst)  # [H, n_dst]
  logits = a_dst[:, A.rows] + a_src[:, A.cols]  # [H, nnz]
  if edge_attr is not None:
    e = _edge_embedding(A, edge_attr, edge_kernel, heads, loops.pattern_fill)
    logits = logits + jnp.einsum("hec,hc->he", e, att_edge)
  logits = jax.nn.leaky_relu(logits, negative_slope)
  loop_logits = None
  if loops.loop_mask is not None:
    loop_logits = a_dst + a_src[:, : A.shape[0]]  # [H, n_dst]: target i, source i
    if edge_attr is not None:
      e_loop = _loop_embedding(A, edge_attr, edge_kernel, heads, fill_value)
      loop_logits = loop_logits + jnp.einsum("hnc,hc->hn", e_loop, att_edge)
    loop_logits = jax.nn.leaky_relu(loop_logits, negative_slope)
  return _attend(
    A, logits, loop_logits, loops, h_src, bias, concat, attn_dropout, return_attention_weights
  )


def _attend(
  A, logits, loop_logits, loops, h_src, bias, concat, attn_dropout, return_attention_weights
):
  """GAT's and GATv2's shared end: row softmax of the per-edge logits [H, nnz] (entries off
  `loops.entry_mask` at -inf: weight 0, and a row of only those 0), dropout on the
  coefficients, messages h_src [H, n_src, C] summed, heads merged, bias; (out, alpha) with
  return_attention_weights. With `loop_logits` [H, n_dst] (the self-loops outside A's pattern,
  of the rows on `loops.loop_mask`), each such row's softmax runs over its entries and its loop
  together, and the loop's message is h_src's row i."""
  entry_mask, loop_mask = loops.entry_mask, loops.loop_mask
  if entry_mask is not None:
    logits = jnp.where(entry_mask, logits, -jnp.inf)
  if loop_logits is None:
    S = _edge_softmax(A.with_values(logits))
    alpha = S
    if attn_dropout is not None:
      S = S.with_values(attn_dropout(S.values))
    out = spmm(S, h_src.astype(S.dtype))
  else:
    weights, loop_weights = _softmax_with_loops(
      A, logits, jnp.where(loop_mask, loop_logits, -jnp.inf)
    )
    alpha = A.with_values(weights)
    if attn_dropout is not None:  # one draw over every coefficient, the loops' included
      dropped = attn_dropout(jnp.concatenate([weights, loop_weights], axis=1))
      weights, loop_weights = dropped[:, : A.nnz], dropped[:, A.nnz :]
    h = h_src.astype(weights.dtype)
    out = spmm(A.with_values(weights), h) + loop_weights[..., None] * h[:, : A.shape[0]]
  out = _merge_heads(out, concat)
  out = out if bias is None else out + bias
  return (out, alpha) if return_attention_weights else out


def _softmax_with_loops(A, logits, loop_logits):
  """The row softmax over A's entries (logits [H, nnz], format order) and each row's self-loop
  (loop_logits [H, n_dst]) together; -inf leaves an entry or a loop out (weight 0, no
  gradient). Returns (entry weights [H, nnz], loop weights [H, n_dst]) in the logits' dtype;
  a row with nothing to attend gets 0. Max-subtracted, in float32 at least (as edge_softmax);
  the row max only shifts, so it carries no gradient."""
  dtype = logits.dtype
  compute = jnp.promote_types(dtype, jnp.float32)
  logits, loop_logits = logits.astype(compute), loop_logits.astype(compute)
  n = A.shape[0]
  row_max = jax.ops.segment_max(logits.T, A.rows, num_segments=n).T  # -inf on empty rows
  top = jnp.maximum(row_max, loop_logits)
  top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0))
  p = jnp.exp(logits - top[:, A.rows])
  q = jnp.exp(loop_logits - top)
  total = jax.ops.segment_sum(p.T, A.rows, num_segments=n).T + q
  total = jnp.where(total > 0, total, 1)
  return (p / total[:, A.rows]).astype(dtype), (q / total).astype(dtype)


def gatv2_conv(
  A: SparseMatrix,
  x,
  kernel_src,
  kernel_dst,
  att,
  bias=None,
  *,
  heads: int,
  bias_src=None,
  bias_dst=None,
  concat: bool = True,
  negative_slope: float = 0.2,
  attn_dropout: Dropout = None,
  add_self_loops: bool = True,
  edge_attr=None,
  edge_kernel=None,
  fill_value="mean",
  return_attention_weights: bool = False,
  entry_mask=None,
  self_loop_mask=None,
):
  """GATv2 (Brody et al.), PyG's GATv2Conv: e_ij = <att_h, leaky_relu(W_dst x_i + W_src x_j
  [+ W_e edge_ij])>, alpha = row softmax, out_i = sum_j alpha_ij (W_src x_j).

  kernel_src/kernel_dst [in, H*C] with biases bias_src/bias_dst (PyG's lin_l / lin_r; pass the
  same arrays for share_weights); att [H, C]. The nonlinearity sits inside the score, so the
  scores are per-edge gathers ([H, nnz, C]) rather than an SDDMM. Self-loops, bipartite
  inputs, edge features, `return_attention_weights`, `entry_mask` and `self_loop_mask` as in
  `gat_conv`.
  """
  x_src, x_dst = check_inputs("GATv2Conv", A, x, bipartite=True)
  _check_heads("GATv2Conv", "kernel_src", kernel_src.shape[-1], heads)
  _check_att("GATv2Conv", "att", att, heads, kernel_src.shape[-1] // heads)
  loops = _self_loops("GATv2Conv", A, add_self_loops, self_loop_mask, entry_mask, fill_value)
  lin = lambda z, k, b: z @ k if b is None else z @ k + b
  h_src = _split_heads(lin(x_src, kernel_src, bias_src), heads)  # [H, n_src, C]
  h_dst = _split_heads(lin(x_dst, kernel_dst, bias_dst), heads)  # [H, n_dst, C]
  z = h_dst[:, A.rows] + h_src[:, A.cols]  # [H, nnz, C]
  if edge_attr is not None:
    z = z + _edge_embedding(A, edge_attr, edge_kernel, heads, loops.pattern_fill)
  logits = jnp.einsum("hec,hc->he", jax.nn.leaky_relu(z, negative_slope), att)
  loop_logits = None
  if loops.loop_mask is not None:
    z_loop = h_dst + h_src[:, : A.shape[0]]  # [H, n_dst, C]: target i, source i
    if edge_attr is not None:
      z_loop = z_loop + _loop_embedding(A, edge_attr, edge_kernel, heads, fill_value)
    loop_logits = jnp.einsum("hnc,hc->hn", jax.nn.leaky_relu(z_loop, negative_slope), att)
  return _attend(
    A, logits, loop_logits, loops, h_src, bias, concat, attn_dropout, return_attention_weights
  )


def agnn_conv(A: SparseMatrix, x, beta):
  """AGNN (Thekumparampil et al.), PyG's AGNNConv: out_i = sum_j softmax_j(beta cos(x_i, x_j)) x_j.

  Cosine similarities come from one SDDMM of the L2-normalized features; `beta` is a scalar
  (a parameter or a constant). A's pattern should hold self-loops; its values are ignored.
  """
  x, _ = check_inputs("AGNNConv", A, x)
  norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
  xn = x / jnp.maximum(norm, 1e-12)
  cos = sddmm(A, xn, xn)
  S = _edge_softmax(cos.with_values(jnp.asarray(beta, cos.dtype) * cos.values))
  return spmm(S, x)


def _aggregate(A: SparseMatrix, x, aggr: str):
  """Neighbourhood aggregation at targets in x's dtype: "add"/"sum" (A's values weight),
  "mean" (divided by the row's value sum: the in-degree for a 0/1 matrix), "max" / "min" (over
  the pattern, A's values ignored; 0 for a row without entries: the max/min SpMM kernel)."""
  if aggr in ("add", "sum"):
    return spmm(_in_dtype(A, x.dtype), x)
  if aggr == "mean":
    A = _in_dtype(A, x.dtype)
    deg = jax.ops.segment_sum(A.values, A.rows, num_segments=A.shape[0])
    return spmm(A, x) / jnp.where(deg == 0, 1, deg)[:, None]
  if aggr in ("max", "min"):
    return spmm(A.with_values(jnp.ones((A.nnz,), x.dtype)), x, reduce=aggr)
  raise ValueError(f"aggr must be 'add', 'sum', 'mean', 'max' or 'min'; got {aggr!r}")


def sage_conv(
  A: SparseMatrix,
  x,
  kernel_l,
  kernel_r=None,
  bias=None,
  *,
  aggr: str = "mean",
  normalize: bool = False,
):
  """GraphSAGE (Hamilton et al.), PyG's SAGEConv: out_i = W_l aggr_j(x_j) + b + W_r x_i.

  aggr "mean" (default), "add" or "max" over A's edges j -> i (A a 0/1
  `message_passing_matrix`; no self-loops). kernel_l [in_src, out] with `bias` (PyG's lin_l),
  kernel_r [in_dst, out] (lin_r, no bias; None for root_weight=False). `normalize`:
  L2-normalised outputs. Bipartite: x = (x_src, x_dst). The aggregation runs in the dtype of
  the features aggregated (A's values are cast to it).
  """
  x_src, x_dst = check_inputs("SAGEConv", A, x, bipartite=True)
  if aggr not in ("add", "sum", "mean", "max"):
    raise ValueError(f"SAGEConv: aggr must be 'add', 'sum', 'mean' or 'max'; got {aggr!r}")
  if aggr != "max":
    _one_value_set("SAGEConv", A)
  if aggr != "max" and kernel_l.shape[0] > kernel_l.shape[1]:
    out = _aggregate(A, x_src @ kernel_l, aggr)  # linear aggregations: propagate the narrower
  else:
    out = _aggregate(A, x_src, aggr) @ kernel_l
  if bias is not None:
    out = out + bias
  if kernel_r is not None:
    out = out + x_dst @ kernel_r
  if normalize:
    out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
  return out


def gin_conv(A: SparseMatrix, x, nn: Callable[[jax.Array], jax.Array], eps=0.0):
  """GIN (Xu et al.), PyG's GINConv: out_i = nn((1 + eps) x_i + sum_{j -> i} x_j).

  The sum is A @ x (A a 0/1 `message_passing_matrix` without self-loops; its values weight the
  sum). `nn` is any function of [n, f] (the layer's MLP); `eps` a number or a trainable scalar.
  Bipartite: x = (x_src, x_dst). The sum runs in x_src's dtype (A's values are cast to it).
  """
  x_src, x_dst = check_inputs("GINConv", A, x, bipartite=True)
  _one_value_set("GINConv", A)
  return nn((1 + eps) * x_dst + spmm(_in_dtype(A, x_src.dtype), x_src))


def multihead_attention(
  A: SparseMatrix, q, k, v, *, scale: float, bias=None, attn_dropout: Dropout = None
):
  """softmax_row(mask_A(scale q k^T + bias)) @ v for q, k, v [H, n, C] -> [H, n, C].

  Without dropout this is the fused `sparse_attention`; with dropout on the coefficients it is
  sddmm -> edge_softmax -> dropout -> spmm.
  """
  if attn_dropout is None:
    return sparse_attention(A, q, k, v, scale=scale, bias=bias)
  logits = sddmm(A, q, k).values * scale
  if bias is not None:
    logits = logits + bias
  S = _edge_softmax(A.with_values(logits))
  if attn_dropout is not None:
    S = S.with_values(attn_dropout(S.values))
  return spmm(S, v)


def transformer_conv(
  A: SparseMatrix,
  x,
  query,
  key,
  value,
  skip=None,
  beta_kernel=None,
  *,
  heads: int,
  concat: bool = True,
  attn_dropout: Dropout = None,
  edge_attr=None,
  edge_kernel=None,
  return_attention_weights: bool = False,
):
  """Graph transformer convolution (Shi et al.), PyG's TransformerConv.

  `query`, `key`, `value`: (kernel [f, H*C], bias [H*C] or None) pairs. alpha_ij = row softmax over
  A's edges j -> i of <q_i, k_j + e_ij> / sqrt(C); out_i = sum_j alpha_ij (v_j + e_ij), heads
  concatenated or averaged, e_ij = edge_attr_ij @ edge_kernel when edge features are given
  (PyG's lin_edge; input order, `graph.edge_features`). `skip` = (kernel, bias or None) adds the
  root weight x_i @ W_skip (+ b); with `beta_kernel` [3 * out, 1] the skip is gated:
  b = sigmoid([out, r, out - r] @ beta_kernel), out = b r + (1 - b) out. A's values are ignored
  (its pattern is the attention mask; PyG adds no self-loops here). Bipartite: x = (x_src,
  x_dst): queries and the skip from x_dst. `return_attention_weights`: (out, alpha), alpha a
  SparseMatrix [H, nnz] on A's pattern (before dropout).
  """
  x_src, x_dst = check_inputs("TransformerConv", A, x, bipartite=True)
  for name, p in (("query", query), ("key", key), ("value", value)):
    _check_heads("TransformerConv", f"{name} kernel", p[0].shape[-1], heads)
  lin = lambda z, p: z @ p[0] if p[1] is None else z @ p[0] + p[1]  # noqa: E731
  q = _split_heads(lin(x_dst, query), heads)
  k, v = (_split_heads(lin(x_src, p), heads) for p in (key, value))
  scale = 1.0 / math.sqrt(q.shape[-1])
  if edge_attr is None and not return_attention_weights:
    att = multihead_attention(A, q, k, v, scale=scale, attn_dropout=attn_dropout)
  else:
    # Composed: per-edge terms (the edge embedding) or the coefficients themselves are needed.
    logits = sddmm(A, q, k).values * scale  # [H, nnz]
    e = None
    if edge_attr is not None:
      e = _edge_embedding(A, edge_attr, edge_kernel, heads, None)  # [H, nnz, C]
      logits = logits + scale * jnp.einsum("hec,hec->he", q[:, A.rows], e)
    S = _edge_softmax(A.with_values(logits))
    alpha = S
    if attn_dropout is not None:
      S = S.with_values(attn_dropout(S.values))
    att = spmm(S, v)
    if e is not None:
      att = att + jax.vmap(
        lambda w, eh: jax.ops.segment_sum(w[:, None] * eh, A.rows, num_segments=A.shape[0])
      )(S.values, e)
  out = _merge_heads(att, concat)
  if skip is not None:
    r = lin(x_dst, skip)
    if beta_kernel is not None:
      gate = jax.nn.sigmoid(jnp.concatenate([out, r, out - r], axis=-1) @ beta_kernel)
      out = gate * r + (1 - gate) * out
    else:
      out = out + r
  if return_attention_weights:
    return out, alpha
  return out
