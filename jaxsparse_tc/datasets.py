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


def load_npz(path, *, normalize_features: bool = False) -> GraphDataset:
  """Loads a graph stored as Cora is (jaxsparse_tc/data/cora.npz; see load_cora)."""
  z = np.load(path)
  shape = tuple(int(s) for s in z["shape"])
  adj = sp.csr_matrix(
    (np.ones(len(z["indices"]), np.float32), z["indices"], z["indptr"]), shape=shape
  )
  feats = sp.csr_matrix(
    (z["feat_data"], z["feat_indices"], z["feat_indptr"]),
    shape=tuple(int(s) for s in z["feat_shape"]),
  ).toarray()
  feats = feats.astype(np.float32)
  if normalize_features:
    sums = feats.sum(axis=1, keepdims=True)
    feats = feats / np.where(sums == 0, 1.0, sums)
  coo = adj.tocoo()
  edge_index = np.stack([coo.row, coo.col]).astype(np.int64)
  return GraphDataset(
    features=feats.astype(np.float32),
    labels=z["labels"].astype(np.int32),
    train_idx=z["train_idx"].astype(np.int32),
    val_idx=z["val_idx"].astype(np.int32),
    test_idx=z["test_idx"].astype(np.int32),
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

  z = np.load(find_dataset_file(name, data_dir))
  for key in ("row", "col", "graph_ptr", "graph_label", "node_tag"):
    if key not in z.files:
      raise ValueError(
        f"{name}: the file has no {key!r} array (a TU graph-classification file "
        f"holds row, col, graph_ptr, graph_label, node_tag)"
      )
  row, col = z["row"].astype(np.int64), z["col"].astype(np.int64)
  ptr = z["graph_ptr"].astype(np.int64)
  labels = z["graph_label"].astype(np.int32)
  tags = z["node_tag"].astype(np.int64)
  num_tags = int(tags.max()) + 1
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
      raise ValueError(f"{name}: an edge of graph {g} leaves the graph")
    graphs.append(Graph(ei, int(hi - lo), x=eye[tags[lo:hi]], y=int(labels[g])))
  return TUDataset(
    name=name,
    graphs=graphs,
    labels=labels,
    num_features=num_tags,
    num_classes=int(labels.max()) + 1,
  )
