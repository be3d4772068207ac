"""The implementation of jaxsparse_tc.nn.equinox, whose docstring documents it."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from jaxsparse_tc._src.nn import layers

glorot = jax.nn.initializers.glorot_uniform()


class Linear(eqx.Module):
  """x @ kernel + bias, kernel [in, out] (the layout of flax's nnx.Linear)."""

  kernel: jax.Array
  bias: jax.Array | None

  def __init__(
    self, in_features: int, out_features: int, *, use_bias: bool = True, init: str = "torch", key
  ):
    """init: "torch" (U(+-1/sqrt(in)) for kernel and bias, torch.nn.Linear) or "glorot"
    (glorot-uniform kernel, zero bias)."""
    kk, kb = jax.random.split(key)
    if init == "glorot":
      self.kernel = glorot(kk, (in_features, out_features), jnp.float32)
      self.bias = jnp.zeros((out_features,), jnp.float32) if use_bias else None
    else:
      bound = 1.0 / math.sqrt(in_features)
      self.kernel = jax.random.uniform(kk, (in_features, out_features), jnp.float32, -bound, bound)
      self.bias = (
        jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound) if use_bias else None
      )

  def __call__(self, x):
    y = x @ self.kernel
    return y if self.bias is None else y + self.bias


class LayerNorm(eqx.Module):
  """Layer normalization over the last axis (parameters `scale`, `bias`, as nnx.LayerNorm)."""

  scale: jax.Array
  bias: jax.Array
  epsilon: float = eqx.field(static=True)

  def __init__(self, dim: int, *, epsilon: float = 1e-5):
    self.scale = jnp.ones((dim,), jnp.float32)
    self.bias = jnp.zeros((dim,), jnp.float32)
    self.epsilon = epsilon

  def __call__(self, x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * self.scale + self.bias


def _keys(key, n: int):
  return [None] * n if key is None else list(jax.random.split(key, n))


def _dropout_fn(dropout: eqx.nn.Dropout, key):
  """A function applying `dropout` with `key`, or None when dropout is off."""
  if dropout.p == 0 or dropout.inference:
    return None
  if key is None:
    raise RuntimeError(
      "dropout is active: pass key=..., or switch it off with eqx.nn.inference_mode(model)"
    )
  return lambda v: dropout(v, key=key)


def _arrays(p):
  """The layers' `read` (layers.py): equinox holds parameters as arrays."""
  return p


class GCNConv(eqx.Module):
  """Graph convolution (Kipf & Welling 2017): `A @ (x @ W) + b`, PyG's GCNConv.

  Call with A = `graph.gcn_norm(edge_index, n)`, or a sampled `Block` (normalised inside:
  see the Flax twin's docstring). W: glorot, b: zeros.
  """

  lin: Linear
  bias: jax.Array | None

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True, key):
    self.lin = Linear(in_features, out_features, use_bias=False, init="glorot", key=key)
    self.bias = jnp.zeros((out_features,), jnp.float32) if use_bias else None

  def __call__(self, A, x, *, key=None):
    del key
    return layers.gcn_conv(self, _arrays, A, x)


class GATConv(eqx.Module):
  """Graph attention (Velickovic et al. 2018), PyG's GATConv (see the Flax twin's docstring:
  add_self_loops, edge_dim, bipartite pairs, sampled blocks, return_attention_weights).

  A's pattern must include self-loops with add_self_loops=True
  (`graph.message_passing_matrix(..., add_self_loops=True)`); on a sampled Block the layer adds
  each target's loop itself.
  """

  lin: Linear
  att_src: jax.Array
  att_dst: jax.Array
  lin_edge: Linear | None
  att_edge: jax.Array | None
  bias: jax.Array | None
  dropout: eqx.nn.Dropout
  heads: int = eqx.field(static=True)
  concat: bool = eqx.field(static=True)
  negative_slope: float = eqx.field(static=True)
  add_self_loops: bool = eqx.field(static=True)
  fill_value: object = eqx.field(static=True)

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    heads: int = 1,
    concat: bool = True,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    add_self_loops: bool = True,
    edge_dim: int | None = None,
    fill_value="mean",
    use_bias: bool = True,
    key,
  ):
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    self.heads, self.concat, self.negative_slope = heads, concat, negative_slope
    self.add_self_loops, self.fill_value = add_self_loops, fill_value
    self.lin = Linear(in_features, heads * out_features, use_bias=False, init="glorot", key=k1)
    self.att_src = glorot(k2, (heads, out_features), jnp.float32)
    self.att_dst = glorot(k3, (heads, out_features), jnp.float32)
    if edge_dim is not None:
      self.lin_edge = Linear(edge_dim, heads * out_features, use_bias=False, init="glorot", key=k4)
      self.att_edge = glorot(k5, (heads, out_features), jnp.float32)
    else:
      self.lin_edge = self.att_edge = None
    width = heads * out_features if concat else out_features
    self.bias = jnp.zeros((width,), jnp.float32) if use_bias else None
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, edge_attr=None, *, return_attention_weights: bool = False, key=None):
    return layers.gat_conv(
      self,
      _arrays,
      A,
      x,
      edge_attr,
      attn_dropout=_dropout_fn(self.dropout, key),
      return_attention_weights=return_attention_weights,
    )


class GATv2Conv(eqx.Module):
  """GATv2 (Brody et al. 2022), PyG's GATv2Conv (see the Flax twin's docstring)."""

  lin_l: Linear
  lin_r: Linear
  att: jax.Array
  lin_edge: Linear | None
  bias: jax.Array | None
  dropout: eqx.nn.Dropout
  heads: int = eqx.field(static=True)
  concat: bool = eqx.field(static=True)
  negative_slope: float = eqx.field(static=True)
  add_self_loops: bool = eqx.field(static=True)
  fill_value: object = eqx.field(static=True)

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    heads: int = 1,
    concat: bool = True,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    add_self_loops: bool = True,
    edge_dim: int | None = None,
    fill_value="mean",
    use_bias: bool = True,
    share_weights: bool = False,
    key,
  ):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    self.heads, self.concat, self.negative_slope = heads, concat, negative_slope
    self.add_self_loops, self.fill_value = add_self_loops, fill_value
    width = heads * out_features
    self.lin_l = Linear(in_features, width, use_bias=use_bias, init="glorot", key=k1)
    self.lin_r = (
      self.lin_l
      if share_weights
      else Linear(in_features, width, use_bias=use_bias, init="glorot", key=k2)
    )
    self.att = glorot(k3, (heads, out_features), jnp.float32)
    self.lin_edge = (
      Linear(edge_dim, width, use_bias=False, init="glorot", key=k4)
      if edge_dim is not None
      else None
    )
    out_width = width if concat else out_features
    self.bias = jnp.zeros((out_width,), jnp.float32) if use_bias else None
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, edge_attr=None, *, return_attention_weights: bool = False, key=None):
    return layers.gatv2_conv(
      self,
      _arrays,
      A,
      x,
      edge_attr,
      attn_dropout=_dropout_fn(self.dropout, key),
      return_attention_weights=return_attention_weights,
    )


class SAGEConv(eqx.Module):
  """GraphSAGE (Hamilton et al. 2017), PyG's SAGEConv (see the Flax twin's docstring)."""

  lin_l: Linear
  lin_r: Linear | None
  aggr: str = eqx.field(static=True)
  normalize: bool = eqx.field(static=True)

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    aggr: str = "mean",
    normalize: bool = False,
    root_weight: bool = True,
    use_bias: bool = True,
    key,
  ):
    if aggr not in ("mean", "add", "sum", "max"):
      raise ValueError(f"aggr must be 'mean', 'add', 'sum' or 'max'; got {aggr!r}")
    k1, k2 = jax.random.split(key)
    self.aggr, self.normalize = aggr, normalize
    self.lin_l = Linear(in_features, out_features, use_bias=use_bias, key=k1)
    self.lin_r = Linear(in_features, out_features, use_bias=False, key=k2) if root_weight else None

  def __call__(self, A, x, *, key=None):
    del key
    return layers.sage_conv(self, _arrays, A, x)


class MLP(eqx.Module):
  """Linear -> ReLU -> ... -> Linear (`sizes` = [in, hidden..., out]; dropout after each hidden
  ReLU): the update network of GINConv. Linears initialised like torch.nn.Linear."""

  lins: list
  dropout: eqx.nn.Dropout

  def __init__(self, sizes, *, dropout: float = 0.0, key):
    sizes = list(sizes)
    if len(sizes) < 2:
      raise ValueError(f"MLP needs at least [in, out] sizes; got {sizes}")
    keys = jax.random.split(key, len(sizes) - 1)
    self.lins = [Linear(a, b, key=k) for a, b, k in zip(sizes[:-1], sizes[1:], keys)]
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, x, *, key=None):
    keys = _keys(key, len(self.lins))[:-1]
    dropouts = [_dropout_fn(self.dropout, k) for k in keys]
    return layers.mlp(self.lins, x, norm=None, dropouts=dropouts)


class GINConv(eqx.Module):
  """Graph isomorphism network layer (Xu et al. 2019), PyG's GINConv:
  `nn((1 + eps) x_i + sum_{j -> i} x_j)` (see the Flax twin's docstring). `eps` is an array
  (trainable) with `train_eps`, else a Python float."""

  nn: object
  eps: jax.Array | float

  def __init__(self, nn, *, eps: float = 0.0, train_eps: bool = False):
    self.nn = nn
    self.eps = jnp.asarray(eps, jnp.float32) if train_eps else float(eps)

  def __call__(self, A, x, *, key=None):
    fn = (lambda h: self.nn(h, key=key)) if isinstance(self.nn, MLP) else self.nn
    return layers.gin_conv(self, _arrays, A, x, fn)


class AGNNConv(eqx.Module):
  """Attention-based propagation (Thekumparampil et al. 2018), PyG's AGNNConv.

  `beta` starts at 1: a trainable array when `requires_grad`, else a Python float (a constant
  that `eqx.filter(model, eqx.is_inexact_array)` leaves out, so optimizers never touch it).
  """

  beta: jax.Array | float

  def __init__(self, *, requires_grad: bool = True):
    self.beta = jnp.ones((), jnp.float32) if requires_grad else 1.0

  def __call__(self, A, x, *, key=None):
    del key
    return layers.agnn_conv(self, _arrays, A, x)


class TransformerConv(eqx.Module):
  """Graph transformer convolution (Shi et al. 2021), PyG's TransformerConv (see the Flax
  twin's docstring)."""

  lin_query: Linear
  lin_key: Linear
  lin_value: Linear
  lin_edge: Linear | None
  lin_skip: Linear | None
  lin_beta: Linear | None
  dropout: eqx.nn.Dropout
  heads: int = eqx.field(static=True)
  concat: bool = eqx.field(static=True)

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    heads: int = 1,
    concat: bool = True,
    beta: bool = False,
    dropout: float = 0.0,
    edge_dim: int | None = None,
    use_bias: bool = True,
    root_weight: bool = True,
    key,
  ):
    ks = jax.random.split(key, 6)
    self.heads, self.concat = heads, concat
    width = heads * out_features
    self.lin_query = Linear(in_features, width, use_bias=use_bias, key=ks[0])
    self.lin_key = Linear(in_features, width, use_bias=use_bias, key=ks[1])
    self.lin_value = Linear(in_features, width, use_bias=use_bias, key=ks[2])
    self.lin_edge = (
      Linear(edge_dim, width, use_bias=False, key=ks[5]) if edge_dim is not None else None
    )
    out_width = width if concat else out_features
    self.lin_skip = (
      Linear(in_features, out_width, use_bias=use_bias, key=ks[3]) if root_weight else None
    )
    self.lin_beta = (
      Linear(3 * out_width, 1, use_bias=False, key=ks[4]) if beta and root_weight else None
    )
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, edge_attr=None, *, return_attention_weights: bool = False, key=None):
    return layers.transformer_conv(
      self,
      _arrays,
      A,
      x,
      edge_attr,
      attn_dropout=_dropout_fn(self.dropout, key),
      return_attention_weights=return_attention_weights,
    )


class GraphTransformerLayer(eqx.Module):
  """Graph transformer block: multi-head sparse self-attention + feed-forward, residual + norm
  (post-norm by default, pre-norm with `norm_first`); see the Flax twin's docstring."""

  lin_query: Linear
  lin_key: Linear
  lin_value: Linear
  lin_out: Linear
  ff1: Linear
  ff2: Linear
  norm1: LayerNorm
  norm2: LayerNorm
  dropout: eqx.nn.Dropout
  attn_dropout: eqx.nn.Dropout
  heads: int = eqx.field(static=True)
  norm_first: bool = eqx.field(static=True)

  def __init__(
    self,
    dim: int,
    *,
    heads: int = 4,
    ff_dim: int | None = None,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    norm_first: bool = False,
    key,
  ):
    if dim % heads:
      raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
    ks = jax.random.split(key, 6)
    self.heads, self.norm_first = heads, norm_first
    ff_dim = ff_dim or 2 * dim
    self.lin_query = Linear(dim, dim, key=ks[0])
    self.lin_key = Linear(dim, dim, key=ks[1])
    self.lin_value = Linear(dim, dim, key=ks[2])
    self.lin_out = Linear(dim, dim, key=ks[3])
    self.ff1 = Linear(dim, ff_dim, key=ks[4])
    self.ff2 = Linear(ff_dim, dim, key=ks[5])
    self.norm1 = LayerNorm(dim)
    self.norm2 = LayerNorm(dim)
    self.dropout = eqx.nn.Dropout(dropout)
    self.attn_dropout = eqx.nn.Dropout(attn_dropout)

  def __call__(self, A, x, *, key=None):
    k_attn, *keys = _keys(key, 4)
    return layers.graph_transformer_layer(
      self,
      A,
      x,
      attn_dropout=_dropout_fn(self.attn_dropout, k_attn),
      dropouts=[_dropout_fn(self.dropout, k) for k in keys],
    )


# -- two-layer node classifiers (the Cora example's models) -------------------------------------


class GCN(eqx.Module):
  """dropout -> GCNConv -> ReLU -> dropout -> GCNConv; A = graph.gcn_norm(edge_index, n)."""

  conv1: GCNConv
  conv2: GCNConv
  dropout: eqx.nn.Dropout

  def __init__(
    self, in_features: int, hidden: int, out_features: int, *, dropout: float = 0.5, key
  ):
    k1, k2 = jax.random.split(key)
    self.conv1 = GCNConv(in_features, hidden, key=k1)
    self.conv2 = GCNConv(hidden, out_features, key=k2)
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, *, key=None):
    drops = [_dropout_fn(self.dropout, k) for k in _keys(key, 2)]
    return layers.gcn((self.conv1, self.conv2), A, x, drops)


class GAT(eqx.Module):
  """dropout -> GATConv(heads, concat) -> ELU -> dropout -> GATConv(out_heads, mean);
  A = graph.message_passing_matrix(edge_index, n, add_self_loops=True)."""

  conv1: GATConv
  conv2: GATConv
  dropout: eqx.nn.Dropout

  def __init__(
    self,
    in_features: int,
    hidden: int,
    out_features: int,
    *,
    heads: int = 8,
    out_heads: int = 1,
    dropout: float = 0.6,
    key,
  ):
    k1, k2 = jax.random.split(key)
    self.conv1 = GATConv(in_features, hidden, heads=heads, dropout=dropout, key=k1)
    self.conv2 = GATConv(
      heads * hidden, out_features, heads=out_heads, concat=False, dropout=dropout, key=k2
    )
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, *, key=None):
    k1, k2, k3, k4 = _keys(key, 4)
    convs = (functools.partial(self.conv1, key=k2), functools.partial(self.conv2, key=k4))
    drops = (_dropout_fn(self.dropout, k1), _dropout_fn(self.dropout, k3))
    return layers.gat(convs, A, x, drops)


class AGNN(eqx.Module):
  """dropout -> Linear -> ReLU -> AGNNConv (fixed beta) -> AGNNConv (learned beta) -> dropout
  -> Linear; A = message_passing_matrix(..., add_self_loops=True)."""

  lin1: Linear
  prop1: AGNNConv
  prop2: AGNNConv
  lin2: Linear
  dropout: eqx.nn.Dropout

  def __init__(
    self, in_features: int, hidden: int, out_features: int, *, dropout: float = 0.5, key
  ):
    k1, k2 = jax.random.split(key)
    self.lin1 = Linear(in_features, hidden, key=k1)
    self.prop1 = AGNNConv(requires_grad=False)
    self.prop2 = AGNNConv(requires_grad=True)
    self.lin2 = Linear(hidden, out_features, key=k2)
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, *, key=None):
    lins, props = (self.lin1, self.lin2), (self.prop1, self.prop2)
    drops = [_dropout_fn(self.dropout, k) for k in _keys(key, 2)]
    return layers.agnn(lins, props, A, x, drops)


class GraphTransformer(eqx.Module):
  """dropout -> Linear(in, hidden) -> num_layers x GraphTransformerLayer -> dropout -> Linear;
  A = message_passing_matrix(..., add_self_loops=True)."""

  lin_in: Linear
  layers: list
  lin_out: Linear
  dropout: eqx.nn.Dropout

  def __init__(
    self,
    in_features: int,
    hidden: int,
    out_features: int,
    *,
    heads: int = 4,
    num_layers: int = 2,
    dropout: float = 0.5,
    attn_dropout: float = 0.0,
    norm_first: bool = False,
    key,
  ):
    ks = jax.random.split(key, num_layers + 2)
    self.lin_in = Linear(in_features, hidden, key=ks[0])
    self.layers = [
      GraphTransformerLayer(
        hidden,
        heads=heads,
        dropout=dropout,
        attn_dropout=attn_dropout,
        norm_first=norm_first,
        key=k,
      )
      for k in ks[2:]
    ]
    self.lin_out = Linear(hidden, out_features, key=ks[1])
    self.dropout = eqx.nn.Dropout(dropout)

  def __call__(self, A, x, *, key=None):
    keys = _keys(key, len(self.layers) + 2)
    blocks = [functools.partial(layer, key=k) for layer, k in zip(self.layers, keys[2:])]
    drops = (_dropout_fn(self.dropout, keys[0]), _dropout_fn(self.dropout, keys[1]))
    return layers.graph_transformer(self.lin_in, blocks, self.lin_out, A, x, drops)
