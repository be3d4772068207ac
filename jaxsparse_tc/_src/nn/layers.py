"""The layers' forward passes, shared by the Flax and Equinox modules (_src/nn/flax.py,
_src/nn/equinox.py).

The two frameworks' layers hold the same parameters under the same names and layouts (weights
[in, out] in `lin.kernel`, `att_src`, `bias`, ...). A forward pass here reads them off the layer
`m` through `read` (the framework's parameter as an array; None stays None) and takes dropout as
functions of an array (None: off), so that a framework's module only creates its parameters and
says how its dropout draws: the math is `functional`'s, the wiring of parameters into it is here.

Every message-passing layer here also takes a sampled `Block` (jaxsparse_tc.sampling) in place
of the matrix: `layer(block, h)` with h [block.num_src, f] returns the targets' rows
[block.num_dst, out]. `_blockwise` is the one place that unpacks a block (its padded square
matrix, whose first rows are the targets since targets are the sources' prefix) and cuts the
output; padding is inert: padding rows come out 0 (and so pass no gradient back), and padding
entries carry value 0 (attention layers exclude them from the softmax: `_attention_masks`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from jaxsparse_tc._src.checks import OperandError
from jaxsparse_tc._src.nn import functional as F
from jaxsparse_tc._src.sampling import Block

Read = Callable[[Any], Any]
Dropout = Optional[Callable[[jax.Array], jax.Array]]


def _kernel(read: Read, lin):
  return None if lin is None else read(lin.kernel)


def _pair(read: Read, lin):
  return None if lin is None else (read(lin.kernel), read(lin.bias))


def _maybe(drop: Dropout, x):
  return x if drop is None else drop(x)


def _block_features(op: str, block: Block, x):
  """h [block.num_src, f] as an array, refusing pairs and other row counts."""
  if isinstance(x, (tuple, list)):
    raise TypeError(
      f"{op}: a Block carries the bipartite structure itself (targets are the sources' "
      f"prefix); pass the sources' features h [{block.num_src}, f], not a pair"
    )
  x = jnp.asarray(x)
  if x.ndim != 2 or x.shape[0] != block.num_src:
    raise OperandError(
      f"{op}: the Block has {block.num_src} source slots (num_src), so h must be "
      f"[{block.num_src}, features]; got shape {x.shape}"
    )
  return x


def _block_output(block: Block, out):
  """The targets' rows of a layer's output [num_src, ...] -> [num_dst, ...], zero on padding
  targets (dst_mask False): they feed the next block as padding sources."""
  out = block.dst(out)
  keep = block.dst_mask.reshape((-1,) + (1,) * (out.ndim - 1))
  return jnp.where(keep, out, jnp.zeros((), out.dtype))


def _blockwise(op: str, A, x, forward):
  """forward(A, x) for a matrix; for a Block, forward on its padded square matrix and the
  sources' features, cut to the targets' rows (a (out, alpha) result keeps alpha whole, on
  the block's pattern)."""
  if not isinstance(A, Block):
    return forward(A, x)
  result = forward(A.A, _block_features(op, A, x))
  if isinstance(result, tuple):
    return (_block_output(A, result[0]),) + tuple(result[1:])
  return _block_output(A, result)


def _attention_masks(m, A):
  """For a Block: (entry_mask, self_loop_mask) of functional's attention layers. entry_mask:
  its matrix's sampled entries (format order; padding entries hold value 0), the rest left out
  of the softmax. self_loop_mask, with add_self_loops=True: the real targets, each attending
  over its self-loop (target i is source i) besides its sampled edges, as PyG's GATConv on the
  sampled bipartite graph; the pattern holds the sampled edges only, so the loops are attended
  outside it (no per-batch host work, the same shapes in every batch)."""
  if not isinstance(A, Block):
    return None, None
  return A.A.values != 0, _real_targets(A) if m.add_self_loops else None


def _real_targets(block: Block):
  """bool [num_src]: the rows of the block's matrix that are real targets (target i is row i),
  those that get a self-loop."""
  n = block.A.shape[0]
  k = min(n, block.num_dst)
  return jnp.zeros((n,), bool).at[:k].set(block.dst_mask[:k])


def block_mask(A, mask):
  """The node mask of a layer's update network: `mask`, or for a Block called without one its
  dst_mask (the update runs on the targets' rows)."""
  if mask is None and isinstance(A, Block):
    return A.dst_mask
  return mask


def _block_gcn(block: Block, x, kernel, bias):
  """GCNConv on a Block: the sampled bipartite graph with each target's self-loop (target i is
  source i), normalised symmetrically by its own degrees, as gcn_norm normalises a whole graph:
  out_i = sum_j A'_ij / sqrt(d_i c_j) x_j W + b, A' = the block's edge counts plus the loops,
  d_i = target i's in-degree in A' (sampled neighbours + 1), c_j = source j's out-degree in A'
  (its sampled edges, + 1 if it is a target). The loops lie outside the block's pattern: their
  term is added densely."""
  M = block.A
  n = M.shape[0]
  dt = x.dtype
  loop = _real_targets(block).astype(dt)
  vals = M.values.astype(dt)
  deg_in = jax.ops.segment_sum(vals, M.rows, num_segments=n) + loop
  deg_out = jax.ops.segment_sum(vals, M.cols, num_segments=n) + loop
  inv_in = jnp.where(deg_in > 0, jax.lax.rsqrt(jnp.where(deg_in > 0, deg_in, 1)), 0)
  inv_out = jnp.where(deg_out > 0, jax.lax.rsqrt(jnp.where(deg_out > 0, deg_out, 1)), 0)
  normed = M.with_values(vals * inv_in[M.rows] * inv_out[M.cols])
  out = F.gcn_conv(normed, x, kernel) + ((loop * inv_in * inv_out)[:, None] * x) @ kernel
  return out if bias is None else out + bias


def gcn_conv(m, read: Read, A, x):
  kernel, bias = read(m.lin.kernel), read(m.bias)
  if isinstance(A, Block):
    return _blockwise("GCNConv", A, x, lambda M, h: _block_gcn(A, h, kernel, bias))
  return F.gcn_conv(A, x, kernel, bias)


def gat_conv(m, read: Read, A, x, edge_attr, *, attn_dropout: Dropout, return_attention_weights):
  entry_mask, self_loop_mask = _attention_masks(m, A)
  return _blockwise(
    "GATConv",
    A,
    x,
    lambda M, h: F.gat_conv(
      M,
      h,
      read(m.lin.kernel),
      read(m.att_src),
      read(m.att_dst),
      read(m.bias),
      heads=m.heads,
      concat=m.concat,
      negative_slope=m.negative_slope,
      attn_dropout=attn_dropout,
      add_self_loops=m.add_self_loops,
      edge_attr=edge_attr,
      edge_kernel=_kernel(read, m.lin_edge),
      att_edge=read(m.att_edge),
      fill_value=m.fill_value,
      return_attention_weights=return_attention_weights,
      entry_mask=entry_mask,
      self_loop_mask=self_loop_mask,
    ),
  )


def gatv2_conv(m, read: Read, A, x, edge_attr, *, attn_dropout: Dropout, return_attention_weights):
  entry_mask, self_loop_mask = _attention_masks(m, A)
  return _blockwise(
    "GATv2Conv",
    A,
    x,
    lambda M, h: F.gatv2_conv(
      M,
      h,
      read(m.lin_l.kernel),
      read(m.lin_r.kernel),
      read(m.att),
      read(m.bias),
      heads=m.heads,
      bias_src=read(m.lin_l.bias),
      bias_dst=read(m.lin_r.bias),
      concat=m.concat,
      negative_slope=m.negative_slope,
      attn_dropout=attn_dropout,
      add_self_loops=m.add_self_loops,
      edge_attr=edge_attr,
      edge_kernel=_kernel(read, m.lin_edge),
      fill_value=m.fill_value,
      return_attention_weights=return_attention_weights,
      entry_mask=entry_mask,
      self_loop_mask=self_loop_mask,
    ),
  )


def sage_conv(m, read: Read, A, x):
  return _blockwise(
    "SAGEConv",
    A,
    x,
    lambda M, h: F.sage_conv(
      M,
      h,
      read(m.lin_l.kernel),
      _kernel(read, m.lin_r),
      read(m.lin_l.bias),
      aggr=m.aggr,
      normalize=m.normalize,
    ),
  )


def gin_conv(m, read: Read, A, x, nn: Callable[[jax.Array], jax.Array]):
  """`nn`: the layer's update network as a function of [n, f] (the framework's call of m.nn);
  on a Block it runs on the targets' rows only."""
  if isinstance(A, Block):
    nn_targets = lambda z: nn(A.dst(z))  # noqa: E731
    return _blockwise("GINConv", A, x, lambda M, h: F.gin_conv(M, h, nn_targets, read(m.eps)))
  return F.gin_conv(A, x, nn, read(m.eps))


def agnn_conv(m, read: Read, A, x):
  return F.agnn_conv(A, x, read(m.beta))


def transformer_conv(
  m, read: Read, A, x, edge_attr, *, attn_dropout: Dropout, return_attention_weights
):
  return F.transformer_conv(
    A,
    x,
    _pair(read, m.lin_query),
    _pair(read, m.lin_key),
    _pair(read, m.lin_value),
    _pair(read, m.lin_skip),
    _kernel(read, m.lin_beta),
    heads=m.heads,
    concat=m.concat,
    attn_dropout=attn_dropout,
    edge_attr=edge_attr,
    edge_kernel=_kernel(read, m.lin_edge),
    return_attention_weights=return_attention_weights,
  )


def mlp(lins, x, *, norm: Callable[[int, jax.Array], jax.Array] | None, dropouts):
  """Linear -> [norm] -> ReLU -> dropout -> ... -> Linear. `lins`: the Linears, callables;
  `norm(i, h)`: the i-th hidden layer's normalization (None: none); `dropouts[i]`: the i-th
  hidden layer's dropout (None: off)."""
  for i, lin in enumerate(lins):
    x = lin(x)
    if i < len(lins) - 1:
      if norm is not None:
        x = norm(i, x)
      x = _maybe(dropouts[i], jax.nn.relu(x))
  return x


def graph_transformer_layer(m, A, x, *, attn_dropout: Dropout, dropouts):
  """GraphTransformerLayer's block from its callables (lin_query, lin_key, lin_value, lin_out,
  ff1, ff2, norm1, norm2) and `heads`, `norm_first`; `dropouts`: the three dropouts (after the
  attention's output, inside the feed-forward, after it), None where off."""
  h = m.norm1(x) if m.norm_first else x
  q, k, v = (F._split_heads(lin(h), m.heads) for lin in (m.lin_query, m.lin_key, m.lin_value))
  a = F.multihead_attention(
    A, q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), attn_dropout=attn_dropout
  )
  x = x + _maybe(dropouts[0], m.lin_out(F._merge_heads(a, True)))
  if not m.norm_first:
    x = m.norm1(x)
  h = m.norm2(x) if m.norm_first else x
  x = x + _maybe(dropouts[2], m.ff2(_maybe(dropouts[1], jax.nn.relu(m.ff1(h)))))
  if not m.norm_first:
    x = m.norm2(x)
  return x


# -- two-layer node classifiers: `convs`, `lins`, `layers` are the framework's calls of the
# model's submodules (with their dropout keys bound where the framework needs them), `drops`
# its input and output dropouts (None: off).


def gcn(convs, A, x, drops):
  x = jax.nn.relu(convs[0](A, _maybe(drops[0], x)))
  return convs[1](A, _maybe(drops[1], x))


def gat(convs, A, x, drops):
  x = jax.nn.elu(convs[0](A, _maybe(drops[0], x)))
  return convs[1](A, _maybe(drops[1], x))


def agnn(lins, props, A, x, drops):
  x = jax.nn.relu(lins[0](_maybe(drops[0], x)))
  x = props[1](A, props[0](A, x))
  return lins[1](_maybe(drops[1], x))


def graph_transformer(lin_in, layers, lin_out, A, x, drops):
  x = lin_in(_maybe(drops[0], x))
  for layer in layers:
    x = layer(A, x)
  return lin_out(_maybe(drops[1], x))
