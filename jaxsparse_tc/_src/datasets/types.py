"""The dataset types the loaders return."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class TUDataset:
  """A graph-classification dataset: `graphs` (jaxsparse_tc.nn.batch.Graph: edge_index, x = the
  node features, y = the graph's class), `labels` [num_graphs] int32 and the counts."""

  name: str
  graphs: list
  labels: np.ndarray
  num_features: int
  num_classes: int

  def __len__(self) -> int:
    return len(self.graphs)


@dataclass(frozen=True)
class EdgeList:
  """A graph as an edge list: edge_index [2, E] int64 (messages flow edge_index[0] ->
  edge_index[1]), num_nodes, values [E] (None: every edge weighs 1) and `extra`: the file's
  other arrays by name (e.g. `graph_ptr`, `source`)."""

  edge_index: np.ndarray
  num_nodes: int
  values: np.ndarray | None = None
  extra: dict = field(default_factory=dict)

  @property
  def num_edges(self) -> int:
    return self.edge_index.shape[1]

  @property
  def adjacency(self) -> sp.csr_matrix:
    """scipy CSR [n, n], A[i, j] = the value of edge i -> j (repeated edges summed)."""
    n = self.num_nodes
    vals = np.ones(self.num_edges, np.float32) if self.values is None else self.values
    a = sp.csr_matrix((vals, (self.edge_index[0], self.edge_index[1])), shape=(n, n))
    a.sum_duplicates()
    return a
