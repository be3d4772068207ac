"""Dataset loaders (see jaxsparse_tc.datasets, the public module)."""

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
