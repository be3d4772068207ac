"""Datasets shipped with the package: the Cora citation graph (Planetoid split).

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
  adj = sp.csr_matrix((np.ones(len(z["indices"]), np.float32), z["indices"], z["indptr"]),
                      shape=shape)
  feats = sp.csr_matrix((z["feat_data"], z["feat_indices"], z["feat_indptr"]),
                        shape=tuple(int(s) for s in z["feat_shape"])).toarray()
  feats = feats.astype(np.float32)
  if normalize_features:
    sums = feats.sum(axis=1, keepdims=True)
    feats = feats / np.where(sums == 0, 1.0, sums)
  coo = adj.tocoo()
  edge_index = np.stack([coo.row, coo.col]).astype(np.int64)
  return GraphDataset(features=feats.astype(np.float32), labels=z["labels"].astype(np.int32),
                      train_idx=z["train_idx"].astype(np.int32),
                      val_idx=z["val_idx"].astype(np.int32),
                      test_idx=z["test_idx"].astype(np.int32), edge_index=edge_index,
                      adjacency=adj)


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
