"""The implementation of jaxsparse_tc.sampling, whose docstring documents it."""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import sys
import time
from typing import Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src import extensions, integrity
from jaxsparse_tc._src.checks import int_arg
from jaxsparse_tc._src.integrity import WINDOW_ROWS
from jaxsparse_tc._src.nn.batch import Budget
from jaxsparse_tc._src.pattern import OPERAND_ALIGN, SCHEDULE_FIELDS, Pattern
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

_MAX_INDEX = 2**31 - 1  # local indices and CSR columns are int32


class SampledLayer(NamedTuple):
  """One sampled layer (hop) on the host, unpadded.

  targets: int64 [T] global ids of the layer's targets (the seeds for the first layer, else
    the previous layer's sources). sources: int64 [S] distinct global ids, `targets` first
    (`sources[:T] == targets`). rows, cols: int32 [E] each sampled edge's target and source as
    local indices (into targets and sources). edge_ids: int64 [E] each edge's id (its CSR
    position, or its column of edge_index for a sampler built from one).
  """

  targets: np.ndarray
  sources: np.ndarray
  rows: np.ndarray
  cols: np.ndarray
  edge_ids: np.ndarray


def _int(where: str, name: str, v, lo: int) -> int:
  return int_arg(f"{where}: {name}", v, low=lo, none_ok=False)


def _fanouts(where: str, fanouts) -> tuple[int, ...]:
  if not isinstance(fanouts, (list, tuple, range, np.ndarray)):
    raise ValueError(
      f"{where}: fanouts must be a sequence of integers (one per layer); got {fanouts!r}"
    )
  out = []
  for i, f in enumerate(fanouts):
    if isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, np.integer)) or f < -1:
      raise ValueError(
        f"{where}: fanouts[{i}] must be an integer >= 0, or -1 (every neighbour); got {f!r}"
      )
    out.append(int(f))
  if not out:
    raise ValueError(f"{where}: fanouts must name at least one layer; got {fanouts!r}")
  return tuple(out)


def _csr(where: str, indptr, indices, weights):
  """indptr (int64), indices (int32) and weights (float64 or None), checked."""
  ip = np.asarray(indptr)
  ix = np.asarray(indices)
  if ip.ndim != 1 or ip.shape[0] < 1 or ip.dtype.kind not in "iu":
    raise ValueError(
      f"{where}: indptr must be an integer array [num_nodes + 1]; got {ip.dtype} {ip.shape}"
    )
  if ix.ndim != 1 or (ix.size and ix.dtype.kind not in "iu"):
    raise ValueError(f"{where}: indices must be an integer array [nnz]; got {ix.dtype} {ix.shape}")
  n, nnz = ip.shape[0] - 1, ix.shape[0]
  if n > _MAX_INDEX:
    raise ValueError(f"{where}: at most {_MAX_INDEX} nodes are supported; got {n}")
  if ip[0] != 0 or ip[-1] != nnz or (n and np.any(np.diff(ip) < 0)):
    raise ValueError(
      f"{where}: indptr must be nondecreasing from 0 to len(indices)={nnz}; got "
      f"indptr[0]={ip[0]}, indptr[-1]={ip[-1]}"
    )
  if nnz and (ix.min() < 0 or ix.max() >= n):
    raise ValueError(
      f"{where}: indices hold node ids in [{ix.min()}, {ix.max()}], outside [0, num_nodes={n})"
    )
  w = None
  if weights is not None:
    w = np.asarray(weights)
    if w.dtype.kind not in "biuf":
      raise ValueError(f"{where}: weights must hold numbers; got dtype {w.dtype}")
    if w.shape != (nnz,):
      raise ValueError(
        f"{where}: weights must have shape [nnz={nnz}] (one per edge); got shape {w.shape}"
      )
    w = np.ascontiguousarray(w, np.float64)
    if nnz and not (np.all(np.isfinite(w)) and w.min() >= 0):
      raise ValueError(f"{where}: weights must be finite and >= 0; got min {w.min()}")
  return (
    np.ascontiguousarray(ip, np.int64),
    np.ascontiguousarray(ix, np.int32),
    w,
  )


def _seeds(where: str, seeds, num_nodes: int) -> np.ndarray:
  s = np.asarray(seeds)
  if s.ndim != 1 or (s.size and s.dtype.kind not in "iu"):
    raise ValueError(
      f"{where}: seeds must be a 1-D integer array of node ids; got {s.dtype} {s.shape}"
    )
  if s.size == 0:
    raise ValueError(f"{where}: seeds must hold at least one node id; got an empty array")
  if s.min() < 0 or s.max() >= num_nodes:
    raise ValueError(
      f"{where}: seeds hold node ids in [{s.min()}, {s.max()}], outside [0, num_nodes={num_nodes})"
    )
  s = s.astype(np.int64)
  if np.unique(s).size != s.size:
    raise ValueError(
      f"{where}: seeds must be distinct node ids; got {s.size - np.unique(s).size} repeats"
    )
  return s


class _Layout(NamedTuple):
  """The static description of a batch's host arrays packed one buffer per dtype (hashable: a
  pytree's aux data, the same for every batch of a sampler). treedef and specs (shape, dtype
  per leaf) of the tree (per-layer arrays, tail); groups: the leaves of each buffer, in order;
  blocks: per layer ((grouped of A, of A^T), source slots, target slots)."""

  treedef: jax.tree_util.PyTreeDef
  specs: tuple
  groups: tuple
  blocks: tuple


def _batch_layout(block_lengths, num_dst, batch_size: int) -> _Layout:
  """The packed layout of a sampler's batches, from its budgets: the batch tree (per layer its
  values, A's and A^T's Pattern, perm_t, perm_t_inv, input_to_format, edge_ids and the counts
  (edges, sources, targets) its masks are cut from; then the input nodes, the seeds and their
  counts), each leaf's shape and dtype, and the leaves of each dtype's buffer in the order the
  native pad_batch writes them (float32, int32, uint32)."""
  f32, i32, u32 = np.dtype(np.float32).str, np.dtype(np.int32).str, np.dtype(np.uint32).str
  per_layer = []
  for lengths in block_lengths:
    nnz, edges = lengths["nnz"], lengths["edges"]
    w = -(-lengths["num_slots"] // WINDOW_ROWS) + 1
    pattern = Pattern(
      window_col_ptr=((w,), i32),
      window_cols=((lengths["window_cols"],), i32),
      window_block_ptr=((w,), i32),
      block_bitmap=((lengths["blocks"], 2), u32),
      block_value_ptr=((lengths["blocks"] + 1,), i32),
      schedule=((lengths["schedule"], SCHEDULE_FIELDS), i32),
      rows=((nnz,), i32),
      cols=((nnz,), i32),
      row_entries=((nnz, 2), i32),
      row_schedule=((lengths["row_schedule"], 4), i32),
    )
    layer = (((nnz,), f32), pattern, pattern) + tuple(
      (shape, i32) for shape in ((nnz,), (nnz,), (edges,), (edges,), (3,))
    )
    per_layer.append(layer)
  tail = (((block_lengths[-1]["num_slots"],), i32), ((batch_size,), i32), ((2,), i32))
  is_spec = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str)  # noqa: E731
  specs, treedef = jax.tree_util.tree_flatten((per_layer, tail), is_leaf=is_spec)
  groups = tuple(tuple(i for i, (_, dt) in enumerate(specs) if dt == g) for g in (f32, i32, u32))
  blocks = tuple(
    ((lengths["grouped"], lengths["grouped"]), lengths["num_slots"], n_dst)
    for lengths, n_dst in zip(block_lengths, num_dst)
  )
  return _Layout(treedef, tuple(specs), groups, blocks)


def _unpack(buffers, layout: _Layout):
  """The batch's parts (blocks input side first, input_nodes, input_mask, seeds, seed_mask)
  cut from its buffers: slices, free inside a jitted step (XLA passes them to the kernels in
  place, so each starts at a multiple of OPERAND_ALIGN bytes, as pad_batch lays them)."""
  leaves = [None] * len(layout.specs)
  align = OPERAND_ALIGN // 4  # every buffer holds 4-byte elements
  for buf, members in zip(buffers, layout.groups):
    at = 0
    for i in members:
      shape = layout.specs[i][0]
      size = math.prod(shape)
      leaves[i] = buf[at : at + size].reshape(shape)
      at += -(-size // align) * align
  per_layer, (inputs, seeds, counts) = jax.tree_util.tree_unflatten(layout.treedef, leaves)
  first = lambda size, count: jnp.arange(size) < count  # noqa: E731  (a mask from its count)
  blocks = []
  for arrays, (grouped, n, n_dst) in zip(per_layer, layout.blocks):
    A = SparseMatrix._unchecked(*arrays[:6], shape=(n, n), grouped=grouped, padded=True)
    edge_ids, (E, S, T) = arrays[6], arrays[7]
    masks = first(edge_ids.shape[0], E), first(n, S), first(n_dst, T)
    blocks.append(Block(A, edge_ids, *masks, n_dst))
  tail = inputs, first(inputs.shape[0], counts[0]), seeds, first(seeds.shape[0], counts[1])
  return (tuple(blocks[::-1]), *tail)


@functools.lru_cache(maxsize=16)
def _unpacker(layout: _Layout):
  """_unpack as one jitted call, for a packed batch used outside a jitted function."""
  return jax.jit(functools.partial(_unpack, layout=layout))


def _caps(where: str, name: str, caps, layers: int) -> list:
  """Per-layer caps: None (no cap anywhere), or one entry per layer, each None or >= 1."""
  if caps is None:
    return [None] * layers
  caps = list(caps)
  if len(caps) != layers:
    raise ValueError(f"{where}: {name} must have one entry per layer ({layers}); got {len(caps)}")
  return [None if c is None else _int(where, f"{name}[{i}]", c, 1) for i, c in enumerate(caps)]


def _local_index(name: str, a) -> np.ndarray:
  """A sampled layer's local indices as int32 (pad_batch checks their range, natively). Wider
  integers are range-checked here first: the cast would wrap them."""
  a = np.asarray(a)
  if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
    raise ValueError(
      f"NeighborSampler.pad: {name} must be a 1-D integer array; got {a.dtype} {a.shape}"
    )
  if a.dtype != np.int32 and a.size and (a.min() < 0 or a.max() > _MAX_INDEX):
    raise ValueError(
      f"NeighborSampler.pad: {name} holds indices in [{a.min()}, {a.max()}], outside int32"
    )
  return np.ascontiguousarray(a, np.int32)


def _sample(
  indptr, indices, weights, seeds, fanouts, seed, replace, threads, edge_order=None
) -> list[SampledLayer]:
  raw = extensions.cpu_extension().sample_neighbors(
    indptr,
    indices,
    seeds,
    list(fanouts),
    seed=seed,
    replace=replace,
    weights=weights,
    edge_order=edge_order,
    threads=threads,
  )
  out, targets = [], seeds
  for d in raw:
    out.append(SampledLayer(targets, d["sources"], d["rows"], d["cols"], d["edge_ids"]))
    targets = d["sources"]
  return out


def sample_neighbors(
  indptr,
  indices,
  seeds,
  fanouts: Sequence[int],
  *,
  seed: int,
  replace: bool = False,
  weights=None,
  threads: int = 0,
) -> list[SampledLayer]:
  """Samples `len(fanouts)` layers of in-neighbours outwards from `seeds` (unpadded).

  indptr [num_nodes + 1], indices [nnz]: the graph in CSR with rows = targets (PyG's direction:
  row v lists the sources u of the edges u -> v, `csr_from_edge_index`). seeds: distinct node
  ids. fanouts[l]: neighbours each target of layer l draws; -1 takes all of them. Without
  `replace` a target with at most fanout neighbours takes all of them; with `replace` it makes
  fanout draws (a repeated edge appears repeatedly). weights [nnz] (>= 0): draws proportional
  to them (without replacement: successive draws, Efraimidis-Spirakis), zero-weight edges never.
  seed: an integer >= 0; the result depends on it only, not on `threads` (0: every core).
  Returns a SampledLayer per layer, the seeds' layer first.
  """
  where = "sample_neighbors"
  fanouts = _fanouts(where, fanouts)
  seed = _int(where, "seed", seed, 0)
  threads = _int(where, "threads", threads, 0)
  ip, ix, w = _csr(where, indptr, indices, weights)
  s = _seeds(where, seeds, ip.shape[0] - 1)
  return _sample(ip, ix, w, s, fanouts, seed % 2**64, bool(replace), threads)


def csr_from_edge_index(edge_index, num_nodes: int):
  """The CSR (rows = targets) of edge_index [2, E] (a message flows edge_index[0] ->
  edge_index[1]): (indptr int64 [num_nodes + 1], indices int32 [E], edge_order int64 [E]),
  edge_order[k] the column of edge_index at CSR position k (sources ascending inside a row
  only as edge_index lists them: the sort by target is stable)."""
  n = _int("csr_from_edge_index", "num_nodes", num_nodes, 0)
  ei = integrity.edge_index_array("csr_from_edge_index", edge_index, n).astype(np.int64)
  order = np.argsort(ei[1], kind="stable")
  indptr = np.zeros(n + 1, np.int64)
  np.cumsum(np.bincount(ei[1], minlength=n), out=indptr[1:])
  return indptr, ei[0, order].astype(np.int32), order.astype(np.int64)


# -- fixed-shape blocks ----------------------------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class Block:
  """One padded bipartite layer (a pytree), DGL's block with fixed shapes.

  A: SparseMatrix [num_src, num_src] (square: the padding mechanism of nn.batch.padded_matrix),
    rows = target local index, columns = source local index; value 1 per sampled edge (a
    repeated draw sums), 0 on the padding's dummy entries, which lie in padding rows and
    columns only. Input order = the edge slots: `A.values_from_input(v)` takes [num_edges].
  edge_ids: int32 [num_edges] the edge of each slot (0 on padding; see SampledLayer).
  edge_mask: bool [num_edges]. src_mask: bool [num_src]. dst_mask: bool [num_dst].
  num_dst (static): rows of the layer's output, the next block's num_src (the seed batch size
    for the last block); `dst(h)` cuts or zero-pads [num_src, ...] rows to it.
  """

  def __init__(self, A, edge_ids, edge_mask, src_mask, dst_mask, num_dst: int):
    self.A = A
    self.edge_ids = edge_ids
    self.edge_mask = edge_mask
    self.src_mask = src_mask
    self.dst_mask = dst_mask
    self.num_dst = num_dst

  def tree_flatten(self):
    return (self.A, self.edge_ids, self.edge_mask, self.src_mask, self.dst_mask), self.num_dst

  @classmethod
  def tree_unflatten(cls, num_dst, children):
    return cls(*children, num_dst)

  @property
  def num_src(self) -> int:
    return self.src_mask.shape[0]

  @property
  def num_edges(self) -> int:
    return self.edge_mask.shape[0]

  def dst(self, h):
    """The target rows of h [num_src, ...] (targets are the sources' prefix), as
    [num_dst, ...]: cut, or padded with zero rows when num_dst > num_src."""
    h = jnp.asarray(h)
    k = h.shape[0]
    if k >= self.num_dst:
      return h[: self.num_dst]
    return jnp.pad(h, [(0, self.num_dst - k)] + [(0, 0)] * (h.ndim - 1))

  def __repr__(self) -> str:
    return (
      f"Block(num_src={self.num_src}, num_dst={self.num_dst}, num_edges={self.num_edges}, "
      f"nnz={self.A.nnz})"
    )


@jax.tree_util.register_pytree_node_class
class SampledBatch:
  """A padded mini-batch (a pytree): every array has the same shape in every batch of a sampler.

  blocks: tuple of Block, input side first (DGL's order): blocks[0] consumes
    `x[input_nodes]`, blocks[-1] produces the seeds' rows.
  input_nodes: int32 [blocks[0].num_src] global ids of the outermost sources (0 on padding).
  input_mask: bool, True on real input nodes.
  seeds: int32 [batch_size] the batch's seed ids (0 on padding); seed_mask: bool, True on real
    seeds (mask the loss with it).

  A sampler's batch travels packed: its leaves are one device buffer per dtype, and the fields
  above are cut from them where first read (inside a jitted step: slices of its arguments, so
  the step takes 3 arrays instead of ~50, and no call cuts them apart on the way).
  """

  def __init__(self, blocks, input_nodes, input_mask, seeds, seed_mask):
    self._parts = (tuple(blocks), input_nodes, input_mask, seeds, seed_mask)
    self._packed = None

  @classmethod
  def _from_buffers(cls, buffers, layout: _Layout) -> "SampledBatch":
    batch = cls.__new__(cls)
    batch._parts, batch._packed = None, (tuple(buffers), layout)
    return batch

  def _fields(self) -> tuple:
    if self._parts is None:
      buffers, layout = self._packed
      traced = any(isinstance(b, jax.core.Tracer) for b in buffers)
      self._parts = _unpack(buffers, layout) if traced else _unpacker(layout)(buffers)
    return self._parts

  blocks = property(lambda self: self._fields()[0])
  input_nodes = property(lambda self: self._fields()[1])
  input_mask = property(lambda self: self._fields()[2])
  seeds = property(lambda self: self._fields()[3])
  seed_mask = property(lambda self: self._fields()[4])

  def tree_flatten(self):
    if self._packed is not None:
      return self._packed[0], self._packed[1]
    return self._parts, None

  @classmethod
  def tree_unflatten(cls, aux, children):
    if aux is not None:
      return cls._from_buffers(children, aux)
    return cls(*children)

  def __repr__(self) -> str:
    return f"SampledBatch(batch_size={self.seed_mask.shape[0]}, blocks={list(self.blocks)})"


class NeighborSampler:
  """Samples padded mini-batches of fixed shapes from one graph (PyG's NeighborLoader sampling,
  DGL's sample_neighbors + blocks), so that one compiled program serves every batch.

  indptr, indices, weights: the graph in CSR, rows = targets (see sample_neighbors;
  `from_edge_index` builds it from edge_index). fanouts: per layer, the seeds' layer first.
  batch_size: most seeds per batch. max_sources: None, or a cap per layer on the distinct
  sources (default and most: targets x (1 + fanout), and the node count); max_edges: the same
  for the sampled edges (default and most: targets x fanout); a batch exceeding a cap raises
  ValueError. The defaults are worst cases, far above typical batches: caps near what batches
  hold make the padded blocks, their format build in `pad` and the device's work smaller.
  threads: sampling threads (0: every core).

  Budgets (`budgets`, one nn.batch.Budget per layer): targets T_1 = batch_size and
  T_{l+1} = S_l; sources S_l <= T_l (1 + f_l); edges E_l <= T_l f_l, f_l the fanout (for -1
  the largest in-degree). Every block is padded to its budget as nn.batch.padded_matrix pads
  (`pad` builds the same arrays in one native call).
  """

  def __init__(
    self,
    indptr,
    indices,
    fanouts: Sequence[int],
    *,
    batch_size: int,
    weights=None,
    replace: bool = False,
    max_sources: Sequence[int | None] | None = None,
    max_edges: Sequence[int | None] | None = None,
    threads: int = 0,
    edge_order=None,
  ):
    where = "NeighborSampler"
    self.fanouts = _fanouts(where, fanouts)
    self.batch_size = _int(where, "batch_size", batch_size, 1)
    self.threads = _int(where, "threads", threads, 0)
    self.replace = bool(replace)
    self.indptr, self.indices, self.weights = _csr(where, indptr, indices, weights)
    self.num_nodes = self.indptr.shape[0] - 1
    self._edge_order = None
    if edge_order is not None:
      self._edge_order = np.ascontiguousarray(edge_order, np.int64)
      if self._edge_order.shape != self.indices.shape:
        raise ValueError(
          f"{where}: edge_order must hold one edge id per CSR entry, shape "
          f"{self.indices.shape}; got shape {self._edge_order.shape}"
        )
    L = len(self.fanouts)
    caps = _caps(where, "max_sources", max_sources, L)
    edge_caps = _caps(where, "max_edges", max_edges, L)
    degree = np.diff(self.indptr)
    max_degree = int(degree.max()) if degree.size else 0
    nnz = int(self.indices.shape[0])
    budgets, t = [], self.batch_size
    self.max_sources, self.max_edges = [], []
    for f, cap, edge_cap in zip(self.fanouts, caps, edge_caps):
      f_eff = max_degree if f < 0 else f
      e = t * f_eff if self.replace and f >= 0 else min(t * f_eff, nnz)
      if edge_cap is not None:
        e = min(e, edge_cap)
      self.max_edges.append(e)
      s = min(t + e, max(self.num_nodes, 1))
      if cap is not None:
        if cap < t:
          raise ValueError(
            f"{where}: max_sources must be >= the layer's targets ({t}, the sources include "
            f"them); got {cap}"
          )
        s = min(s, cap)
      self.max_sources.append(s)
      budgets.append(Budget(nodes=max(s, 1), edges=max(e, 1), graphs=1))
      t = s
    self.budgets = tuple(budgets)
    # Budget's derived lengths take a fixed-point loop: computed once, passed to every block.
    self._block_lengths = tuple(
      dict(
        num_slots=b.num_nodes,
        nnz=b.nnz,
        edges=b.edges,
        window_cols=b.format_sizes()["window_cols"],
        blocks=b.format_sizes()["blocks"],
        schedule=b.format_sizes()["schedule"],
        row_schedule=b.format_sizes()["row_schedule"],
        grouped=b.is_grouped,
      )
      for b in self.budgets
    )
    # The rows each layer's output needs: the next layer's (towards the seeds) source slots.
    self._num_dst = tuple([self.batch_size] + [b.num_nodes for b in self.budgets[:-1]])
    fields = ("num_slots", "nnz", "edges", "window_cols", "blocks", "schedule", "row_schedule")
    self._budget_fields = [
      [int(x[f]) for f in fields] + [int(x["grouped"])] for x in self._block_lengths
    ]
    self._layout = _batch_layout(self._block_lengths, self._num_dst, self.batch_size)

  @classmethod
  def from_edge_index(cls, edge_index, num_nodes: int, fanouts, *, edge_weight=None, **kwargs):
    """A sampler of the graph edge_index [2, E] (PyG's direction); edge_ids are columns of
    edge_index and edge_weight [E] (or None) weighs the draws."""
    indptr, indices, order = csr_from_edge_index(edge_index, num_nodes)
    w = None
    if edge_weight is not None:
      w = np.asarray(edge_weight)
      if w.shape != (order.shape[0],):
        raise ValueError(
          f"NeighborSampler.from_edge_index: edge_weight must have shape [E={order.shape[0]}]; "
          f"got shape {w.shape}"
        )
      w = w[order]
    return cls(indptr, indices, fanouts, weights=w, edge_order=order, **kwargs)

  def suggest_caps(
    self, seeds, *, batches: int = 16, slack: float = 1.25, seed: int = 0
  ) -> tuple[list[int], list[int]]:
    """(max_sources, max_edges) for a sampler of this graph that trains on `seeds`: `slack`
    times the largest of `batches` sampled batches of batch_size random seeds, per layer,
    rounded up to a multiple of 256 and at most this sampler's own caps. Typical batches hold
    a fraction of the worst-case budgets, and every padded slot costs host time in `pad` and
    device time in the kernels; a batch over a cap raises ValueError, so keep slack well
    above 1 (batch sums over many seeds vary by a few percent)."""
    where = "NeighborSampler.suggest_caps"
    s = _seeds(where, seeds, self.num_nodes)
    batches = _int(where, "batches", batches, 1)
    seed = _int(where, "seed", seed, 0)
    if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not slack >= 1:
      raise ValueError(f"{where}: slack must be a number >= 1; got {slack!r}")
    rng = np.random.default_rng([seed, 1])
    most = np.zeros((len(self.fanouts), 2), np.int64)
    for i in range(batches):
      pick = rng.choice(s, min(self.batch_size, s.size), replace=False)
      layers = self.sample(pick, seed=_batch_seed(seed, 2**32, i))
      sizes = [(x.sources.shape[0], x.rows.shape[0]) for x in layers]
      most = np.maximum(most, np.array(sizes, np.int64))
    up = lambda v, cap: int(min(-(-int(np.ceil(v * slack)) // 256) * 256, cap))
    sources, t = [], self.batch_size
    for v, c in zip(most[:, 0], self.max_sources):
      t = max(up(v, c), t)  # the sources include the targets: a cap is >= the one before
      sources.append(t)
    return sources, [max(up(v, c), 1) for v, c in zip(most[:, 1], self.max_edges)]

  def _threads(self, where: str, threads) -> int:
    """A call's thread count: `threads` (None: the sampler's own), 0 meaning every core."""
    threads = self.threads if threads is None else _int(where, "threads", threads, 0)
    return threads or os.cpu_count() or 1

  def sample(self, seeds, seed: int, *, threads: int | None = None) -> list[SampledLayer]:
    """The unpadded layers of one batch of seeds (at most batch_size), sampled with `seed`
    (the result depends on it only). threads: this call's (None: the sampler's)."""
    s = _seeds("NeighborSampler.sample", seeds, self.num_nodes)
    if s.size > self.batch_size:
      raise ValueError(
        f"NeighborSampler.sample: seeds must hold at most batch_size={self.batch_size} ids; "
        f"got {s.size}"
      )
    seed = _int("NeighborSampler.sample", "seed", seed, 0) % 2**64
    threads = self._threads("NeighborSampler.sample", threads)
    return _sample(
      self.indptr,
      self.indices,
      self.weights,
      s,
      self.fanouts,
      seed,
      self.replace,
      threads,
      self._edge_order,
    )

  def pad(self, layers: Sequence[SampledLayer], *, threads: int | None = None) -> SampledBatch:
    """The fixed-shape batch of `sample`'s layers, on the device. threads: this call's (None:
    the sampler's)."""
    if len(layers) != len(self.fanouts):
      raise ValueError(
        f"NeighborSampler.pad: layers must hold {len(self.fanouts)} layers; got {len(layers)}"
      )
    threads = self._threads("NeighborSampler.pad", threads)
    rows, cols, edge_ids, sources, targets = [], [], [], [], []
    for i, layer in enumerate(layers):
      S, E = layer.sources.shape[0], layer.rows.shape[0]
      if E > self.max_edges[i]:
        raise ValueError(
          f"NeighborSampler: layer {i} sampled {E} edges, over max_edges[{i}]="
          f"{self.max_edges[i]}: raise the cap"
        )
      if S > self.max_sources[i]:
        raise ValueError(
          f"NeighborSampler: layer {i} sampled {S} distinct sources, over max_sources[{i}]="
          f"{self.max_sources[i]}: raise the cap"
        )
      rows.append(_local_index(f"layers[{i}].rows", layer.rows))
      cols.append(_local_index(f"layers[{i}].cols", layer.cols))
      edge_ids.append(np.ascontiguousarray(layer.edge_ids, np.int64))
      sources.append(S)
      targets.append(layer.targets.shape[0])
    # The whole batch in one native call (each layer's block as nn.batch.padded_matrix builds
    # it for edge_index [cols; rows], packed per dtype), the GIL released throughout; one
    # transfer per dtype (device_put's cost is mostly per array, and a batch has ~50).
    buffers = extensions.cpu_extension().pad_batch(
      rows,
      cols,
      edge_ids,
      sources,
      targets,
      self._budget_fields,
      np.ascontiguousarray(layers[-1].sources, np.int64),
      self._block_lengths[-1]["num_slots"],
      np.ascontiguousarray(layers[0].targets, np.int64),
      self.batch_size,
      threads=threads,
    )
    return SampledBatch._from_buffers(jax.device_put(list(buffers)), self._layout)

  def batch(self, seeds, seed: int, *, threads: int | None = None) -> SampledBatch:
    """`pad(sample(seeds, seed))`, both with `threads` (None: the sampler's)."""
    return self.pad(self.sample(seeds, seed, threads=threads), threads=threads)


def _batch_seed(seed: int, epoch: int, index: int) -> int:
  lo, hi = np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint32)
  return int(lo) | (int(hi) << 32)


class NeighborLoader:
  """Iterates a sampler's padded batches over shuffled seeds (PyG's NeighborLoader).

  seeds: the node ids to train on (distinct). Each iteration (epoch) shuffles them (when
  `shuffle`) from `seed` and the epoch count, cuts them into batches of the sampler's
  batch_size, and samples each with a seed derived from (seed, epoch, batch index): the batches
  depend on `seed` only. Sampling runs on `prefetch` host threads, that many batches ahead of
  the consumer (0: inline); a sampler with threads=0 gives each batch cpu_count // prefetch
  threads (the native sampling and format build release the GIL, so batches build side by
  side; on 16 cores, R-MAT 2^22: 291 batches/s at prefetch 2, 455 at 4, 671 at 8, 652 at 12).
  progress: a progress line on stderr.
  """

  def __init__(
    self,
    sampler: NeighborSampler,
    seeds,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    prefetch: int = 4,
    progress: bool = False,
  ):
    if not isinstance(sampler, NeighborSampler):
      raise TypeError(
        f"NeighborLoader: sampler must be a NeighborSampler; got {type(sampler).__name__}"
      )
    self.sampler = sampler
    self.seeds = _seeds("NeighborLoader", seeds, sampler.num_nodes)
    self.shuffle = bool(shuffle)
    self.seed = _int("NeighborLoader", "seed", seed, 0)
    self.drop_last = bool(drop_last)
    self.prefetch = _int("NeighborLoader", "prefetch", prefetch, 0)
    self.progress = bool(progress)
    self.epoch = 0

  def seed_batches(self, epoch: int | None = None) -> list[np.ndarray]:
    """The seed ids of each batch of an epoch (the order NeighborLoader iterates)."""
    epoch = self.epoch if epoch is None else epoch
    order = self.seeds
    if self.shuffle:
      order = np.random.default_rng([self.seed, epoch]).permutation(order)
    b = self.sampler.batch_size
    out = [order[i : i + b] for i in range(0, order.shape[0], b)]
    if self.drop_last and out and out[-1].shape[0] < b:
      out.pop()
    return out

  def __len__(self) -> int:
    return len(self.seed_batches())

  def __iter__(self) -> Iterator[SampledBatch]:
    epoch = self.epoch
    batches = self.seed_batches(epoch)
    self.epoch += 1
    # Workers share the cores: a sampler left at every core (threads=0) gets an equal share per
    # batch in flight, so that `prefetch` batches building at once do not oversubscribe them.
    threads = self.sampler.threads or max(1, (os.cpu_count() or 1) // max(self.prefetch, 1))
    make = lambda i: self.sampler.batch(  # noqa: E731
      batches[i], _batch_seed(self.seed, epoch, i), threads=threads
    )
    start = time.perf_counter()
    for i, batch in enumerate(self._batches(make, len(batches))):
      yield batch
      if self.progress:
        rate = (i + 1) / max(time.perf_counter() - start, 1e-9)
        end = "\n" if i + 1 == len(batches) else ""
        print(
          f"\rNeighborLoader epoch {epoch}: {i + 1}/{len(batches)} batches, {rate:.1f} batches/s",
          end=end,
          file=sys.stderr,
          flush=True,
        )

  def _batches(self, make, count: int) -> Iterator[SampledBatch]:
    if self.prefetch == 0:
      for i in range(count):
        yield make(i)
      return
    # A worker per batch in flight: sampling and the format build release the GIL, so batches
    # build in parallel on a multi-core host (each depends on its index only, not on timing).
    with concurrent.futures.ThreadPoolExecutor(self.prefetch) as pool:
      pending = [pool.submit(make, i) for i in range(min(self.prefetch, count))]
      for i in range(count):
        if i + self.prefetch < count:
          pending.append(pool.submit(make, i + self.prefetch))
        yield pending[i].result()
        pending[i] = None


# Pickles and reprs name the classes by their public module.
for _cls in (SampledLayer, Block, SampledBatch, NeighborSampler, NeighborLoader):
  _cls.__module__ = "jaxsparse_tc.sampling"
del _cls
