"""jaxsparse_tc.datasets: Planetoid and TU raw formats, edge-list .npz, the cache root and
downloads (from a local HTTP server only: these tests never reach the internet).

The fixtures are written here, at run time, in the raw formats (pickled scipy matrices for
Planetoid, comma-separated text for TU), from fresh random values; each loader's output is
checked against those values."""

from __future__ import annotations

import collections
import contextlib
import functools
import http.server
import pickle
import socket
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from jaxsparse_tc import datasets

# -- Planetoid fixture -----------------------------------------------------------------------------


def _pickle(path: Path, obj, py2_names: bool) -> None:
  # protocol 0 with Python 2 module names (copy_reg, __builtin__) is how the planetoid files
  # were written; py2_names also spells numpy's and scipy's modules as their old versions did
  data = pickle.dumps(obj, protocol=0)
  if py2_names:
    data = data.replace(b"cscipy.sparse._csr\n", b"cscipy.sparse.csr\n")
    data = data.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
  path.write_bytes(data)


def write_planetoid(raw: Path, name: str, rng, *, gaps: int = 0, py2_names: bool = False):
  """A tiny Planetoid set in `raw`; returns what a loader must give back. `gaps` test-range
  nodes have no test.index entry (CiteSeer's isolated nodes)."""
  classes, feats, n_train, n_all, n_test = 3, 7, 6, 530, 20
  allx = (rng.random((n_all, feats)) < 0.3) * rng.integers(1, 4, (n_all, feats))
  tx = (rng.random((n_test, feats)) < 0.3) * rng.integers(1, 4, (n_test, feats))
  all_labels = rng.integers(0, classes, n_all)
  test_labels = rng.integers(0, classes, n_test)
  eye = np.eye(classes, dtype=np.int64)
  test_range = np.arange(n_all, n_all + n_test + gaps)
  skipped = rng.choice(test_range[1:-1], gaps, replace=False)
  test_index = rng.permutation(np.setdiff1d(test_range, skipped))
  n = n_all + n_test + gaps
  # symmetric adjacency lists with repeated entries and self-loops (the raw files have both)
  pairs = {tuple(sorted(p)) for p in rng.integers(0, n, (3 * n, 2)).tolist() if p[0] != p[1]}
  graph = collections.defaultdict(list)
  for a, b in sorted(pairs):
    graph[a].append(b)
    graph[b].append(a)
  for a in rng.choice(n, 5, replace=False).tolist():
    graph[a].append(a)
  dup = sorted(pairs)[0]
  graph[dup[0]].append(dup[1])
  parts = {
    "x": sp.csr_matrix(allx[:n_train].astype(np.float32)),
    "tx": sp.csr_matrix(tx.astype(np.float32)),
    "allx": sp.csr_matrix(allx.astype(np.float32)),
    "y": eye[all_labels[:n_train]],
    "ty": eye[test_labels],
    "ally": eye[all_labels],
    "graph": graph,
  }
  raw.mkdir(parents=True, exist_ok=True)
  for part, obj in parts.items():
    _pickle(raw / f"ind.{name.lower()}.{part}", obj, py2_names)
  (raw / f"ind.{name.lower()}.test.index").write_text("".join(f"{i}\n" for i in test_index))
  features = np.zeros((n, feats), np.float64)
  labels = np.zeros(n, np.int64)  # skipped nodes: zero features and label 0 (as PyG)
  features[:n_all], labels[:n_all] = allx, all_labels
  features[test_index], labels[test_index] = tx, test_labels
  edges = {(a, b) for a, b in pairs} | {(b, a) for a, b in pairs}
  return dict(
    n=n,
    features=features,
    labels=labels,
    train=np.arange(n_train),
    val=np.arange(n_train, n_train + 500),
    test=np.sort(test_index),
    edges=edges,
  )


def check_planetoid(ds: datasets.GraphDataset, want: dict) -> None:
  assert ds.num_nodes == want["n"] and ds.features.dtype == np.float32
  np.testing.assert_array_equal(ds.features, want["features"])
  np.testing.assert_array_equal(ds.labels, want["labels"])
  np.testing.assert_array_equal(ds.train_idx, want["train"])
  np.testing.assert_array_equal(ds.val_idx, want["val"])
  np.testing.assert_array_equal(ds.test_idx, want["test"])
  assert (len(ds.train_idx), len(ds.val_idx), len(ds.test_idx)) == (6, 500, 20)
  got = set(map(tuple, ds.edge_index.T.tolist()))
  assert got == want["edges"] and ds.edge_index.shape[1] == len(want["edges"])
  a = ds.adjacency
  assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0 and a.nnz == len(want["edges"])
  np.testing.assert_array_equal(ds.adjacency.tocoo().row, ds.edge_index[0])


@pytest.mark.parametrize("py2_names", [False, True])
def test_planetoid_raw_files(tmp_path, rng, py2_names):
  want = write_planetoid(tmp_path / "Cora" / "raw", "Cora", rng, py2_names=py2_names)
  ds = datasets.load_planetoid("cora", tmp_path, download=False)
  check_planetoid(ds, want)
  norm = datasets.load_planetoid("Cora", tmp_path, download=False, normalize_features=True)
  sums = want["features"].sum(1, keepdims=True)
  np.testing.assert_allclose(norm.features, want["features"] / np.where(sums == 0, 1, sums))


def test_planetoid_citeseer_isolated_test_nodes(tmp_path, rng):
  want = write_planetoid(tmp_path / "CiteSeer" / "raw", "CiteSeer", rng, gaps=3)
  ds = datasets.load_planetoid("CiteSeer", tmp_path, download=False)
  check_planetoid(ds, want)
  assert ds.num_nodes == 553  # the 3 skipped nodes are kept (as PyG does), in no split
  assert len(np.intersect1d(ds.test_idx, np.arange(ds.num_nodes))) == 20


def test_planetoid_pickle_cannot_name_other_callables(tmp_path, rng):
  write_planetoid(tmp_path / "PubMed" / "raw", "PubMed", rng)
  marker = tmp_path / "ran"
  evil = f"cbuiltins\nopen\n(V{marker}\nVw\ntR.".encode()
  (tmp_path / "PubMed" / "raw" / "ind.pubmed.graph").write_bytes(evil)
  with pytest.raises(pickle.UnpicklingError, match="builtins.open"):
    datasets.load_planetoid("PubMed", tmp_path, download=False)
  assert not marker.exists()


# -- TU fixture ------------------------------------------------------------------------------------


def write_tu(folder: Path, name: str, rng, *, graphs: int = 9, node_labels=True, attrs=True):
  """A tiny TU set's text files in `folder`; returns what a loader must give back."""
  sizes = rng.integers(2, 8, graphs)
  ptr = np.concatenate([[0], np.cumsum(sizes)])
  n = int(ptr[-1])
  edges, local = [], []
  for g in range(graphs):
    k = int(sizes[g])
    pairs = {tuple(p) for p in rng.integers(0, k, (2 * k, 2)).tolist() if p[0] != p[1]}
    both = sorted(pairs | {(b, a) for a, b in pairs})
    local.append(both)
    listed = both + both[:1] + [(0, 0)]  # a repeated edge and a self-loop, which are dropped
    edges += [(a + ptr[g], b + ptr[g]) for a, b in listed]
  order = rng.permutation(len(edges))
  lines = [f"{edges[i][0] + 1}, {edges[i][1] + 1}\n" for i in order]
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{name}_A.txt").write_text("".join(lines))
  indicator = np.repeat(np.arange(graphs), sizes)
  (folder / f"{name}_graph_indicator.txt").write_text("".join(f"{g + 1}\n" for g in indicator))
  raw_labels = rng.choice([-1, 1], graphs)
  (folder / f"{name}_graph_labels.txt").write_text("".join(f"{v}\n" for v in raw_labels))
  tags = rng.integers(1, 5, (n, 2))  # two label columns, starting at 1
  if node_labels:
    text = "".join(f"{a}, {b}\n" for a, b in tags)
    (folder / f"{name}_node_labels.txt").write_text(text)
  attributes = rng.normal(size=(n, 3)).astype(np.float32)
  if attrs:
    text = "".join(", ".join(repr(float(v)) for v in row) + "\n" for row in attributes)
    (folder / f"{name}_node_attributes.txt").write_text(text)
  one_hot = np.concatenate([np.eye(c.max() - c.min() + 1)[c - c.min()] for c in tags.T], axis=1)
  return dict(
    sizes=sizes,
    ptr=ptr,
    local=local,
    labels=(raw_labels == 1).astype(np.int64),
    one_hot=one_hot,
    attributes=attributes,
  )


def check_tu(ds: datasets.TUDataset, want: dict, x_of) -> None:
  assert len(ds) == len(want["sizes"]) and ds.num_classes == 2
  np.testing.assert_array_equal(ds.labels, want["labels"])
  for g, graph in enumerate(ds.graphs):
    lo, hi = want["ptr"][g], want["ptr"][g + 1]
    assert graph.num_nodes == want["sizes"][g] and graph.y == want["labels"][g]
    assert list(map(tuple, np.asarray(graph.edge_index).T.tolist())) == want["local"][g]
    np.testing.assert_allclose(np.asarray(graph.x), x_of[lo:hi], rtol=1e-6)
  assert ds.num_features == x_of.shape[1]


def test_tu_raw_files(tmp_path, rng):
  want = write_tu(tmp_path / "TOY" / "raw", "TOY", rng)
  ds = datasets.load_tu("TOY", tmp_path, download=False)
  check_tu(ds, want, want["one_hot"])  # PyG's default: node labels only
  ds = datasets.load_tu("TOY", tmp_path, download=False, use_node_attr=True)
  check_tu(ds, want, np.concatenate([want["attributes"], want["one_hot"]], axis=1))


def test_tu_without_node_labels_gets_a_constant_feature(tmp_path, rng):
  want = write_tu(tmp_path / "SOCIAL" / "raw", "SOCIAL", rng, node_labels=False, attrs=False)
  ds = datasets.load_tu("SOCIAL", tmp_path, download=False)
  check_tu(ds, want, np.ones((want["ptr"][-1], 1)))


def _tu_zip(path: Path, src: Path, name: str) -> None:
  """The TU site's layout: NAME.zip holding NAME/NAME_*.txt."""
  with zipfile.ZipFile(path, "w") as zf:
    for f in sorted(src.iterdir()):
      zf.write(f, f"{name}/{f.name}")


def test_tu_zip_in_the_raw_folder(tmp_path, rng):
  want = write_tu(tmp_path / "files", "TOY", rng)
  raw = tmp_path / "root" / "TOY" / "raw"
  raw.mkdir(parents=True)
  _tu_zip(raw / "TOY.zip", tmp_path / "files", "TOY")
  check_tu(datasets.load_tu("TOY", tmp_path / "root", download=False), want, want["one_hot"])
  assert sorted(p.name for p in raw.iterdir()) == sorted(
    p.name for p in (tmp_path / "files").iterdir()
  )


# -- downloads from a local server -----------------------------------------------------------------


@contextlib.contextmanager
def serve(folder: Path):
  """An HTTP server on 127.0.0.1 serving `folder`; yields its base URL and the paths asked."""
  asked = []

  class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      asked.append(self.path)

  handler = functools.partial(Handler, directory=str(folder))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/data", asked
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def test_planetoid_download(tmp_path, rng):
  want = write_planetoid(tmp_path / "site" / "data", "PubMed", rng)
  with serve(tmp_path / "site") as (url, asked):
    ds = datasets.load_planetoid("pubmed", tmp_path / "root", url=url)
  check_planetoid(ds, want)
  raw = tmp_path / "root" / "PubMed" / "raw"
  assert sorted(p.name for p in raw.iterdir()) == sorted(datasets.planetoid_files("PubMed"))
  assert len(asked) == 8
  with serve(tmp_path / "site") as (url, asked):  # present files are not fetched again
    check_planetoid(datasets.load_planetoid("PubMed", tmp_path / "root", url=url), want)
  assert asked == []


def test_tu_download(tmp_path, rng):
  want = write_tu(tmp_path / "files", "TOY", rng)
  (tmp_path / "site" / "data").mkdir(parents=True)
  _tu_zip(tmp_path / "site" / "data" / "TOY.zip", tmp_path / "files", "TOY")
  with serve(tmp_path / "site") as (url, asked):
    ds = datasets.load_tu("TOY", tmp_path / "root", url=url)
  check_tu(ds, want, want["one_hot"])
  raw = tmp_path / "root" / "TOY" / "raw"
  assert asked and all(a.endswith("/TOY.zip") for a in asked)
  assert not list(raw.glob("*.zip")) and not list(raw.glob(".*part"))


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_offline_error_names_the_files_and_folder(tmp_path, rng):
  url = f"http://127.0.0.1:{_closed_port()}/data"
  root = tmp_path / "root"
  with pytest.raises(FileNotFoundError) as err:
    datasets.load_planetoid("CiteSeer", root, url=url)
  msg = str(err.value)
  raw = root / "CiteSeer" / "raw"
  assert str(raw) in msg and "downloading them failed" in msg
  for f in datasets.planetoid_files("CiteSeer"):
    assert str(raw / f) in msg
  assert not raw.exists() or not any(raw.iterdir())  # nothing partial left behind
  with pytest.raises(FileNotFoundError) as err:
    datasets.load_tu("IMDB-BINARY", root, url=url)
  msg = str(err.value)
  for f in datasets.tu_files("IMDB-BINARY"):
    assert str(root / "IMDB-BINARY" / "raw" / f) in msg
  assert "IMDB-BINARY.zip" in msg
  # a server that answers 404 for one file: the download stops there and the message lists
  # the files still missing (that one and the ones after it), not those already fetched
  write_planetoid(tmp_path / "site" / "data", "Cora", rng)
  (tmp_path / "site" / "data" / "ind.cora.graph").unlink()
  with serve(tmp_path / "site") as (url, _), pytest.raises(FileNotFoundError) as err:
    datasets.load_planetoid("Cora", root, url=url)
  msg, raw = str(err.value), root / "Cora" / "raw"
  assert "missing 2 file(s)" in msg and "404" in msg
  assert str(raw / "ind.cora.graph") in msg and str(raw / "ind.cora.test.index") in msg
  assert str(raw / "ind.cora.x") not in msg and (raw / "ind.cora.x").is_file()


def test_download_false_fetches_nothing(tmp_path, rng):
  write_tu(tmp_path / "site" / "data", "TOY", rng)
  with serve(tmp_path / "site") as (url, asked), pytest.raises(FileNotFoundError) as err:
    datasets.load_tu("TOY", tmp_path / "root", url=url, download=False)
  assert asked == [] and "download=False" in str(err.value)


# -- the default root ------------------------------------------------------------------------------


def test_default_root_is_the_user_cache(tmp_path, monkeypatch, rng):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert datasets.default_root() == tmp_path / "home" / ".cache" / "jaxsparse_tc" / "datasets"
  # no environment variable moves it (an explicit root= does)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert datasets.default_root() == tmp_path / "home" / ".cache" / "jaxsparse_tc" / "datasets"
  # no root: the cache folder, nowhere else (a ./shared/data beside the caller is not read)
  monkeypatch.chdir(tmp_path)
  write_tu(tmp_path / "shared" / "data" / "TOY" / "raw", "TOY", rng)
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "home" / ".cache" / "jaxsparse_tc")):
    datasets.load_tu("TOY", download=False)
  want = write_tu(datasets.default_root() / "TOY" / "raw", "TOY", rng)
  check_tu(datasets.load_tu("TOY", download=False), want, want["one_hot"])


# -- .npz files ------------------------------------------------------------------------------------


def test_edge_list_npz(tmp_path, rng):
  n, e = 30, 80
  row, col = rng.integers(0, n, e), rng.integers(0, n, e)
  values = rng.normal(size=e)
  np.savez(tmp_path / "g.npz", row=row.astype(np.int32), col=col, num_nodes=n, values=values)
  for g in (datasets.load_npz(tmp_path / "g.npz"), datasets.load_edge_list(tmp_path / "g.npz")):
    assert isinstance(g, datasets.EdgeList) and g.num_nodes == n and g.extra == {}
    np.testing.assert_array_equal(g.edge_index, np.stack([row, col]))
    np.testing.assert_array_equal(g.values, values)
    dense = np.zeros((n, n))
    np.add.at(dense, (row, col), values)
    np.testing.assert_allclose(g.adjacency.toarray(), dense, rtol=1e-12)
  np.savez(tmp_path / "u.npz", row=row, col=col, num_nodes=np.int64(n), graph_ptr=[0, n])
  g = datasets.load_edge_list(tmp_path / "u.npz")
  assert g.values is None and list(g.extra) == ["graph_ptr"]
  np.testing.assert_array_equal(
    g.adjacency.toarray() != 0, np.isin(np.arange(n * n), row * n + col).reshape(n, n)
  )


def test_npz_wrong_layout_names_missing_keys(tmp_path, rng):
  np.savez(tmp_path / "bad.npz", row=rng.integers(0, 5, 4), col=rng.integers(0, 5, 4))
  with pytest.raises(ValueError) as err:
    datasets.load_npz(tmp_path / "bad.npz")
  msg = str(err.value)
  assert "missing here: num_nodes)" in msg and "Accepted layouts" in msg
  assert "node-classification" in msg and "feat_indptr" in msg and "edge list" in msg
  with pytest.raises(ValueError, match=r"edge list .* \(missing here: num_nodes\)"):
    datasets.load_edge_list(tmp_path / "bad.npz")
  np.savez(tmp_path / "far.npz", row=[0, 5], col=[1, 2], num_nodes=5)
  with pytest.raises(ValueError, match="row holds 5; it must be below 5"):
    datasets.load_edge_list(tmp_path / "far.npz")
  np.savez(tmp_path / "val.npz", row=[0, 1], col=[1, 2], num_nodes=5, values=[1.0])
  with pytest.raises(ValueError, match="values must hold 2 numbers"):
    datasets.load_npz(tmp_path / "val.npz")


def test_shipped_cora_unchanged():
  ds = datasets.load_cora()
  assert (ds.num_nodes, ds.edge_index.shape[1], ds.num_features, ds.num_classes) == (
    2708,
    10556,
    1433,
    7,
  )
  assert (len(ds.train_idx), len(ds.val_idx), len(ds.test_idx)) == (140, 500, 1000)
  a = ds.adjacency
  assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0
  # the public split, as load_planetoid builds it: train 0..139, validation 140..639
  np.testing.assert_array_equal(ds.train_idx, np.arange(140))
  np.testing.assert_array_equal(ds.val_idx, np.arange(140, 640))
  assert np.all(np.bincount(ds.labels[ds.train_idx]) == 20)


def test_planetoid_loader_rebuilds_the_shipped_cora(tmp_path, rng):
  """The shipped Cora written back as raw planetoid files (test rows in a random test.index
  order, adjacency lists in random order) loads as the same graph and split."""
  cora = datasets.load_cora()
  n_all = int(cora.test_idx.min())  # Cora's test nodes are the last 1,000
  onehot = np.eye(cora.num_classes, dtype=np.int64)[cora.labels]
  test_index = rng.permutation(cora.test_idx)
  graph = collections.defaultdict(list)
  for a in rng.permutation(cora.num_nodes).tolist():
    graph[a] = rng.permutation(cora.adjacency[a].indices).tolist()
  raw = tmp_path / "Cora" / "raw"
  raw.mkdir(parents=True)
  parts = {
    "x": sp.csr_matrix(cora.features[:140]),
    "tx": sp.csr_matrix(cora.features[test_index]),
    "allx": sp.csr_matrix(cora.features[:n_all]),
    "y": onehot[:140],
    "ty": onehot[test_index],
    "ally": onehot[:n_all],
    "graph": graph,
  }
  for part, obj in parts.items():
    _pickle(raw / f"ind.cora.{part}", obj, py2_names=True)
  (raw / "ind.cora.test.index").write_text("".join(f"{i}\n" for i in test_index))
  ds = datasets.load_planetoid("Cora", tmp_path, download=False)
  for field in ("features", "labels", "train_idx", "val_idx", "test_idx", "edge_index"):
    np.testing.assert_array_equal(getattr(ds, field), getattr(cora, field), err_msg=field)
  assert (ds.adjacency != cora.adjacency).nnz == 0
