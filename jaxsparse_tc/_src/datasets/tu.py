"""TU graph-classification sets (PROTEINS, DD, MUTAG, IMDB-BINARY, COLLAB, REDDIT-BINARY, ...)
from the raw text format of the TU collection (Morris et al. 2020, https://chrsmrrs.github.io/
datasets/; cite it and each set's source).

A set NAME is the disjoint union of its graphs, in text files of comma-separated numbers:
NAME_A.txt (one edge "i, j" per line, 1-based node ids), NAME_graph_indicator.txt (the graph,
1-based, of each node), NAME_graph_labels.txt (each graph's class), and where the set has them
NAME_node_labels.txt (categorical, one or more columns) and NAME_node_attributes.txt (real).
Edge labels and attributes are not read.
"""

from __future__ import annotations

import os
import urllib.error
import warnings
import zipfile
from pathlib import Path

import numpy as np

from jaxsparse_tc._src.datasets import download as dl
from jaxsparse_tc._src.datasets.types import TUDataset

TU_URL = "https://www.chrsmrrs.com/graphkerneldatasets"
_REQUIRED = ("A", "graph_indicator", "graph_labels")
_OPTIONAL = ("node_labels", "node_attributes")


def tu_files(name: str) -> list[str]:
  """The raw files every TU set has: NAME_A.txt, NAME_graph_indicator.txt,
  NAME_graph_labels.txt."""
  return [f"{name}_{p}.txt" for p in _REQUIRED]


def _extract(zip_path: Path, name: str, raw: Path) -> None:
  """Writes the zip's NAME_*.txt members into `raw` by their base names only (a member's
  folder is ignored, so no path in the archive can point outside `raw`)."""
  try:
    with zipfile.ZipFile(zip_path) as zf:
      for info in zf.infolist():
        base = os.path.basename(info.filename)
        if not info.is_dir() and base.startswith(f"{name}_") and base.endswith(".txt"):
          with zf.open(info) as src:
            dl._atomic_copy(src, raw / base)
  except zipfile.BadZipFile as e:
    raise ValueError(f"{zip_path}: not a readable zip archive: {e}") from None


def _ensure_raw(name: str, raw: Path, url: str, download: bool) -> None:
  """NAME's required files in `raw`: as they are, from NAME.zip there, or from url/NAME.zip."""
  needed = tu_files(name)
  if all((raw / f).is_file() for f in needed):
    return
  zip_path = raw / f"{name}.zip"
  source = f"{url.rstrip('/')}/{name}.zip"
  note = f"(Placing {name}.zip itself in the folder works too.)"
  if not zip_path.is_file():
    if not download:
      missing = [f for f in needed if not (raw / f).is_file()]
      raise dl.missing_files_error(f"TU dataset {name}", raw, missing, None, source, note)
    try:
      dl.download(source, zip_path)
    except (urllib.error.URLError, OSError, ValueError) as e:
      missing = [f for f in needed if not (raw / f).is_file()]
      raise dl.missing_files_error(
        f"TU dataset {name}", raw, missing, f"{source}: {e}", source, note
      ) from e
  _extract(zip_path, name, raw)
  missing = [f for f in needed if not (raw / f).is_file()]
  if missing:
    raise dl.missing_files_error(
      f"TU dataset {name}", raw, missing, f"{zip_path} does not hold them", source, note
    )
  zip_path.unlink()


def _read(path: Path, dtype) -> np.ndarray:
  """A comma-separated numeric text file as a 2-d array [lines, columns]."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)  # an empty file is an empty array
      return np.loadtxt(path, delimiter=",", dtype=dtype, ndmin=2)
  except ValueError as e:
    kind = "integers" if np.dtype(dtype).kind == "i" else "numbers"
    raise ValueError(f"{path}: expected comma-separated {kind} on each line: {e}") from None


def _one_hot_columns(labels: np.ndarray) -> np.ndarray:
  """Each column shifted to start at 0 and one-hot encoded; the encodings side by side."""
  parts = []
  for c in labels.T:
    c = c - c.min()
    parts.append(np.eye(int(c.max()) + 1, dtype=np.float32)[c])
  return np.concatenate(parts, axis=1)


def load_tu(
  name: str,
  root=None,
  *,
  url: str = TU_URL,
  download: bool = True,
  use_node_attr: bool = False,
) -> TUDataset:
  """A TU graph-classification set (name as the TU site spells it: "PROTEINS", "IMDB-BINARY")
  from its raw text files in `root/NAME/raw/` (PyG's TUDataset layout; `root` defaults to
  default_root(), the user's cache folder).

  Missing files come from `NAME.zip` in that folder, or are downloaded as `url/NAME.zip` (the
  TU site; `download=False`: never) and extracted there; when neither works,
  FileNotFoundError names each file to place and the folder.

  Built as PyG's `TUDataset(root, name)` builds it: node features are the one-hot node labels
  (each label column shifted to start at 0), preceded by the node attributes when
  `use_node_attr` is True; a set with neither (IMDB-BINARY, COLLAB, REDDIT-BINARY) gets one
  constant feature 1 per node (PyG leaves x None there). Graph labels are mapped to
  0..classes-1 in sorted order (MUTAG's -1 / 1 become 0 / 1). Edges: self-loops and repeated
  edges removed, sorted; the sets list both directions of their undirected edges. Each graph
  is a jaxsparse_tc.nn.batch.Graph (edge_index with the graph's own node ids, x, y).
  """
  from jaxsparse_tc._src.nn.batch import Graph

  if not name or os.sep in name or "/" in name or name in (".", ".."):
    raise ValueError(f"name must be a TU dataset name such as 'PROTEINS'; got {name!r}")
  raw = dl.resolve_root(root) / name / "raw"
  _ensure_raw(name, raw, url, download)
  path = {p: raw / f"{name}_{p}.txt" for p in _REQUIRED + _OPTIONAL}

  indicator = _read(path["graph_indicator"], np.int64)
  graph_labels = _read(path["graph_labels"], np.int64)
  for p, a in (("graph_indicator", indicator), ("graph_labels", graph_labels)):
    if a.shape[1] != 1:
      raise ValueError(f"{path[p]}: expected one integer per line; got {a.shape[1]} columns")
  indicator, graph_labels = indicator[:, 0] - 1, graph_labels[:, 0]
  n, num_graphs = indicator.size, graph_labels.size
  if n and (indicator.min() < 0 or indicator.max() >= num_graphs):
    raise ValueError(
      f"{path['graph_indicator']}: graph ids must lie in 1..{num_graphs} (one per line of "
      f"{path['graph_labels'].name}); got {indicator.min() + 1}..{indicator.max() + 1}"
    )
  if np.any(np.diff(indicator) < 0):
    raise ValueError(f"{path['graph_indicator']}: a graph's nodes must be consecutive lines")
  ptr = np.concatenate([[0], np.cumsum(np.bincount(indicator, minlength=num_graphs))])

  edges = _read(path["A"], np.int64)
  if edges.size and edges.shape[1] != 2:
    raise ValueError(f"{path['A']}: expected two node ids per line; got {edges.shape[1]}")
  row, col = (edges[:, 0] - 1, edges[:, 1] - 1) if edges.size else (np.zeros(0, np.int64),) * 2
  if row.size and (min(row.min(), col.min()) < 0 or max(row.max(), col.max()) >= n):
    raise ValueError(
      f"{path['A']}: node ids must lie in 1..{n} (one per line of "
      f"{path['graph_indicator'].name}); got {min(row.min(), col.min()) + 1}.."
      f"{max(row.max(), col.max()) + 1}"
    )
  across = np.nonzero(indicator[row] != indicator[col])[0]
  if across.size:
    k = int(across[0])
    raise ValueError(
      f"{path['A']}: line {k + 1} joins node {row[k] + 1} (graph {indicator[row[k]] + 1}) "
      f"and node {col[k] + 1} (graph {indicator[col[k]] + 1}); edges stay within a graph"
    )
  keep = row != col
  key = np.unique(row[keep] * max(n, 1) + col[keep])  # sorted, repeats removed
  row, col = key // max(n, 1), key % max(n, 1)

  columns = []
  if use_node_attr and path["node_attributes"].is_file():
    attrs = _read(path["node_attributes"], np.float32)
    if attrs.shape[0] != n:
      raise ValueError(f"{path['node_attributes']}: expected {n} lines (one per node)")
    columns.append(attrs)
  if path["node_labels"].is_file():
    labels = _read(path["node_labels"], np.int64)
    if labels.shape[0] != n:
      raise ValueError(f"{path['node_labels']}: expected {n} lines (one per node)")
    columns.append(_one_hot_columns(labels))
  x = np.concatenate(columns, axis=1) if columns else np.ones((n, 1), np.float32)

  classes, y = np.unique(graph_labels, return_inverse=True)
  y = y.astype(np.int32)
  edge_ptr = np.searchsorted(row, ptr)  # rows are sorted and each graph's nodes consecutive
  graphs = []
  for g in range(num_graphs):
    lo, hi, e0, e1 = ptr[g], ptr[g + 1], edge_ptr[g], edge_ptr[g + 1]
    ei = np.stack([row[e0:e1] - lo, col[e0:e1] - lo])
    graphs.append(Graph(ei, int(hi - lo), x=x[lo:hi], y=int(y[g])))
  return TUDataset(
    name=name,
    graphs=graphs,
    labels=y,
    num_features=x.shape[1],
    num_classes=int(classes.size),
  )
