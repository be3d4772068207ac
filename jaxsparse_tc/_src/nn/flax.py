"""The implementation of jaxsparse_tc.nn.flax, whose docstring documents it."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsparse_tc._src.nn import layers

glorot = jax.nn.initializers.glorot_uniform()
_List = getattr(nnx, "List", list)  # flax >= 0.12 wants nnx.List for lists of modules


def _torch_linear(
  in_features: int, out_features: int, *, use_bias: bool = True, rngs: nnx.Rngs
) -> nnx.Linear:
  """nnx.Linear initialized like torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for both."""
  bound = 1.0 / math.sqrt(in_features)

  def bias_init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return nnx.Linear(
    in_features,
    out_features,
    use_bias=use_bias,
    kernel_init=jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
    bias_init=bias_init,
    rngs=rngs,
  )


def _active(dropout: nnx.Dropout | None):
  """The dropout module when it would do something now, else None."""
  if dropout is None or dropout.rate == 0 or dropout.deterministic:
    return None
  return dropout


def _get(p):
  return None if p is None else p[...]


class GCNConv(nnx.Module):
  """Graph convolution (Kipf & Welling 2017): `A @ (x @ W) + b`, PyG's GCNConv.

  Call with A = `graph.gcn_norm(edge_index, n)` (self-loops added, D^-1/2 (A+I) D^-1/2), the
  normalization PyG's GCNConv computes inside. W: glorot, b: zeros (PyG's init).

  A may be a sampled `Block` (jaxsparse_tc.sampling; its 0/1 edge counts as the sampler makes
  them): `layer(block, h)`, h [block.num_src, in] -> [block.num_dst, out]. The layer then
  normalises the block itself as gcn_norm would the sampled bipartite graph with each
  target's self-loop: D_dst^-1/2 (A + I) D_src^-1/2 with the block's own in-degrees (targets)
  and out-degrees (sources), loops counted (PyG's GCNConv on a sampled subgraph; DGL's
  GraphConv norm="both" on a block, after adding self-loops).
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True, rngs: nnx.Rngs):
    self.lin = nnx.Linear(in_features, out_features, use_bias=False, kernel_init=glorot, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if use_bias else None

  def __call__(self, A, x):
    return layers.gcn_conv(self, _get, A, x)


class GATConv(nnx.Module):
  """Graph attention (Velickovic et al. 2018), PyG's GATConv.

  `heads` attention heads of `out_features` channels each, concatenated ([n, heads * out]) or
  averaged ([n, out]) by `concat`; LeakyReLU slope `negative_slope`; `dropout` on the attention
  coefficients while training. `add_self_loops=True` (PyG's default) attends over each node's
  self-loop, which A's pattern must hold (`graph.message_passing_matrix(ei, n,
  add_self_loops=True)`; a concrete A without them is refused); False attends over A as given.
  `edge_dim`: edge features enter the scores (call with `edge_attr=` [E, edge_dim] in A's
  input order; loops get the mean of their target's incoming features, PyG's fill_value).
  Call `layer(A, x, edge_attr=None, return_attention_weights=False)`; x may be a bipartite
  pair (x_src, x_dst) with add_self_loops=False. A may be a sampled `Block`
  (jaxsparse_tc.sampling): `layer(block, h)`, h [block.num_src, in] -> [block.num_dst, ...],
  attending over the sampled edges (the padding's entries excluded; edge_attr in the block's
  edge slots, alpha on its pattern), with add_self_loops=True also over each target's
  self-loop (target i is source i), in one softmax with its edges, as PyG's layer on the sampled
  bipartite graph: the graph's own sampled loops are replaced by it, its edge features are
  `fill_value`, and alpha holds the edges' coefficients (a target's loop has the rest, 1 - its
  row's sum). Parameters: `lin.kernel` [in, heads * out], `att_src`, `att_dst` [heads, out],
  `bias`; with edge_dim `lin_edge.kernel`, `att_edge`.
  """

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
    rngs: nnx.Rngs,
  ):
    self.heads, self.concat, self.negative_slope = heads, concat, negative_slope
    self.add_self_loops, self.fill_value = add_self_loops, fill_value
    self.lin = nnx.Linear(
      in_features, heads * out_features, use_bias=False, kernel_init=glorot, rngs=rngs
    )
    self.att_src = nnx.Param(glorot(rngs.params(), (heads, out_features), jnp.float32))
    self.att_dst = nnx.Param(glorot(rngs.params(), (heads, out_features), jnp.float32))
    if edge_dim is not None:
      self.lin_edge = nnx.Linear(
        edge_dim, heads * out_features, use_bias=False, kernel_init=glorot, rngs=rngs
      )
      self.att_edge = nnx.Param(glorot(rngs.params(), (heads, out_features), jnp.float32))
    else:
      self.lin_edge = self.att_edge = None
    width = heads * out_features if concat else out_features
    self.bias = nnx.Param(jnp.zeros((width,), jnp.float32)) if use_bias else None
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x, edge_attr=None, *, return_attention_weights: bool = False):
    return layers.gat_conv(
      self,
      _get,
      A,
      x,
      edge_attr,
      attn_dropout=_active(self.dropout),
      return_attention_weights=return_attention_weights,
    )


class GATv2Conv(nnx.Module):
  """GATv2 (Brody et al. 2022), PyG's GATv2Conv: the score applies att after the LeakyReLU,
  e_ij = att . leaky_relu(W_r x_i + W_l x_j [+ W_e e_ij]); messages are W_l x_j.

  Options as GATConv (heads, concat, dropout, add_self_loops, edge_dim, bipartite pairs,
  sampled blocks with or without self-loops, return_attention_weights) plus `share_weights`
  (lin_r is lin_l). Parameters: `lin_l`, `lin_r` (kernels [in, heads * out] with biases,
  glorot / zeros), `att` [heads, out], `bias`, with edge_dim `lin_edge` (no bias).
  """

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
    rngs: nnx.Rngs,
  ):
    self.heads, self.concat, self.negative_slope = heads, concat, negative_slope
    self.add_self_loops, self.fill_value = add_self_loops, fill_value
    width = heads * out_features
    self.lin_l = nnx.Linear(in_features, width, use_bias=use_bias, kernel_init=glorot, rngs=rngs)
    self.lin_r = (
      self.lin_l
      if share_weights
      else nnx.Linear(in_features, width, use_bias=use_bias, kernel_init=glorot, rngs=rngs)
    )
    self.att = nnx.Param(glorot(rngs.params(), (heads, out_features), jnp.float32))
    self.lin_edge = (
      nnx.Linear(edge_dim, width, use_bias=False, kernel_init=glorot, rngs=rngs)
      if edge_dim is not None
      else None
    )
    out_width = width if concat else out_features
    self.bias = nnx.Param(jnp.zeros((out_width,), jnp.float32)) if use_bias else None
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x, edge_attr=None, *, return_attention_weights: bool = False):
    return layers.gatv2_conv(
      self,
      _get,
      A,
      x,
      edge_attr,
      attn_dropout=_active(self.dropout),
      return_attention_weights=return_attention_weights,
    )


class SAGEConv(nnx.Module):
  """GraphSAGE (Hamilton et al. 2017), PyG's SAGEConv: `lin_l(aggr_j x_j) + lin_r(x_i)`.

  `aggr` "mean" (default), "add" or "max" over A's edges j -> i (A =
  `graph.message_passing_matrix(edge_index, n)`, no self-loops); `root_weight` adds lin_r (no
  bias); `normalize` L2-normalises the output. Linears initialised like torch.nn.Linear (PyG's
  default). x may be a bipartite pair (x_src, x_dst). A may be a sampled `Block`
  (jaxsparse_tc.sampling): `layer(block, h)`, h [block.num_src, in] -> [block.num_dst, out],
  the targets aggregating their sampled neighbours (a repeated draw counts repeatedly).
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    aggr: str = "mean",
    normalize: bool = False,
    root_weight: bool = True,
    use_bias: bool = True,
    rngs: nnx.Rngs,
  ):
    if aggr not in ("mean", "add", "sum", "max"):
      raise ValueError(f"aggr must be 'mean', 'add', 'sum' or 'max'; got {aggr!r}")
    self.aggr, self.normalize = aggr, normalize
    self.lin_l = _torch_linear(in_features, out_features, use_bias=use_bias, rngs=rngs)
    self.lin_r = (
      _torch_linear(in_features, out_features, use_bias=False, rngs=rngs) if root_weight else None
    )

  def __call__(self, A, x):
    return layers.sage_conv(self, _get, A, x)


class MLP(nnx.Module):
  """Linear -> [BatchNorm] -> ReLU -> ... -> Linear (PyG's MLP with plain_last): the update
  network of GINConv. `sizes` = [in, hidden..., out]. `batch_norm`: BatchNorm over the rows
  (nodes) after each hidden Linear; call with `mask=` (a batch's node_mask) so that padding
  rows take no part in the statistics. Linears initialised like torch.nn.Linear."""

  def __init__(self, sizes, *, batch_norm: bool = False, dropout: float = 0.0, rngs: nnx.Rngs):
    sizes = list(sizes)
    if len(sizes) < 2:
      raise ValueError(f"MLP needs at least [in, out] sizes; got {sizes}")
    self.lins = _List([_torch_linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])
    self.norms = (
      _List([nnx.BatchNorm(b, momentum=0.9, epsilon=1e-5, rngs=rngs) for b in sizes[1:-1]])
      if batch_norm
      else None
    )
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, x, *, mask=None):
    m = None if mask is None else jnp.asarray(mask).reshape(-1, 1)
    norm = None if self.norms is None else (lambda i, h: self.norms[i](h, mask=m))
    return layers.mlp(self.lins, x, norm=norm, dropouts=[self.dropout] * len(self.lins))


class GINConv(nnx.Module):
  """Graph isomorphism network layer (Xu et al. 2019), PyG's GINConv:
  `nn((1 + eps) x_i + sum_{j -> i} x_j)`, the sum over A's edges (A =
  `graph.message_passing_matrix(edge_index, n)`, no self-loops).

  `nn`: the update network (any nnx module or function of [n, f]; an `MLP` is called with the
  `mask=` given to the layer). `eps` starts at `eps`; trainable (`nnx.Param`) with
  `train_eps`. x may be a bipartite pair (x_src, x_dst). A may be a sampled `Block`
  (jaxsparse_tc.sampling): `layer(block, h)`, h [block.num_src, in] -> [block.num_dst, out];
  `nn` then runs on the targets' rows, and `mask` defaults to the block's dst_mask.
  """

  def __init__(self, nn, *, eps: float = 0.0, train_eps: bool = False):
    self.nn = nn
    self.eps = (nnx.Param if train_eps else nnx.Variable)(jnp.asarray(eps, jnp.float32))

  def __call__(self, A, x, *, mask=None):
    mask = layers.block_mask(A, mask)
    fn = (lambda h: self.nn(h, mask=mask)) if isinstance(self.nn, MLP) else self.nn
    return layers.gin_conv(self, _get, A, x, fn)


class AGNNConv(nnx.Module):
  """Attention-based propagation (Thekumparampil et al. 2018), PyG's AGNNConv.

  out_i = sum_j softmax_j(beta * cos(x_i, x_j)) x_j over A's edges j -> i (include self-loops
  in A as PyG does). `beta` starts at 1; a trainable `nnx.Param` when `requires_grad`, else a
  fixed `nnx.Variable`.
  """

  def __init__(self, *, requires_grad: bool = True):
    kind = nnx.Param if requires_grad else nnx.Variable
    self.beta = kind(jnp.ones((), jnp.float32))

  def __call__(self, A, x):
    return layers.agnn_conv(self, _get, A, x)


class TransformerConv(nnx.Module):
  """Graph transformer convolution (Shi et al. 2021), PyG's TransformerConv.

  Multi-head dot-product attention over A's edges, scale 1/sqrt(out_features), one fused
  `sparse_attention` call (sddmm -> edge_softmax -> dropout -> spmm when attention dropout is
  active). `root_weight` adds `lin_skip(x)`; `beta` gates it as in PyG. `use_bias` applies to
  the query/key/value/skip linears (as in PyG); they are initialized like torch.nn.Linear.
  `edge_dim`: edge features (`edge_attr=` [E, edge_dim], A's input order) added to keys and
  values through `lin_edge` (composed sddmm/softmax/spmm path). `return_attention_weights`:
  returns (out, alpha), alpha a SparseMatrix [heads, nnz] on A's pattern. x may be a
  bipartite pair (x_src, x_dst).
  """

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
    rngs: nnx.Rngs,
  ):
    self.heads, self.concat = heads, concat
    width = heads * out_features
    self.lin_query = _torch_linear(in_features, width, use_bias=use_bias, rngs=rngs)
    self.lin_key = _torch_linear(in_features, width, use_bias=use_bias, rngs=rngs)
    self.lin_value = _torch_linear(in_features, width, use_bias=use_bias, rngs=rngs)
    self.lin_edge = (
      _torch_linear(edge_dim, width, use_bias=False, rngs=rngs) if edge_dim is not None else None
    )
    out_width = width if concat else out_features
    self.lin_skip = (
      _torch_linear(in_features, out_width, use_bias=use_bias, rngs=rngs) if root_weight else None
    )
    self.lin_beta = (
      _torch_linear(3 * out_width, 1, use_bias=False, rngs=rngs) if beta and root_weight else None
    )
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x, edge_attr=None, *, return_attention_weights: bool = False):
    return layers.transformer_conv(
      self,
      _get,
      A,
      x,
      edge_attr,
      attn_dropout=_active(self.dropout),
      return_attention_weights=return_attention_weights,
    )


class GraphTransformerLayer(nnx.Module):
  """Graph transformer block: multi-head sparse self-attention + feed-forward, residual + norm.

  Post-norm (Dwivedi & Bresson 2021; `norm_first=False`):
      x = LN(x + drop(O(attn_A(x))));  x = LN(x + drop(FF(x)))
  or pre-norm (`norm_first=True`): x = x + drop(O(attn_A(LN(x)))); x = x + drop(FF(LN(x))).
  attn_A: `heads` heads of dim // heads channels, Q/K/V/O linears with bias, scale
  1/sqrt(dim // heads), attention restricted to A's pattern (`sparse_attention`).
  FF: Linear(dim, ff_dim) -> ReLU -> dropout -> Linear(ff_dim, dim). LayerNorm eps 1e-5.
  """

  def __init__(
    self,
    dim: int,
    *,
    heads: int = 4,
    ff_dim: int | None = None,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    norm_first: bool = False,
    rngs: nnx.Rngs,
  ):
    if dim % heads:
      raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
    self.heads, self.norm_first = heads, norm_first
    ff_dim = ff_dim or 2 * dim
    self.lin_query = _torch_linear(dim, dim, rngs=rngs)
    self.lin_key = _torch_linear(dim, dim, rngs=rngs)
    self.lin_value = _torch_linear(dim, dim, rngs=rngs)
    self.lin_out = _torch_linear(dim, dim, rngs=rngs)
    self.ff1 = _torch_linear(dim, ff_dim, rngs=rngs)
    self.ff2 = _torch_linear(ff_dim, dim, rngs=rngs)
    self.norm1 = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)
    self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)

  def __call__(self, A, x):
    return layers.graph_transformer_layer(
      self, A, x, attn_dropout=_active(self.attn_dropout), dropouts=[self.dropout] * 3
    )


# -- two-layer node classifiers (the Cora example's models) -------------------------------------


class GCN(nnx.Module):
  """dropout -> GCNConv -> ReLU -> dropout -> GCNConv (Kipf & Welling's Cora model).

  Call with A = graph.gcn_norm(edge_index, n); returns logits [n, out_features].
  """

  def __init__(
    self, in_features: int, hidden: int, out_features: int, *, dropout: float = 0.5, rngs: nnx.Rngs
  ):
    self.conv1 = GCNConv(in_features, hidden, rngs=rngs)
    self.conv2 = GCNConv(hidden, out_features, rngs=rngs)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x):
    return layers.gcn((self.conv1, self.conv2), A, x, (self.dropout, self.dropout))


class GAT(nnx.Module):
  """dropout -> GATConv(heads, concat) -> ELU -> dropout -> GATConv(out_heads, mean).

  Velickovic et al.'s Cora model (8 heads x 8 channels, dropout 0.6 on features and attention).
  Call with A = graph.message_passing_matrix(edge_index, n, add_self_loops=True).
  """

  def __init__(
    self,
    in_features: int,
    hidden: int,
    out_features: int,
    *,
    heads: int = 8,
    out_heads: int = 1,
    dropout: float = 0.6,
    rngs: nnx.Rngs,
  ):
    self.conv1 = GATConv(in_features, hidden, heads=heads, dropout=dropout, rngs=rngs)
    self.conv2 = GATConv(
      heads * hidden, out_features, heads=out_heads, concat=False, dropout=dropout, rngs=rngs
    )
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x):
    return layers.gat((self.conv1, self.conv2), A, x, (self.dropout, self.dropout))


class AGNN(nnx.Module):
  """dropout -> Linear -> ReLU -> AGNNConv (fixed beta) -> AGNNConv (learned beta) -> dropout
  -> Linear (PyG's AGNN example). Call with A = message_passing_matrix(..., add_self_loops=True)."""

  def __init__(
    self, in_features: int, hidden: int, out_features: int, *, dropout: float = 0.5, rngs: nnx.Rngs
  ):
    self.lin1 = _torch_linear(in_features, hidden, rngs=rngs)
    self.prop1 = AGNNConv(requires_grad=False)
    self.prop2 = AGNNConv(requires_grad=True)
    self.lin2 = _torch_linear(hidden, out_features, rngs=rngs)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x):
    lins, props = (self.lin1, self.lin2), (self.prop1, self.prop2)
    return layers.agnn(lins, props, A, x, (self.dropout, self.dropout))


class GraphTransformer(nnx.Module):
  """dropout -> Linear(in, hidden) -> num_layers x GraphTransformerLayer -> dropout -> Linear.

  Call with A = message_passing_matrix(..., add_self_loops=True) (the attention mask).
  """

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
    rngs: nnx.Rngs,
  ):
    self.lin_in = _torch_linear(in_features, hidden, rngs=rngs)
    self.layers = _List(
      [
        GraphTransformerLayer(
          hidden,
          heads=heads,
          dropout=dropout,
          attn_dropout=attn_dropout,
          norm_first=norm_first,
          rngs=rngs,
        )
        for _ in range(num_layers)
      ]
    )
    self.lin_out = _torch_linear(hidden, out_features, rngs=rngs)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, A, x):
    drops = (self.dropout, self.dropout)
    return layers.graph_transformer(self.lin_in, self.layers, self.lin_out, A, x, drops)
