"""The implementation of jaxsparse_tc.nn.batch, whose docstring documents it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import operator
from typing import Any, Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src import integrity, padding
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src.options import FormatOptions
from jaxsparse_tc._src.pattern import Pattern
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

_TILE = 8  # dummy entries fill dense 8x8 tiles (one block each, in A and in A^T)
_MAX_TILES_PER_WINDOW = 32  # keeps grouped schedules possible and dummy rows short


class _GraphFields(NamedTuple):
  edge_index: np.ndarray
  num_nodes: int
  x: Any = None
  edge_attr: Any = None
  y: Any = None


class Graph(_GraphFields):
  """One graph on the host (PyG's `Data`), checked when constructed.

  edge_index: [2, e] of an integer dtype (kept as a numpy array), node ids in [0, num_nodes);
  a message flows from `edge_index[0]` to `edge_index[1]`. num_nodes: node count (an
  integer >= 0). x: node features [num_nodes, ...] or None. edge_attr: edge features
  [e, ...] (input order) or None. y: a graph label (scalar or array), node labels
  [num_nodes, ...], or None. x, edge_attr and y hold numbers (bool, integer or float).
  Anything else raises ValueError naming the field, what it expects and what it got;
  `_replace` checks again.
  """

  __slots__ = ()

  def __new__(cls, edge_index, num_nodes, x=None, edge_attr=None, y=None):
    return super().__new__(cls, *_checked_fields("Graph", edge_index, num_nodes, x, edge_attr, y))

  @classmethod
  def _make(cls, iterable):
    return cls(*iterable)


def _numeric(where: str, name: str, v) -> np.ndarray:
  a = np.asarray(v)
  kind = a.dtype.kind
  if kind not in "biuf" and a.dtype != jnp.bfloat16:
    raise ValueError(
      f"{where}: {name} must hold numbers (bool, integer or float); got dtype {a.dtype}"
    )
  return a


def _checked_fields(where: str, edge_index, num_nodes, x, edge_attr, y) -> tuple:
  """A graph's fields, checked (see Graph); edge_index as a numpy integer array."""
  if isinstance(num_nodes, (bool, np.bool_)):
    raise ValueError(f"{where}: num_nodes must be a non-negative integer; got {num_nodes!r}")
  try:
    n = operator.index(num_nodes)
  except TypeError:
    raise ValueError(
      f"{where}: num_nodes must be a non-negative integer; got {num_nodes!r} "
      f"({type(num_nodes).__name__})"
    ) from None
  if n < 0:
    raise ValueError(f"{where}: num_nodes must be a non-negative integer; got {n}")
  ei = integrity.edge_index_array(where, edge_index, n)
  e = ei.shape[1]
  if x is not None:
    a = _numeric(where, "x", x)
    if a.ndim < 1 or a.shape[0] != n:
      raise ValueError(
        f"{where}: x must have shape [num_nodes={n}, ...] (one row per node); got shape {a.shape}"
      )
  if edge_attr is not None:
    a = _numeric(where, "edge_attr", edge_attr)
    if a.ndim < 1 or a.shape[0] != e:
      raise ValueError(
        f"{where}: edge_attr must have shape [E={e}, ...] (one row per edge of edge_index); "
        f"got shape {a.shape}"
      )
  if y is not None:
    _numeric(where, "y", y)
  return ei, n, x, edge_attr, y


def _as_graphs(graphs, where: str) -> list:
  """`graphs` as a list of checked Graphs: Graph instances are checked when built; any other
  object with Graph's fields (e.g. PyG-like records) is checked here, named by its index."""
  if isinstance(graphs, Graph):
    raise TypeError(f"{where} takes a sequence of graphs; got a single Graph")
  out = []
  for i, g in enumerate(graphs):
    if not isinstance(g, Graph):
      try:
        fields = [
          getattr(g, f) if f in ("edge_index", "num_nodes") else getattr(g, f, None)
          for f in Graph._fields
        ]
      except AttributeError:
        raise TypeError(
          f"{where}: graphs[{i}] is a {type(g).__name__}, not a Graph (edge_index, num_nodes, "
          "x, edge_attr, y)"
        ) from None
      g = _GraphFields.__new__(Graph, *_checked_fields(f"{where}: graphs[{i}]", *fields))
    out.append(g)
  return out


def _positive_int(where: str, name: str, v) -> int:
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
    raise ValueError(f"{where}: {name} must be a positive integer; got {v!r}")
  return int(v)


def _ceil8(k: int) -> int:
  return -(-int(k) // 8) * 8


def _reserve_tiles(nnz: int) -> int:
  """Smallest T such that T x min(T, 32) dummy tiles hold `nnz` entries."""
  t = 1
  while _TILE * _TILE * t * min(t, _MAX_TILES_PER_WINDOW) < nnz:
    t += 1
  return t


@dataclasses.dataclass(frozen=True)
class Budget:
  """Padding budget of a batch: real capacities, and every padded array length they imply.

  Attributes:
    nodes: most real nodes per batch.
    edges: edge slots per batch (input edges, not counting self-loops added by the batch).
    graphs: graph slots per batch.
    add_self_loops: batches add one self-loop per node (PyG's remove_self_loops +
      add_self_loops: an existing loop's value is replaced by 1; padding nodes get zero-valued
      loops, so that every non-empty row holds its loop): what GCN (with
      `graph.normalize_symmetric`) and GAT expect; GIN and SAGE use False.
    max_degree: largest in- or out-degree of any graph (counting its added self-loop), when
      known (`for_dataset`): it tightens the row-schedule bound and allows grouped schedules.
    grouped: whether patterns take a grouped schedule (docs/FORMAT.md); None: when possible
      (fewer than 65,536 nonzeros and max_degree <= 32).

  Derived (properties): `num_nodes` (node slots: nodes, a padding reserve for the dummy tiles
  and an empty last window), `nnz`, and the per-orientation format lengths `format_sizes()`.
  """

  nodes: int
  edges: int
  graphs: int
  add_self_loops: bool = False
  max_degree: int | None = None
  grouped: bool | None = None

  def __post_init__(self):
    for name in ("nodes", "edges", "graphs"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
        raise ValueError(f"Budget.{name} must be a positive integer; got {v!r}")
    md = self.max_degree
    if md is not None and (not isinstance(md, (int, np.integer)) or isinstance(md, bool) or md < 0):
      raise ValueError(f"Budget.max_degree must be None or an integer >= 0; got {md!r}")
    if self.grouped is not None and not isinstance(self.grouped, (bool, np.bool_)):
      raise ValueError(f"Budget.grouped must be None, True or False; got {self.grouped!r}")
    if self.grouped and not self._can_group():
      raise ValueError(
        f"Budget(grouped=True) needs fewer than {pattern_lib.SMALL_GRAPH_NNZ} nonzeros (this "
        f"budget has {self.nnz}) and a known max_degree <= {pattern_lib.GROUPED_MAX_BLOCKS}"
      )

  @classmethod
  def for_dataset(
    cls,
    graphs: Sequence[Graph],
    batch_size: int,
    *,
    add_self_loops: bool = False,
    slack: float = 3.0,
  ) -> "Budget":
    """A budget for batches of `batch_size` graphs drawn from `graphs`.

    Node and edge capacities are batch_size x mean + `slack` standard deviations of a random
    batch's sum (so most shuffled batches hold batch_size graphs; GraphLoader closes the rare
    larger one early), and at least the largest graph.
    """
    _positive_int("Budget.for_dataset", "batch_size", batch_size)
    if (
      isinstance(slack, bool)
      or not isinstance(slack, (int, float, np.number))
      or not (math.isfinite(slack) and slack >= 0)
    ):
      raise ValueError(f"Budget.for_dataset: slack must be a finite number >= 0; got {slack!r}")
    graphs = _as_graphs(graphs, "Budget.for_dataset")
    if not graphs:
      raise ValueError("Budget.for_dataset needs at least one graph")
    n = np.array([int(g.num_nodes) for g in graphs], np.float64)
    e = np.array([np.shape(g.edge_index)[1] for g in graphs], np.float64)

    def capacity(v):
      k = min(batch_size, v.size)
      return int(max(math.ceil(k * v.mean() + slack * math.sqrt(k) * v.std()), v.max(), 1))

    loops = 1 if add_self_loops else 0
    degree = 0
    for g in graphs:
      ei = np.asarray(g.edge_index)
      if ei.size:
        degree = max(degree, int(np.bincount(ei[0]).max()), int(np.bincount(ei[1]).max()))
    return cls(
      nodes=capacity(n),
      edges=capacity(e),
      graphs=min(batch_size, len(graphs)),
      add_self_loops=add_self_loops,
      max_degree=degree + loops,
    )

  # -- derived sizes ------------------------------------------------------------------------------
  def _sizes(self) -> tuple[int, int]:
    # With self-loops on every node slot but the last window's, nnz depends on the node slots,
    # which depend (through the dummy tiles' reserve) on nnz: iterate to the fixed point.
    tiles = 1
    while True:
      n = _ceil8(self.nodes) + 8 * tiles + 8
      nnz = self.edges + (n - 8 if self.add_self_loops else 0)
      need = _reserve_tiles(nnz)
      if need <= tiles:
        return n, nnz
      tiles = need

  @property
  def nnz(self) -> int:
    """Nonzeros of every batch's matrix: edges, self-loops, then zero dummies."""
    return self._sizes()[1]

  @property
  def num_nodes(self) -> int:
    """Node slots: the real capacity (rounded to 8), the dummy tiles' reserve and one empty
    window at the end (its schedule items are the ones repeated as padding)."""
    return self._sizes()[0]

  def _can_group(self) -> bool:
    return (
      self.nnz < pattern_lib.SMALL_GRAPH_NNZ
      and self.max_degree is not None
      and self.max_degree <= pattern_lib.GROUPED_MAX_BLOCKS
    )

  @property
  def is_grouped(self) -> bool:
    return self._can_group() if self.grouped is None else bool(self.grouped)

  def format_sizes(self) -> dict:
    """Padded lengths of one orientation's arrays (the same for A and A^T: square)."""
    nnz, n = self.nnz, self.num_nodes
    windows = n // 8
    cols = min(nnz, windows * n)  # a condensed column per (window, column) pair with a nonzero
    blocks = (cols + 7 * windows) // 8  # sum_w ceil(c_w / 8) <= (C + 7 W) / 8
    if self.is_grouped:
      # pieces 1 (<= 4 blocks), 2 (5..9), 4 (10..32): extra pieces <= 3/10 of a window's blocks
      items = windows + (3 * blocks) // 10
    else:
      items = pattern_lib.window_items_bound(windows, blocks, nnz)
    cap = pattern_lib.row_cta_entries(pattern_lib.row_piece(nnz))
    long_rows = self.max_degree is None or self.max_degree > cap
    row_items = n + (nnz // cap if long_rows else 0)
    return {"window_cols": cols, "blocks": blocks, "schedule": items, "row_schedule": row_items}

  def fits(self, nodes: int, edges: int, graphs: int) -> bool:
    return nodes <= self.nodes and edges <= self.edges and graphs <= self.graphs


@jax.tree_util.register_pytree_node_class
class GraphBatch:
  """A padded batch (a pytree: pass it to jitted functions whole).

  A: SparseMatrix [num_nodes, num_nodes], rows = targets; values 1 on edges (and on added
    self-loops), 0 on dummy entries. Input order = the edge slots (`A.values_from_input(v)`
    takes [num_edges] values; padding slots land on dummy entries).
  x: [num_nodes, ...] node features (zeros on padding) or None.
  edge_index: int32 [2, num_edges] edge slots (padding slots: dummy entries among padding nodes).
  edge_attr: [num_edges, ...] (zeros on padding slots) or None.
  y: graph labels [num_graphs, ...] or node labels [num_nodes, ...] (zeros on padding), or None.
  node_graph: int32 [num_nodes], the graph of each node; `num_graphs` on padding nodes (segment
    reductions with num_segments=num_graphs drop them).
  node_mask, edge_mask, graph_mask: bool, True on real entries.
  """

  def __init__(self, A, x, edge_index, edge_attr, y, node_graph, node_mask, edge_mask, graph_mask):
    self.A = A
    self.x = x
    self.edge_index = edge_index
    self.edge_attr = edge_attr
    self.y = y
    self.node_graph = node_graph
    self.node_mask = node_mask
    self.edge_mask = edge_mask
    self.graph_mask = graph_mask

  _FIELDS = (
    "A",
    "x",
    "edge_index",
    "edge_attr",
    "y",
    "node_graph",
    "node_mask",
    "edge_mask",
    "graph_mask",
  )

  def tree_flatten(self):
    return tuple(getattr(self, f) for f in self._FIELDS), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)

  @property
  def num_graphs(self) -> int:
    """Graph slots (static): the num_segments of pooling."""
    return self.graph_mask.shape[0]

  @property
  def num_nodes(self) -> int:
    return self.node_mask.shape[0]

  def __repr__(self) -> str:
    return (
      f"GraphBatch(num_nodes={self.num_nodes}, num_edges={self.edge_mask.shape[0]}, "
      f"num_graphs={self.num_graphs}, nnz={self.A.nnz})"
    )


# -- building one batch ----------------------------------------------------------------------------


def _dummy_entries(
  count: int, first: int, n: int, skip_diagonal: bool
) -> tuple[np.ndarray, np.ndarray]:
  """`count` distinct (row, col) positions among node slots [first, n - 8), in dense 8x8 tiles
  spread over diagonals (at most 32 tiles per row or column window), off the diagonal when
  `skip_diagonal` (where the padding nodes' self-loops are)."""
  if count == 0:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  span = (n - 8 - first) // 8
  capacity = span * min(span, _MAX_TILES_PER_WINDOW) * 64 - (8 * span if skip_diagonal else 0)
  if span < 1 or count > capacity:
    raise ValueError(
      f"internal: no room for {count} dummy entries in {max(span, 0)} padding "
      "windows (the budget's reserve should guarantee it)"
    )
  # Tile k sits at tile row k % span, tile column (k % span + k // span) % span: the first
  # `span` tiles are the diagonal ones, each of which loses its 8 diagonal entries.
  want = count + (8 * span if skip_diagonal else 0)
  tiles = min(-(-want // 64), span * min(span, _MAX_TILES_PER_WINDOW))
  k = np.arange(tiles)
  ti = k % span
  tj = (ti + k // span) % span
  idx = np.arange(tiles * 64)
  t, loc = idx // 64, idx % 64
  rows, cols = first + 8 * ti[t] + loc % 8, first + 8 * tj[t] + loc // 8
  if skip_diagonal:
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
  return rows[:count], cols[:count]


def _pad_pattern(p: Pattern, sizes: dict, n: int) -> Pattern:
  """Pads one orientation's arrays to the budget (see the module docstring): its last window and
  last row are empty, and padded items repeat them (_src/padding.py)."""
  budget = padding.PadSizes(
    nnz=int(p.rows.shape[0]),
    cols=sizes["window_cols"],
    blocks=sizes["blocks"],
    items=sizes["schedule"],
    row_items=sizes["row_schedule"],
  )
  have = padding.pattern_sizes(p)
  over = {k: (h, w) for k, h, w in zip(budget._fields, have, budget) if h > w}
  if over:
    raise ValueError(f"internal: the batch's format exceeds its budget: {over}")
  windows = p.window_block_ptr.shape[0] - 1
  return padding.pad_pattern(p, budget, empty_window=windows - 1, empty_row=n - 1, fill_col=n - 1)


def padded_matrix(
  edge_index, num_real_nodes: int, budget: Budget, *, edge_values=None
) -> tuple[SparseMatrix, np.ndarray]:
  """The padded message-passing matrix of a (union) graph, on the host then device.

  edge_index [2, e] (e <= budget.edges) over nodes [0, num_real_nodes); edge_values [e] or None
  (ones). Returns the SparseMatrix (rows = targets, shape [num_nodes, num_nodes], exactly
  budget.nnz nonzeros, format arrays at their budget lengths) and the edge slots' index
  [2, budget.edges] (padding slots point at dummy entries).
  """
  ei = integrity.edge_index_array("padded_matrix", edge_index, num_real_nodes).astype(np.int64)
  e = ei.shape[1]
  n_slots, nnz = budget.num_nodes, budget.nnz
  if num_real_nodes > budget.nodes or e > budget.edges:
    raise ValueError(
      f"a batch of {num_real_nodes} nodes and {e} edges exceeds the budget "
      f"({budget.nodes} nodes, {budget.edges} edges)"
    )
  src, dst = ei
  vals = np.ones(e, np.float32) if edge_values is None else np.asarray(edge_values, np.float32)
  if vals.shape != (e,):
    raise ValueError(f"padded_matrix: edge_values must have shape [{e}]; got {vals.shape}")
  rows, cols = [dst], [src]
  if budget.add_self_loops:
    vals = np.where(src == dst, np.float32(0), vals)  # PyG: existing loops are replaced
    loop_rows = np.arange(n_slots - 8, dtype=np.int64)  # the last window stays empty
    loop_vals = (loop_rows < num_real_nodes).astype(np.float32)
  else:
    loop_rows, loop_vals = np.zeros(0, np.int64), np.zeros(0, np.float32)
  real_keys = np.concatenate([dst * n_slots + src, loop_rows * (n_slots + 1)])
  distinct = np.unique(real_keys).size
  dummy_r, dummy_c = _dummy_entries(
    nnz - distinct, _ceil8(num_real_nodes), n_slots, budget.add_self_loops
  )
  # Input order: edges, dummies (the first ones back the padding slots), added loops.
  rows = np.concatenate([dst, dummy_r, loop_rows])
  cols = np.concatenate([src, dummy_c, loop_rows])
  values = np.concatenate([vals, np.zeros(dummy_r.size, np.float32), loop_vals])
  opts = FormatOptions(grouped=budget.is_grouped)
  pattern, to_format, grouped = pattern_lib.build(rows, cols, n_slots, n_slots, opts)
  pattern_t, to_format_t, grouped_t = pattern_lib.build(cols, rows, n_slots, n_slots, opts)
  assert pattern.rows.shape[0] == nnz, (pattern.rows.shape, nnz)
  perm_t = np.empty(nnz, np.int32)
  perm_t[to_format_t] = to_format
  perm_t_inv = np.empty(nnz, np.int32)
  perm_t_inv[to_format] = to_format_t
  values_f = np.bincount(to_format, weights=values, minlength=nnz).astype(np.float32)
  sizes = budget.format_sizes()
  pattern = _pad_pattern(pattern, sizes, n_slots)
  pattern_t = _pad_pattern(pattern_t, sizes, n_slots)
  pad = budget.edges - e
  slots = np.stack([np.concatenate([src, dummy_c[:pad]]), np.concatenate([dst, dummy_r[:pad]])])
  arrays = jax.device_put(
    (values_f, pattern, pattern_t, perm_t, perm_t_inv, to_format[: budget.edges].astype(np.int32))
  )
  A = SparseMatrix._unchecked(
    *arrays, shape=(n_slots, n_slots), grouped=(grouped, grouped_t), padded=True
  )
  return A, slots.astype(np.int32)


def _stack_padded(parts, total: int, what: str):
  """Concatenates per-graph arrays ([k_i, ...]) and zero-pads the first axis to `total`."""
  arrs = [np.asarray(p) for p in parts]
  tail = arrs[0].shape[1:]
  for i, a in enumerate(arrs):
    if a.shape[1:] != tail:
      raise ValueError(
        f"{what} must have the same trailing shape in every graph of a batch; the batch's "
        f"first graph has [..., {', '.join(map(str, tail))}] and its graph {i} "
        f"[..., {', '.join(map(str, a.shape[1:]))}]"
      )
  cat = np.concatenate(arrs) if arrs else np.zeros((0,) + tail)
  if not np.issubdtype(cat.dtype, np.floating) and not np.issubdtype(cat.dtype, np.integer):
    cat = cat.astype(np.float32)
  if cat.dtype == np.float64:
    cat = cat.astype(np.float32)
  out = np.zeros((total,) + tail, cat.dtype)
  out[: cat.shape[0]] = cat
  return out


def batch_graphs(graphs: Sequence[Graph], budget: Budget) -> GraphBatch:
  """The padded disjoint union of `graphs` (at most budget.graphs of them), on the device.

  Every batch built with one budget has the same pytree structure and leaf shapes. Node
  features, edge features and labels are concatenated and zero-padded; `y` is read as graph
  labels when each graph's `y` has no node axis (a scalar or fixed-size array per graph), as
  node labels when its first axis has num_nodes entries.
  """
  if not isinstance(budget, Budget):
    raise TypeError(f"batch_graphs: budget must be a Budget; got {type(budget).__name__}")
  graphs = _as_graphs(graphs, "batch_graphs")
  if not graphs:
    raise ValueError("batch_graphs needs at least one graph")
  if len(graphs) > budget.graphs:
    raise ValueError(f"{len(graphs)} graphs exceed the budget's {budget.graphs} graph slots")
  counts = np.array([int(g.num_nodes) for g in graphs], np.int64)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  n_real = int(offsets[-1])
  eis = [g.edge_index.astype(np.int64) + off for g, off in zip(graphs, offsets)]
  ei = np.concatenate(eis, axis=1)
  A, slots = padded_matrix(ei, n_real, budget)
  n_slots, e_slots, g_slots = budget.num_nodes, budget.edges, budget.graphs
  node_graph = np.full(n_slots, g_slots, np.int32)
  node_graph[:n_real] = np.repeat(np.arange(len(graphs), dtype=np.int32), counts)

  def field(name):
    vals = [getattr(g, name) for g in graphs]
    if all(v is None for v in vals):
      return None
    if any(v is None for v in vals):
      raise ValueError(f"Graph.{name} is set on some graphs and None on others")
    return vals

  xs = field("x")
  x = None if xs is None else _stack_padded(xs, n_slots, "Graph.x")
  eas = field("edge_attr")
  edge_attr = None if eas is None else _stack_padded(eas, e_slots, "Graph.edge_attr")
  ys = field("y")
  y = None
  if ys is not None:
    node_level = all(np.ndim(v) >= 1 and np.shape(v)[0] == g.num_nodes for v, g in zip(ys, graphs))
    if node_level:
      y = _stack_padded(ys, n_slots, "Graph.y (node labels)")
    else:
      first = np.shape(ys[0])
      for i, (v, g) in enumerate(zip(ys, graphs)):
        if np.shape(v) != first:
          raise ValueError(
            "Graph.y is read as one label per graph (not every graph's y has num_nodes rows), "
            f"so it must have one shape in every graph of a batch; the batch's first graph has "
            f"y of shape {first} ({graphs[0].num_nodes} nodes) and its graph {i} {np.shape(v)} "
            f"({g.num_nodes} nodes)"
          )
      y = _stack_padded([np.asarray(v)[None] for v in ys], g_slots, "Graph.y")
  host = {
    "x": x,
    "edge_index": slots,
    "edge_attr": edge_attr,
    "y": y,
    "node_graph": node_graph,
    "node_mask": np.arange(n_slots) < n_real,
    "edge_mask": np.arange(e_slots) < ei.shape[1],
    "graph_mask": np.arange(g_slots) < len(graphs),
  }
  dev = jax.device_put(host)
  return GraphBatch(
    A,
    dev["x"],
    dev["edge_index"],
    dev["edge_attr"],
    dev["y"],
    dev["node_graph"],
    dev["node_mask"],
    dev["edge_mask"],
    dev["graph_mask"],
  )


def unbatch_nodes(values, batch: GraphBatch) -> list:
  """Per-graph slices of node-level `values` [num_nodes, ...] (host arrays; real graphs only)."""
  values = np.asarray(values)
  graph = np.asarray(batch.node_graph)
  if values.ndim < 1 or values.shape[0] != graph.shape[0]:
    raise ValueError(
      f"unbatch_nodes: values must have shape [num_nodes={graph.shape[0]}, ...] (the batch's "
      f"node slots); got {values.shape}"
    )
  return [values[graph == g] for g in range(int(np.sum(np.asarray(batch.graph_mask))))]


class GraphLoader:
  """Shuffles and batches graphs into padded batches of one budget (PyG's DataLoader).

  Each iteration (epoch) draws a new order (when `shuffle`) from `seed` and the epoch count,
  and packs consecutive graphs greedily: a batch closes at `batch_size` graphs, or earlier
  when the next graph would exceed the budget. Batches are built on a background thread
  `prefetch` ahead (the format builder releases the GIL), so the host overlaps the device.
  """

  def __init__(
    self,
    graphs: Sequence[Graph],
    budget: Budget,
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    prefetch: int = 2,
  ):
    if not isinstance(budget, Budget):
      raise TypeError(f"GraphLoader: budget must be a Budget; got {type(budget).__name__}")
    batch_size = _positive_int("GraphLoader", "batch_size", batch_size)
    if batch_size > budget.graphs:
      raise ValueError(
        f"GraphLoader: batch_size must be in [1, budget.graphs={budget.graphs}]; got {batch_size}"
      )
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"GraphLoader: seed must be a non-negative integer; got {seed!r}")
    if (
      isinstance(prefetch, (bool, np.bool_))
      or not isinstance(prefetch, (int, np.integer))
      or prefetch < 0
    ):
      raise ValueError(f"GraphLoader: prefetch must be an integer >= 0; got {prefetch!r}")
    self.graphs = _as_graphs(graphs, "GraphLoader")
    self.budget = budget
    self.batch_size = batch_size
    self.shuffle = bool(shuffle)
    self.seed = int(seed)
    self.drop_last = bool(drop_last)
    self.prefetch = int(prefetch)
    self.epoch = 0
    self._sizes = [(int(g.num_nodes), int(np.shape(g.edge_index)[1])) for g in self.graphs]
    for i, (n, e) in enumerate(self._sizes):
      if not budget.fits(n, e, 1):
        raise ValueError(
          f"graph {i} ({n} nodes, {e} edges) exceeds the budget "
          f"({budget.nodes} nodes, {budget.edges} edges): build the budget "
          "with Budget.for_dataset over all graphs"
        )

  def index_batches(self, epoch: int | None = None) -> list[np.ndarray]:
    """The graph indices of each batch of an epoch (the packing GraphLoader iterates)."""
    epoch = self.epoch if epoch is None else epoch
    order = np.arange(len(self.graphs))
    if self.shuffle:
      order = np.random.default_rng([self.seed, epoch]).permutation(order)
    out, cur, n, e = [], [], 0, 0
    for i in order:
      gn, ge = self._sizes[i]
      if cur and (len(cur) == self.batch_size or not self.budget.fits(n + gn, e + ge, 1)):
        out.append(np.array(cur))
        cur, n, e = [], 0, 0
      cur.append(i)
      n, e = n + gn, e + ge
    if cur and not (self.drop_last and len(cur) < self.batch_size):
      out.append(np.array(cur))
    return out

  def __len__(self) -> int:
    return len(self.index_batches())

  def __iter__(self) -> Iterator[GraphBatch]:
    batches = self.index_batches()
    self.epoch += 1
    make = lambda idx: batch_graphs([self.graphs[i] for i in idx], self.budget)
    if self.prefetch == 0:
      for idx in batches:
        yield make(idx)
      return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      pending = [pool.submit(make, idx) for idx in batches[: self.prefetch]]
      for k in range(len(batches)):
        nxt = k + self.prefetch
        if nxt < len(batches):
          pending.append(pool.submit(make, batches[nxt]))
        yield pending[k].result()
        pending[k] = None


def masked_mean(values, mask):
  """Mean of `values` [k, ...] over rows where `mask` [k] is True (0 when none is)."""
  mask = jnp.asarray(mask)
  if mask.ndim != 1 or jnp.ndim(values) < 1 or mask.shape[0] != jnp.shape(values)[0]:
    raise ValueError(
      f"masked_mean: mask must have shape [k] for values [k, ...]; got mask {mask.shape} and "
      f"values {jnp.shape(values)}"
    )
  w = mask.reshape(mask.shape + (1,) * (jnp.ndim(values) - 1)).astype(jnp.result_type(values))
  return jnp.sum(values * w, axis=0) / jnp.maximum(jnp.sum(mask), 1)


# Pickles name the classes by their public module, which stays put while internals move.
for _cls in (Graph, Budget, GraphBatch, GraphLoader):
  _cls.__module__ = "jaxsparse_tc.nn.batch"
del _cls
