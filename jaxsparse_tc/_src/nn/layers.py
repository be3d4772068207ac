"""The layers' forward passes, shared by the Flax and Equinox modules (_src/nn/flax.py,
_src/nn/equinox.py).

The two frameworks' layers hold the same parameters under the same names and layouts (weights
[in, out] in `lin.kernel`, `att_src`, `bias`, ...). A forward pass here reads them off the layer
`m` through `read` (the framework's parameter as an array; None stays None) and takes dropout as
functions of an array (None: off), so that a framework's module only creates its parameters and
says how its dropout draws: the math is `functional`'s, the wiring of parameters into it is here.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax

from jaxsparse_tc._src.nn import functional as F

Read = Callable[[Any], Any]
Dropout = Optional[Callable[[jax.Array], jax.Array]]


def _kernel(read: Read, lin):
  return None if lin is None else read(lin.kernel)


def _pair(read: Read, lin):
  return None if lin is None else (read(lin.kernel), read(lin.bias))


def _maybe(drop: Dropout, x):
  return x if drop is None else drop(x)


def gcn_conv(m, read: Read, A, x):
  return F.gcn_conv(A, x, read(m.lin.kernel), read(m.bias))


def gat_conv(m, read: Read, A, x, edge_attr, *, attn_dropout: Dropout, return_attention_weights):
  return F.gat_conv(
    A,
    x,
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
  )


def gatv2_conv(m, read: Read, A, x, edge_attr, *, attn_dropout: Dropout, return_attention_weights):
  return F.gatv2_conv(
    A,
    x,
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
  )


def sage_conv(m, read: Read, A, x):
  return F.sage_conv(
    A,
    x,
    read(m.lin_l.kernel),
    _kernel(read, m.lin_r),
    read(m.lin_l.bias),
    aggr=m.aggr,
    normalize=m.normalize,
  )


def gin_conv(m, read: Read, A, x, nn: Callable[[jax.Array], jax.Array]):
  """`nn`: the layer's update network as a function of [n, f] (the framework's call of m.nn)."""
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
