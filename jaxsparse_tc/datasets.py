"""Datasets: Cora (shipped with the package, Planetoid split) and TU graph-classification sets
read from a data directory (`load_tu`: PROTEINS, DD; not shipped).

Cora: Yang, Cohen and Salakhutdinov 2016, data from the planetoid repository (MIT licence,
Copyright (c) 2016 Zhilin Yang). 2,708 nodes, 10,556 directed edges (symmetric, no self-loops),
1,433 binary bag-of-words features, 7 classes; 140 train / 500 validation / 1,000 test nodes.
The figures PyTorch Geometric's `Planetoid("Cora")` reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class GraphDataset:
  """A node-classification graph, all arrays numpy (host) arrays.

  features [n, f] float32 (dense); labels [n] int32 (-1 = unlabelled); train_idx, val_idx,
  test_idx int32 node indices; edge_index [2, E] int64 in PyG's convention (messages flow
  edge_index[0] -> edge_index[1]); adjacency: scipy CSR [n, n], A[i, j] = 1 for an edge i -> j.
  Build a layer's matrix with `jaxsparse_tc.nn.graph` (gcn_norm, message_passing_matrix).
  """

  features: np.ndarray
  labels: np.ndarray
  train_idx: np.ndarray
  val_idx: np.ndarray
  test_idx: np.ndarray
  edge_index: np.ndarray
  adjacency: sp.csr_matrix

  @property
  def num_nodes(self) -> int:
    return self.features.shape[0]

  @property
  def num_features(self) -> int:
    return self.features.shape[1]

  @property
  def num_classes(self) -> int:
    return int(self.labels.max()) + 1


def _open_npz(path, what: str):
  """np.load of an .npz archive, or ValueError naming the file (FileNotFoundError passes)."""
  try:
    z = np.load(path, allow_pickle=False)
  except FileNotFoundError:
    raise
  except Exception as e:  # noqa: BLE001 - numpy raises several kinds for files it cannot read
    raise ValueError(f"{path}: not a readable .npz archive ({what}): {e}") from None
  if not isinstance(z, np.lib.npyio.NpzFile):
    raise ValueError(f"{path}: holds one array, not an .npz archive of named arrays ({what})")
  return z


def _arrays(path, z, keys, what: str) -> dict:
  missing = [k for k in keys if k not in z.files]
  if missing:
    raise ValueError(
      f"{path}: the archive has no {', '.join(map(repr, missing))} array(s); {what} holds "
      f"{', '.join(keys)}"
    )
  return {k: z[k] for k in keys}


def _int_field(path, name: str, a, *, ndim: int = 1, low: int | None = 0, high=None):
  """An integer array of the file, checked: dtype, rank and the range [low, high)."""
  if a.dtype.kind not in "iu" and not (a.dtype.kind == "b" and low == 0):
    raise ValueError(f"{path}: {name} must hold integers; got dtype {a.dtype}")
  if a.ndim != ndim:
    raise ValueError(f"{path}: {name} must be {ndim}-dimensional; got shape {a.shape}")
  a = a.astype(np.int64)
  if a.size and low is not None and a.min() < low:
    raise ValueError(f"{path}: {name} holds {int(a.min())}, below {low}")
  if a.size and high is not None and a.max() >= high:
    raise ValueError(f"{path}: {name} holds {int(a.max())}; it must be below {high}")
  return a


def _check_ptr(path, name: str, ptr: np.ndarray, total: int, total_name: str) -> None:
  if ptr.size < 1 or ptr[0] != 0 or ptr[-1] != total or np.any(np.diff(ptr) < 0):
    raise ValueError(
      f"{path}: {name} must rise from 0 to {total_name} ({total}) without decreasing; got "
      f"{ptr.size} entries from {ptr[0] if ptr.size else None} to "
      f"{ptr[-1] if ptr.size else None}" + (" (it decreases)" if np.any(np.diff(ptr) < 0) else "")
    )


_NPZ_KEYS = (
  "shape",
  "indptr",
  "indices",
  "feat_data",
  "feat_indices",
  "feat_indptr",
  "feat_shape",
  "labels",
  "train_idx",
  "val_idx",
  "test_idx",
)


def load_npz(path, *, normalize_features: bool = False) -> GraphDataset:
  """Loads a graph stored as Cora is (jaxsparse_tc/data/cora.npz; see load_cora): the
  adjacency as CSR (`shape`, `indptr`, `indices`), the features as CSR (`feat_shape`,
  `feat_indptr`, `feat_indices`, `feat_data`), `labels` and the split indices. A file that
  does not hold these, consistently, raises ValueError naming the array at fault."""
  what = "a graph file as load_npz reads it"
  z = _arrays(path, _open_npz(path, what), _NPZ_KEYS, what)
  shape = tuple(_int_field(path, "shape", z["shape"]).tolist())
  if len(shape) != 2 or shape[0] != shape[1]:
    raise ValueError(f"{path}: shape must be [n, n] (a square adjacency); got {shape}")
  n = shape[0]
  indptr = _int_field(path, "indptr", z["indptr"])
  indices = _int_field(path, "indices", z["indices"], high=n)
  if indptr.size != n + 1:
    raise ValueError(f"{path}: indptr must have n + 1 = {n + 1} entries; got {indptr.size}")
  _check_ptr(path, "indptr", indptr, indices.size, "len(indices)")
  feat_shape = tuple(_int_field(path, "feat_shape", z["feat_shape"]).tolist())
  if len(feat_shape) != 2 or feat_shape[0] != n:
    raise ValueError(f"{path}: feat_shape must be [n={n}, features]; got {feat_shape}")
  feat_indptr = _int_field(path, "feat_indptr", z["feat_indptr"])
  feat_indices = _int_field(path, "feat_indices", z["feat_indices"], high=feat_shape[1])
  if feat_indptr.size != n + 1:
    raise ValueError(
      f"{path}: feat_indptr must have n + 1 = {n + 1} entries; got {feat_indptr.size}"
    )
  _check_ptr(path, "feat_indptr", feat_indptr, feat_indices.size, "len(feat_indices)")
  feat_data = z["feat_data"]
  if feat_data.dtype.kind not in "biuf" or feat_data.shape != feat_indices.shape:
    raise ValueError(
      f"{path}: feat_data must hold {feat_indices.size} numbers (one per feat_indices entry); "
      f"got dtype {feat_data.dtype}, shape {feat_data.shape}"
    )
  labels = _int_field(path, "labels", z["labels"], low=-1)
  if labels.size != n:
    raise ValueError(f"{path}: labels must have n = {n} entries; got {labels.size}")
  split = {k: _int_field(path, k, z[k], high=n) for k in ("train_idx", "val_idx", "test_idx")}
  adj = sp.csr_matrix((np.ones(indices.size, np.float32), indices, indptr), shape=shape)
  feats = sp.csr_matrix((feat_data, feat_indices, feat_indptr), shape=feat_shape).toarray()
  feats = feats.astype(np.float32)
  if normalize_features:
    sums = feats.sum(axis=1, keepdims=True)
    feats = feats / np.where(sums == 0, 1.0, sums)
  coo = adj.tocoo()
  edge_index = np.stack([coo.row, coo.col]).astype(np.int64)
  return GraphDataset(
    features=feats.astype(np.float32),
    labels=labels.astype(np.int32),
    train_idx=split["train_idx"].astype(np.int32),
    val_idx=split["val_idx"].astype(np.int32),
    test_idx=split["test_idx"].astype(np.int32),
    edge_index=edge_index,
    adjacency=adj,
  )


def load_cora(*, normalize_features: bool = False) -> GraphDataset:
  """Cora with the standard Planetoid split, from the copy shipped inside the package.

  `normalize_features=True` divides each node's features by their sum (row-normalization, as
  Kipf & Welling and PyG's `NormalizeFeatures` do).

      >>> ds = load_cora()
      >>> ds.features.shape, ds.edge_index.shape, ds.num_classes
      ((2708, 1433), (2, 10556), 7)
  """
  path = resources.files("jaxsparse_tc").joinpath("data", "cora.npz")
  with resources.as_file(path) as p:
    return load_npz(p, normalize_features=normalize_features)


# -- graph classification (TU datasets from a data directory; nothing shipped) ---------------------


@dataclass(frozen=True)
class TUDataset:
  """A graph-classification dataset: `graphs` (nn.batch.Graph, x = one-hot node tags, y = the
  graph's class), `labels` [num_graphs] and the counts. Edges as stored (PROTEINS and DD are
  symmetric: both directions listed)."""

  name: str
  graphs: list
  labels: np.ndarray
  num_features: int
  num_classes: int

  def __len__(self) -> int:
    return len(self.graphs)


def _data_dirs():
  """Where TU .npz files are looked for: ./shared/data and ../shared/data beside the working
  directory and beside the checkout holding this package."""
  from pathlib import Path

  root = Path(__file__).resolve().parent.parent
  seen, out = set(), []
  for base in (Path.cwd(), Path.cwd().parent, root, root.parent):
    d = (base / "shared" / "data").resolve()
    if d not in seen:
      seen.add(d)
      out.append(d)
  return out


def find_dataset_file(name: str, data_dir=None):
  """The path of `<name>.npz` (case-insensitive) in `data_dir`, or in the default places
  (`_data_dirs`); FileNotFoundError naming where it looked."""
  from pathlib import Path

  dirs = [Path(data_dir)] if data_dir is not None else _data_dirs()
  for d in dirs:
    if d.is_dir():
      for f in d.iterdir():
        if f.suffix == ".npz" and f.stem.lower() == name.lower():
          return f
  raise FileNotFoundError(
    f"dataset {name!r} ({name}.npz) not found in {', '.join(map(str, dirs))}: pass the folder "
    "that holds it (data_dir=..., or --data on the command line). The TU datasets are not "
    "shipped with the package"
  )


def load_tu(name: str, data_dir=None) -> TUDataset:
  """PROTEINS or DD (any TU set stored the same way): the disjoint union in `<name>.npz`
  (`row`, `col`, `graph_ptr`, `graph_label`, `node_tag`) split into graphs.

  Node features are the one-hot `node_tag` (as GIN does); labels are `graph_label`. Edges are
  as stored, as edge_index [2, e] per graph (messages flow edge_index[0] -> edge_index[1]).
  """
  from jaxsparse_tc.nn.batch import Graph

  path = find_dataset_file(name, data_dir)
  what = "a TU graph-classification file"
  z = _arrays(
    path,
    _open_npz(path, what),
    ("row", "col", "graph_ptr", "graph_label", "node_tag"),
    what,
  )
  tags = _int_field(path, "node_tag", z["node_tag"])
  nodes = tags.size
  row = _int_field(path, "row", z["row"], high=nodes)
  col = _int_field(path, "col", z["col"], high=nodes)
  if row.size != col.size:
    raise ValueError(f"{path}: row and col differ in length: {row.size} and {col.size}")
  ptr = _int_field(path, "graph_ptr", z["graph_ptr"])
  if ptr.size < 2:
    raise ValueError(f"{path}: graph_ptr must hold at least one graph (2 entries); got {ptr.size}")
  _check_ptr(path, "graph_ptr", ptr, nodes, "len(node_tag)")
  labels = _int_field(path, "graph_label", z["graph_label"]).astype(np.int32)
  if labels.size != ptr.size - 1:
    raise ValueError(
      f"{path}: graph_label must have one label per graph ({ptr.size - 1}); got {labels.size}"
    )
  num_tags = int(tags.max()) + 1 if tags.size else 1
  graph_of_edge = np.searchsorted(ptr, row, side="right") - 1
  order = np.argsort(graph_of_edge, kind="stable")
  row, col, graph_of_edge = row[order], col[order], graph_of_edge[order]
  edge_ptr = np.searchsorted(graph_of_edge, np.arange(len(ptr)))
  eye = np.eye(num_tags, dtype=np.float32)
  graphs = []
  for g in range(len(ptr) - 1):
    lo, hi = ptr[g], ptr[g + 1]
    e0, e1 = edge_ptr[g], edge_ptr[g + 1]
    ei = np.stack([row[e0:e1] - lo, col[e0:e1] - lo])
    if ei.size and (ei.min() < 0 or ei.max() >= hi - lo):
      k = int(np.nonzero(np.any((ei < 0) | (ei >= hi - lo), axis=0))[0][0])
      raise ValueError(
        f"{path}: an edge of graph {g} (nodes [{lo}, {hi})) leaves the graph: row "
        f"{int(row[e0 + k])}, col {int(col[e0 + k])}"
      )
    graphs.append(Graph(ei, int(hi - lo), x=eye[tags[lo:hi]], y=int(labels[g])))
  return TUDataset(
    name=name,
    graphs=graphs,
    labels=labels,
    num_features=num_tags,
    num_classes=int(labels.max()) + 1,
  )
