"""The implementation of nn.functional.message_passing, whose docstring documents it."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src import checks
from jaxsparse_tc._src.edge_softmax import edge_softmax
from jaxsparse_tc._src.nn import graph as graph_lib
from jaxsparse_tc._src.nn.functional import _in_dtype, _one_value_set, check_inputs
from jaxsparse_tc._src.sparse_matrix import SparseMatrix
from jaxsparse_tc._src.spmm import spmm

_OP = "message_passing"
AGGREGATES = ("sum", "add", "mean", "max", "min", "softmax")


def message_passing(
  A: SparseMatrix,
  x,
  *,
  message: Optional[Callable] = None,
  aggregate: str = "sum",
  update: Optional[Callable] = None,
  edge_attr=None,
):
  """Messages over A's edges, aggregated at their targets: the core of a custom GNN layer.

  A: a SparseMatrix [m targets, n sources] (rows = targets: `graph.message_passing_matrix`);
  each stored entry (i, j) is an edge j -> i. x: node features [n, f], or a pair (x_src [n, f],
  x_dst [m, f']) for a bipartite A.

  `message(x_j, x_i, e)` receives per-edge arrays in A's format order: x_j = x_src[A.cols]
  (sources), x_i = x_dst[A.rows] (targets), e = the edge features (None without `edge_attr`),
  and returns the messages [nnz, ...]. For aggregate="softmax" it returns a pair (logits,
  messages): logits [nnz] or [nnz, H]; with H heads, messages [nnz, H, C] are per head and
  messages [nnz, F] are shared by every head (output [m, H, C] or [m, H, F]). A's values are
  not passed: close over `A.values` (format order, aligned with the per-edge arrays) to use
  them. `message=None` is the default message A[i, j] * x_j (the matrix's value times the
  source row; x_j for a 0/1 matrix), as are None messages in a softmax pair.

  `aggregate`, per target i over its edges: "sum" ("add"), "mean" (divided by the number of
  edges), "max", "min" (elementwise; 0 at a target without edges, in all four), "softmax"
  (sum of softmax_i(logits) * messages, the softmax over i's edges by `jst.edge_softmax`, in
  float32 from float32/16-bit logits: a target without edges, or whose logits are all -inf,
  gets 0; a NaN or +inf logit makes its row NaN; a -inf logit drops its edge).

  `update(aggregated, x_dst)`, if given, maps the aggregation [m, ...] and the target
  features to the result (default: the aggregation itself).

  `edge_attr` [E, ...]: edge features in *input order*, row k for the k-th entry of the
  edge_index / COO A was built from (as the attention layers' `edge_attr`,
  `graph.edge_features`); E may be less than A's input count (the self-loops
  `message_passing_matrix` appends then get zeros).

  Duplicate entries: A's builder merges entries at one position (their values add up), so a
  duplicated edge is one edge here: it sends one message, its edge features add up, and it
  counts once in "mean", "max", "min" and "softmax". A padded batch's matrix (`nn.batch`) works
  as it is, with `batch.edge_attr`: its dummy entries lie among the padding nodes.

  Kernels (the rest is gathers and `jax.ops.segment_*` over the edges):
  - message=None, or a message returning x_j itself: "sum" and "mean" are one `spmm` of A (its
    values for None, ones for x_j) with x_src, and no per-edge array is made; "max"/"min" the
    max/min product of A and x_src (A[i, j] * x_j over i's entries);
  - "softmax": the logits always go through `edge_softmax`; messages None or x_j itself
    make the weighted sum one `spmm` of the coefficients with x_src.

  Traceable: jit, grad and vmap (over feature batches, say) as the operators; the choice of
  path is made at trace time from what `message` returns. Shape errors (messages of the wrong
  leading size, bad logits) raise `OperandError` at trace time; bad arguments ValueError.
  """
  if aggregate not in AGGREGATES:
    raise ValueError(
      f"{_OP}: aggregate must be one of {', '.join(map(repr, AGGREGATES))}; got {aggregate!r}"
    )
  for name, fn in (("message", message), ("update", update)):
    if fn is not None and not callable(fn):
      raise TypeError(f"{_OP}: {name} must be a function or None; got {type(fn).__name__}")
  x_src, x_dst = check_inputs(_OP, A, x, bipartite=True)
  if message is None:
    if aggregate == "softmax":
      raise ValueError(
        f"{_OP}: aggregate='softmax' needs logits: pass a message returning (logits [nnz] or "
        "[nnz, H], messages or None)"
      )
    if edge_attr is not None:
      raise ValueError(
        f"{_OP}: edge_attr was given but message is None (the default message A[i, j] * x_j "
        "reads no edge features): pass a message that uses them"
      )
    out = _kernel_aggregate(A, x_src, aggregate, weighted=True)
  else:
    e = None if edge_attr is None else graph_lib.edge_features(A, edge_attr)
    x_j, x_i = x_src[A.cols], x_dst[A.rows]
    result = message(x_j, x_i, e)
    if aggregate == "softmax":
      out = _softmax_aggregate(A, x_src, x_j, result)
    elif result is x_j:
      out = _kernel_aggregate(A, x_src, aggregate, weighted=False)
    else:
      out = _segment_aggregate(A, _messages(A, result, aggregate), aggregate)
  return out if update is None else update(out, x_dst)


def _messages(A: SparseMatrix, msg, aggregate: str) -> jax.Array:
  """The message function's result as an array [nnz, ...], or an OperandError saying why not."""
  if isinstance(msg, (tuple, list)):
    if aggregate == "softmax":
      raise checks.OperandError(
        f"{_OP}: the softmax pair's messages are a {type(msg).__name__}; expected an array "
        f"[nnz={A.nnz}, ...] or None"
      )
    raise checks.OperandError(
      f"{_OP}: message returned a {type(msg).__name__} of {len(msg)} items; aggregate="
      f"{aggregate!r} takes one array [nnz={A.nnz}, ...] (a (logits, messages) pair is for "
      "aggregate='softmax')"
    )
  if msg is None or not hasattr(msg, "shape"):
    raise checks.OperandError(
      f"{_OP}: message must return an array [nnz={A.nnz}, ...] (one message per edge of A, "
      f"format order); got {type(msg).__name__}"
    )
  msg = jnp.asarray(msg)
  if msg.ndim < 1 or msg.shape[0] != A.nnz:
    raise checks.OperandError(
      f"{_OP}: A has shape {A.shape} and {A.nnz} stored entries (edges), so message must return "
      f"[{A.nnz}, ...] (one row per edge, format order); got shape {msg.shape}"
    )
  return msg


def _row_counts(A: SparseMatrix) -> jax.Array:
  """Each target's number of edges (float32 [m]), as an SpMM of A's pattern with a column of
  ones: no scatter, and no gradient to carry."""
  ones = A.with_values(jnp.ones((A.nnz,), jnp.float32))
  return spmm(ones, jnp.ones((A.shape[1], 1), jnp.float32))[:, 0]


def _per_row(v: jax.Array, ndim: int, dtype) -> jax.Array:
  """[m] -> [m, 1, ...] in `dtype`, to broadcast against an [m, ...] result of `ndim` axes."""
  return v.astype(dtype).reshape(v.shape + (1,) * (ndim - 1))


def _kernel_aggregate(A: SparseMatrix, x: jax.Array, aggregate: str, *, weighted: bool):
  """The aggregation of the messages A[i, j] * x_j (weighted) or x_j by the SpMM kernels."""
  if weighted:
    _one_value_set(_OP, A)
    B = _in_dtype(A, x.dtype)
  else:
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    B = A.with_values(jnp.ones((A.nnz,), dtype))
  if aggregate in ("max", "min"):
    return _extremum(B, x, aggregate)
  out = spmm(B, x)
  if aggregate == "mean":
    out = out / _per_row(jnp.maximum(_row_counts(A), 1), out.ndim, out.dtype)
  return out


def _extremum(A: SparseMatrix, x: jax.Array, reduce: str) -> jax.Array:
  """out[i] = max (or min) over A's stored entries (i, j) of A[i, j] * x[j]; 0 for a row
  without entries: the max/min SpMM, one kernel and no per-edge array."""
  return spmm(_in_dtype(A, x.dtype), x, reduce=reduce)


def _segment_extremum(A: SparseMatrix, msg: jax.Array, reduce: str) -> jax.Array:
  segment = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
  out = segment(msg, A.rows, num_segments=A.shape[0])  # -inf / +inf at an empty row
  has_edges = _per_row(_row_counts(A) > 0, out.ndim, jnp.bool_)
  return jnp.where(has_edges, out, jnp.zeros((), out.dtype))


def _segment_aggregate(A: SparseMatrix, msg: jax.Array, aggregate: str) -> jax.Array:
  if aggregate in ("max", "min"):
    return _segment_extremum(A, msg, aggregate)
  out = jax.ops.segment_sum(msg, A.rows, num_segments=A.shape[0])
  if aggregate == "mean":
    out = out / _per_row(jnp.maximum(_row_counts(A), 1), out.ndim, out.dtype)
  return out


def _softmax_aggregate(A: SparseMatrix, x_src: jax.Array, x_j: jax.Array, result) -> jax.Array:
  if not (isinstance(result, (tuple, list)) and len(result) == 2):
    got = (
      f"a {type(result).__name__} of {len(result)} items"
      if isinstance(result, (tuple, list))
      else f"{type(result).__name__} of shape {getattr(result, 'shape', '?')}"
    )
    raise ValueError(
      f"{_OP}: aggregate='softmax' needs logits: message must return a pair (logits [nnz] or "
      f"[nnz, H], messages [nnz, ...] or None) with nnz={A.nnz}; got {got}"
    )
  logits, msg = result
  logits = jnp.asarray(logits)
  if logits.ndim not in (1, 2) or logits.shape[0] != A.nnz:
    raise checks.OperandError(
      f"{_OP}: A has {A.nnz} stored entries (edges), so the softmax logits must have shape "
      f"[{A.nnz}] or [{A.nnz}, H]; got {logits.shape}"
    )
  if not checks.is_supported_float(logits.dtype) or np.dtype(logits.dtype) == np.float64:
    raise checks.OperandError(
      f"{_OP}: the softmax logits (shape {logits.shape}) have dtype {logits.dtype}; the edge "
      "softmax takes float32, float16 or bfloat16 (float32 math): cast them"
    )
  heads = logits.ndim == 2
  S = edge_softmax(A.with_values(logits.T))  # values [nnz] or [H, nnz]
  if msg is None or msg is x_j:
    if msg is None:  # the default message A[i, j] * x_j
      _one_value_set(_OP, A)
      S = S.with_values(S.values * A.values.astype(S.dtype))
    out = spmm(S, x_src)  # [m, f] or [H, m, f]
    return jnp.moveaxis(out, 0, 1) if heads else out
  msg = _messages(A, msg, "softmax")
  w = S.values.T  # [nnz] or [nnz, H]
  if heads:
    if msg.ndim == 2:
      msg = msg[:, None, :]  # shared by every head
    elif msg.ndim < 2 or msg.shape[1] != logits.shape[1]:
      raise checks.OperandError(
        f"{_OP}: the softmax logits have shape {logits.shape} ({logits.shape[1]} heads), so "
        f"messages must be [{A.nnz}, {logits.shape[1]}, C] (per head) or [{A.nnz}, F] (shared); "
        f"got {msg.shape}"
      )
  w = w.reshape(w.shape + (1,) * (msg.ndim - w.ndim))
  return jax.ops.segment_sum(w * msg, A.rows, num_segments=A.shape[0])
