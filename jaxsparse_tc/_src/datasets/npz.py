"""Graphs stored as .npz archives: the node-classification layout of the shipped Cora, plain edge
lists, and the disjoint-union layout of TU sets (graph_ptr, graph_label, node_tag).

Every reader takes an explicit path; archives are read with allow_pickle=False."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from jaxsparse_tc._src.datasets.types import EdgeList, GraphDataset, TUDataset

NODE_KEYS = (
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
EDGE_LIST_KEYS = ("row", "col", "num_nodes")  # and optionally "values"
TU_NPZ_KEYS = ("row", "col", "graph_ptr", "graph_label", "node_tag")

_LAYOUT_NAMES = {
  NODE_KEYS: "a node-classification graph (the shipped Cora's layout)",
  EDGE_LIST_KEYS: "an edge list (values optional)",
  TU_NPZ_KEYS: "a TU disjoint union",
}


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


def _layout_error(path, z, fn: str, layouts) -> ValueError:
  """The ValueError for an archive that holds none of `layouts`: each layout's missing keys."""
  parts = []
  for keys in layouts:
    missing = [k for k in keys if k not in z.files]
    parts.append(
      f"{_LAYOUT_NAMES[keys]} holds {', '.join(keys)} (missing here: {', '.join(missing)})"
    )
  return ValueError(
    f"{path}: {fn} reads none of this archive's layouts; it holds "
    f"{', '.join(sorted(z.files)) or 'no arrays'}. Accepted layouts: " + "; ".join(parts)
  )


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


def normalize_rows(feats: np.ndarray) -> np.ndarray:
  """Each row divided by its sum (rows summing to 0 kept), as PyG's NormalizeFeatures."""
  sums = feats.sum(axis=1, keepdims=True)
  return (feats / np.where(sums == 0, 1.0, sums)).astype(np.float32)


def _node_graph(path, z, normalize_features: bool) -> GraphDataset:
  z = {k: z[k] for k in NODE_KEYS}
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
    feats = normalize_rows(feats)
  coo = adj.tocoo()
  edge_index = np.stack([coo.row, coo.col]).astype(np.int64)
  return GraphDataset(
    features=feats,
    labels=labels.astype(np.int32),
    train_idx=split["train_idx"].astype(np.int32),
    val_idx=split["val_idx"].astype(np.int32),
    test_idx=split["test_idx"].astype(np.int32),
    edge_index=edge_index,
    adjacency=adj,
  )


def _edge_list(path, z) -> EdgeList:
  n = int(_int_field(path, "num_nodes", z["num_nodes"], ndim=0))
  row = _int_field(path, "row", z["row"], high=n)
  col = _int_field(path, "col", z["col"], high=n)
  if row.size != col.size:
    raise ValueError(f"{path}: row and col differ in length: {row.size} and {col.size}")
  values = None
  if "values" in z.files:
    values = z["values"]
    if values.dtype.kind not in "biuf" or values.shape != row.shape:
      raise ValueError(
        f"{path}: values must hold {row.size} numbers (one per edge); got dtype "
        f"{values.dtype}, shape {values.shape}"
      )
  taken = set(EDGE_LIST_KEYS) | {"values"}
  extra = {k: z[k] for k in z.files if k not in taken}
  return EdgeList(np.stack([row, col]), n, values, extra)


def load_npz(path, *, normalize_features: bool = False) -> GraphDataset | EdgeList:
  """Loads a graph .npz of either layout:

  - node classification, as the shipped Cora (see load_cora): the adjacency as CSR (`shape`,
    `indptr`, `indices`), the features as CSR (`feat_shape`, `feat_indptr`, `feat_indices`,
    `feat_data`), `labels` (-1 = none) and `train_idx`, `val_idx`, `test_idx`: a GraphDataset
    (`normalize_features=True` divides each node's features by their sum);
  - an edge list: `row`, `col`, `num_nodes` and optionally `values` (see load_edge_list): an
    EdgeList.

  An archive that holds neither raises ValueError naming each layout's missing arrays; one
  whose arrays disagree raises ValueError naming the array at fault.
  """
  z = _open_npz(path, "a graph file as load_npz reads it")
  if all(k in z.files for k in NODE_KEYS):
    return _node_graph(path, z, normalize_features)
  if all(k in z.files for k in EDGE_LIST_KEYS):
    return _edge_list(path, z)
  raise _layout_error(path, z, "load_npz", (NODE_KEYS, EDGE_LIST_KEYS))


def load_edge_list(path) -> EdgeList:
  """An edge-list .npz: `row`, `col` (integer node ids), `num_nodes` (a scalar) and optionally
  `values` (one number per edge); any other arrays come back in `EdgeList.extra`. Edges are as
  stored (no symmetrization, no deduplication). Another layout raises ValueError naming the
  missing arrays; ids out of [0, num_nodes) raise ValueError."""
  z = _open_npz(path, "an edge list")
  if not all(k in z.files for k in EDGE_LIST_KEYS):
    raise _layout_error(path, z, "load_edge_list", (EDGE_LIST_KEYS,))
  return _edge_list(path, z)


def load_cora(*, normalize_features: bool = False) -> GraphDataset:
  """Cora with the standard Planetoid split, from the copy shipped inside the package (no
  download; the same graph as `load_planetoid("Cora")`).

  `normalize_features=True` divides each node's features by their sum (row-normalization, as
  Kipf & Welling and PyG's `NormalizeFeatures` do).

      >>> ds = load_cora()
      >>> ds.features.shape, ds.edge_index.shape, ds.num_classes
      ((2708, 1433), (2, 10556), 7)
  """
  path = resources.files("jaxsparse_tc").joinpath("data", "cora.npz")
  with resources.as_file(path) as p:
    return load_npz(p, normalize_features=normalize_features)


def find_dataset_file(name: str, folder) -> Path:
  """The path of `<name>.npz` in `folder` (the name matched case-insensitively), or
  FileNotFoundError naming the folder."""
  folder = Path(folder)
  if folder.is_dir():
    for f in sorted(folder.iterdir()):
      if f.suffix == ".npz" and f.stem.lower() == name.lower():
        return f
  raise FileNotFoundError(
    f"no {name}.npz in {folder}" + ("" if folder.is_dir() else " (not a folder)")
  )


def load_tu_npz(path, name: str | None = None) -> TUDataset:
  """A graph-classification set stored as one disjoint union in an .npz: `row`, `col` (edges,
  global node ids), `graph_ptr` (node offset of each graph, n_graphs + 1 entries),
  `graph_label` and `node_tag` (a categorical tag per node), split into graphs.

  Node features are the one-hot `node_tag` (as GIN does); labels are `graph_label`. Edges are
  as stored, as edge_index [2, e] per graph (messages flow edge_index[0] -> edge_index[1]).
  `name` defaults to the file's stem. For the TU site's raw text files use load_tu.
  """
  from jaxsparse_tc._src.nn.batch import Graph

  path = Path(path)
  z = _open_npz(path, "a TU graph-classification file")
  if not all(k in z.files for k in TU_NPZ_KEYS):
    raise _layout_error(path, z, "load_tu_npz", (TU_NPZ_KEYS,))
  z = {k: z[k] for k in TU_NPZ_KEYS}
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
    name=name if name is not None else path.stem,
    graphs=graphs,
    labels=labels,
    num_features=num_tags,
    num_classes=int(labels.max()) + 1,
  )
