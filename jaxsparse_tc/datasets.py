"""Datasets: graphs for node and graph classification, as numpy arrays on the host.

- `load_cora()`: Cora with the standard Planetoid split, shipped inside the package (no
  download). Yang, Cohen and Salakhutdinov 2016, data from the planetoid repository (MIT
  licence, Copyright (c) 2016 Zhilin Yang): 2,708 nodes, 10,556 directed edges (symmetric, no
  self-loops), 1,433 binary bag-of-words features, 7 classes; 140 / 500 / 1,000 train /
  validation / test nodes, the figures PyTorch Geometric's `Planetoid("Cora")` reports.
- `load_planetoid(name, root=None)`: Cora, CiteSeer or PubMed from the raw planetoid files in
  `root/<Name>/raw/`, with the public split -> GraphDataset.
- `load_tu(name, root=None)`: a TU graph-classification set (PROTEINS, DD, MUTAG, IMDB-BINARY,
  IMDB-MULTI, COLLAB, REDDIT-BINARY, ...) from the TU text files in `root/<NAME>/raw/` ->
  TUDataset (graphs as jaxsparse_tc.nn.batch.Graph).
- `load_npz(path)` / `load_edge_list(path)`: a graph .npz: the shipped Cora's node-
  classification layout (-> GraphDataset) or an edge list `row`, `col`, `num_nodes`
  [, `values`] (-> EdgeList). `load_tu_npz(path)`: a TU set stored as one disjoint union
  (`row`, `col`, `graph_ptr`, `graph_label`, `node_tag`).

`root` defaults to `default_root()`, `~/.cache/jaxsparse_tc/datasets` (no environment variable
moves it; pass `root=`). Files not there are downloaded (urllib; `url=` another base,
`download=False` never) into a temporary file renamed into place; when that fails the
FileNotFoundError names each file to place and the folder. Nothing is read from anywhere else.
"""

from jaxsparse_tc._src.datasets.download import default_root
from jaxsparse_tc._src.datasets.npz import (
  find_dataset_file,
  load_cora,
  load_edge_list,
  load_npz,
  load_tu_npz,
)
from jaxsparse_tc._src.datasets.planetoid import PLANETOID_URL, load_planetoid, planetoid_files
from jaxsparse_tc._src.datasets.tu import TU_URL, load_tu, tu_files
from jaxsparse_tc._src.datasets.types import EdgeList, GraphDataset, TUDataset

__all__ = [
  "EdgeList",
  "GraphDataset",
  "PLANETOID_URL",
  "TUDataset",
  "TU_URL",
  "default_root",
  "find_dataset_file",
  "load_cora",
  "load_edge_list",
  "load_npz",
  "load_planetoid",
  "load_tu",
  "load_tu_npz",
  "planetoid_files",
  "tu_files",
]
