"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from the raw files of the planetoid
repository (Yang, Cohen and Salakhutdinov 2016; MIT licence), with the public split.

The raw files are Python 2 pickles: x, tx, allx scipy sparse matrices, y, ty, ally numpy
arrays, graph a dict of adjacency lists. They are read by an unpickler that builds only the
classes those files need (numpy arrays and dtypes, scipy's CSR/CSC/COO matrices, dict, list,
defaultdict, and latin1 encoding for byte strings), so a tampered file can name no other
callable and cannot run code.
"""

from __future__ import annotations

import codecs
import collections
import copyreg
import importlib
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from jaxsparse_tc._src.datasets import download as dl
from jaxsparse_tc._src.datasets.npz import normalize_rows
from jaxsparse_tc._src.datasets.types import GraphDataset

PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"
PLANETOID_NAMES = ("Cora", "CiteSeer", "PubMed")
_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def planetoid_files(name: str) -> list[str]:
  """The raw file names of a Planetoid set (`ind.<name>.<part>`, name lower-cased)."""
  return [f"ind.{name.lower()}.{p}" for p in _PARTS]


def _numpy_core(attr: str):
  for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
    try:
      return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError):
      continue
  raise ImportError(f"numpy's multiarray.{attr} is not available")


def _latin1_encode(text, encoding="latin1"):
  if codecs.lookup(encoding).name != "iso8859-1":
    raise pickle.UnpicklingError(f"a Planetoid pickle encodes bytes as latin1; got {encoding!r}")
  return codecs.encode(text, "latin1")


def _allowed() -> dict:
  sparse = {"csr_matrix": sp.csr_matrix, "csc_matrix": sp.csc_matrix, "coo_matrix": sp.coo_matrix}
  allowed = {}
  # Module paths as the files (pickled by Python 2, numpy 1 and scipy < 1.8) and newer
  # versions of them name these classes.
  for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    allowed[(mod, "_reconstruct")] = _numpy_core("_reconstruct")
    allowed[(mod, "scalar")] = _numpy_core("scalar")
  allowed[("numpy", "ndarray")] = np.ndarray
  allowed[("numpy", "dtype")] = np.dtype
  for mod in ("csr", "csc", "coo", "_csr", "_csc", "_coo"):
    for cls_name, cls in sparse.items():
      if cls_name.startswith(mod.lstrip("_")):
        allowed[(f"scipy.sparse.{mod}", cls_name)] = cls
  for cls_name, cls in sparse.items():
    allowed[("scipy.sparse", cls_name)] = cls
  for mod in ("copy_reg", "copyreg"):
    allowed[(mod, "_reconstructor")] = copyreg._reconstructor
  for mod in ("__builtin__", "builtins"):
    allowed[(mod, "object")] = object
    allowed[(mod, "list")] = list
    allowed[(mod, "dict")] = dict
    allowed[(mod, "set")] = set
  # protocol < 3 pickles written by Python 3 spell bytes as _codecs.encode(str, "latin1")
  allowed[("_codecs", "encode")] = _latin1_encode
  allowed[("collections", "defaultdict")] = collections.defaultdict
  allowed[("collections", "OrderedDict")] = collections.OrderedDict
  return allowed


class _RestrictedUnpickler(pickle.Unpickler):
  def __init__(self, file, where: Path):
    # latin1: the Python 2 pickles hold numpy buffers as str (bytes); latin1 maps them 1:1
    super().__init__(file, encoding="latin1", fix_imports=False)
    self._where = where
    self._allowed = _allowed()

  def find_class(self, module, name):
    try:
      return self._allowed[(module, name)]
    except KeyError:
      raise pickle.UnpicklingError(
        f"{self._where}: refers to {module}.{name}, which a Planetoid file does not hold "
        "(only numpy arrays, scipy sparse matrices and dicts/lists are read)"
      ) from None


def _unpickle(path: Path):
  try:
    with open(path, "rb") as fh:
      return _RestrictedUnpickler(fh, path).load()
  except pickle.UnpicklingError:
    raise
  except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways
    raise ValueError(f"{path}: not a readable Planetoid pickle: {type(e).__name__}: {e}") from None


def _dense(path: Path, obj, ndim: int = 2) -> np.ndarray:
  if sp.issparse(obj):
    obj = obj.toarray()
  a = np.asarray(obj)
  if a.ndim != ndim or a.dtype.kind not in "biuf":
    raise ValueError(
      f"{path}: expected a {ndim}-d numeric matrix; got {type(obj).__name__} of shape "
      f"{a.shape}, dtype {a.dtype}"
    )
  return a


def _canonical(name: str) -> str:
  for n in PLANETOID_NAMES:
    if n.lower() == str(name).lower():
      return n
  raise ValueError(f"name must be one of {', '.join(PLANETOID_NAMES)}; got {name!r}")


def load_planetoid(
  name: str,
  root=None,
  *,
  url: str = PLANETOID_URL,
  download: bool = True,
  normalize_features: bool = False,
) -> GraphDataset:
  """Cora, CiteSeer or PubMed (name case-insensitive) with the public Planetoid split.

  Reads the raw planetoid files `ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}` from
  `root/<Name>/raw/` (PyG's Planetoid layout; `root` defaults to default_root(), the user's
  cache folder). Missing files are downloaded from `url` (the planetoid repository, as PyG
  does; `download=False`: never) to that folder; when they can't be, FileNotFoundError names
  each file to place and the folder.

  The graph as PyG's `Planetoid(root, name)` builds it: features allx then tx, the test nodes'
  rows put in test.index order; edges from the adjacency lists, self-loops and duplicates
  removed, sorted (not symmetrized: Cora and CiteSeer come out symmetric, PubMed nearly);
  split: the first len(y) nodes train (20 per class), the next 500 validation, the 1,000
  test.index nodes test. CiteSeer's test.index skips 15 nodes with no test entry; as in PyG
  they get zero features and label 0 and belong to no split.
  `normalize_features=True` divides each node's features by their sum.

      Cora: 2,708 nodes, 10,556 edges, 1,433 features, 7 classes, 140 / 500 / 1,000
      CiteSeer: 3,327 nodes, 9,104 edges, 3,703 features, 6 classes, 120 / 500 / 1,000
      PubMed: 19,717 nodes, 88,648 edges, 500 features, 3 classes, 60 / 500 / 1,000
  """
  name = _canonical(name)
  raw = dl.resolve_root(root) / name / "raw"
  files = planetoid_files(name)
  dl.fetch(f"Planetoid {name}", files, raw, url, enabled=download)
  part = dict(zip(_PARTS, (raw / f for f in files)))
  x, tx, allx = (_dense(part[k], _unpickle(part[k])) for k in ("x", "tx", "allx"))
  y, ty, ally = (_dense(part[k], _unpickle(part[k])) for k in ("y", "ty", "ally"))
  graph = _unpickle(part["graph"])
  if not isinstance(graph, dict):
    raise ValueError(f"{part['graph']}: expected a dict of adjacency lists; got {type(graph)}")
  try:
    test_index = np.loadtxt(part["test.index"], dtype=np.int64, ndmin=1)
  except ValueError as e:
    raise ValueError(f"{part['test.index']}: expected one node index per line: {e}") from None
  if tx.shape[0] != test_index.size or ty.shape[0] != test_index.size:
    raise ValueError(
      f"{raw}: tx ({tx.shape[0]} rows), ty ({ty.shape[0]}) and test.index "
      f"({test_index.size} entries) must agree"
    )
  sorted_test = np.sort(test_index)
  lo, hi = int(sorted_test[0]), int(sorted_test[-1])
  if name == "CiteSeer":
    # test.index skips isolated nodes: give them zero rows so node ids stay contiguous
    tx_ext = np.zeros((hi - lo + 1, tx.shape[1]), tx.dtype)
    ty_ext = np.zeros((hi - lo + 1, ty.shape[1]), ty.dtype)
    tx_ext[sorted_test - lo], ty_ext[sorted_test - lo] = tx, ty
    tx, ty = tx_ext, ty_ext
  feats = np.concatenate([allx, tx]).astype(np.float32)
  labels = np.concatenate([ally, ty]).argmax(axis=1).astype(np.int32)
  n = feats.shape[0]
  if labels.shape[0] != n or hi >= n:
    raise ValueError(
      f"{raw}: allx/tx give {n} nodes, ally/ty {labels.shape[0]} labels and test.index "
      f"reaches node {hi}: they must agree"
    )
  # the test rows are stored in sorted order; test.index says where each belongs
  feats[test_index] = feats[sorted_test]
  labels[test_index] = labels[sorted_test]
  rows, cols = [], []
  for src, dsts in graph.items():
    rows.append(np.full(len(dsts), int(src), np.int64))
    cols.append(np.asarray(list(dsts), np.int64).reshape(-1))
  row, col = np.concatenate(rows or [[]]), np.concatenate(cols or [[]])
  row, col = row.astype(np.int64), col.astype(np.int64)
  if row.size and (min(row.min(), col.min()) < 0 or max(row.max(), col.max()) >= n):
    raise ValueError(f"{part['graph']}: node ids must lie in [0, {n}); got [{row.min()}, ...]")
  keep = row != col
  adj = sp.csr_matrix((np.ones(int(keep.sum()), np.float32), (row[keep], col[keep])), shape=(n, n))
  adj.sum_duplicates()
  adj.data[:] = 1.0
  coo = adj.tocoo()
  if normalize_features:
    feats = normalize_rows(feats)
  return GraphDataset(
    features=feats,
    labels=labels,
    train_idx=np.arange(y.shape[0], dtype=np.int32),
    val_idx=np.arange(y.shape[0], y.shape[0] + 500, dtype=np.int32),
    test_idx=sorted_test.astype(np.int32),
    edge_index=np.stack([coo.row, coo.col]).astype(np.int64),
    adjacency=adj,
  )
