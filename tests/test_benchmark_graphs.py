"""The benchmark suite's generated graphs and its offline re-planning (benchmarks/, CPU only)."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsparse_tc as jst
from benchmarks import bench_kernels, common


def test_communities_graph():
  """A symmetric pattern, no self loops, deterministic for its arguments, and in affinity order its
  windows reuse their columns (what makes it the tensor cores' case)."""
  g = common.communities(12, 64, 16)
  h = common.load_graph("comm12-c64-d16")
  assert g.shape == (4096, 4096) and (g != h).nnz == 0
  pattern = g.copy()
  pattern.data[:] = 1
  assert (pattern != pattern.T).nnz == 0 and g.diagonal().sum() == 0
  assert 16 <= g.nnz / g.shape[0] <= 34  # 2 x (16 + 1) draws, less duplicates and self loops
  assert (common.communities(12, 64, 16, seed=1) != g).nnz > 0
  r = jst.reorder(g, "affinity", seed=0)
  p = g[r.perm][:, r.perm].tocsr()
  f = jst.kernel_plan(jst.SparseMatrix.from_scipy(p), 128).features
  assert f.nnz / f.condensed_cols > 2.0, f
  with pytest.raises(ValueError, match="divisible"):
    common.communities(12, 48, 4)
  assert common.graph_kind("comm12-c64-d16") == "communities"
  assert common.graph_kind("rmat17-d16") == "rmat" and common.graph_kind("DD") == "real"


def test_replan_takes_the_forced_kernel_of_todays_pick():
  """replan_rows, then plan_rows (as summarize runs them): a config's auto becomes the forced row
  of the kernel the selector picks from the features the rows record; other rows pass
  through."""
  g = common.communities(16, 64, 8)
  r = jst.reorder(g, "affinity", seed=0)
  A = jst.SparseMatrix.from_scipy(g[r.perm][:, r.perm].tocsr())
  f = jst.kernel_plan(A, 128).features
  base = {
    "graph": "comm16-c64-d8",
    "order": "affinity",
    "op": "spmm",
    "d": 128,
    "dtype": "fp16",
    "rows": f.rows,
    "nnz": f.nnz,
    "nnz_per_block": f.nnz_per_block,
    "cols_per_window": f.cols_per_window,
  }
  rows = [
    {**base, "impl": "ours-auto", "us_per_call": 9.0, "plan": "rows"},
    {**base, "impl": "ours-rows", "us_per_call": 2.0},
    {**base, "impl": "ours-windows", "us_per_call": 1.0},
    {**base, "impl": "cusparse", "us_per_call": 5.0},
  ]
  want = jst.kernel_plan(A, 128, np.float16).spmm
  out = bench_kernels.plan_rows(bench_kernels.replan_rows(rows))
  (auto,) = [x for x in out if x["impl"] == "ours-auto"]
  assert auto["plan"] == want and auto["us_per_call"] == (1.0 if want == "windows" else 2.0)
  assert sorted(x["impl"] for x in out if x["impl"] != "ours-auto") == [
    "cusparse",
    "ours-rows",
    "ours-windows",
  ]


def test_compare_pairs_rows_of_renamed_kernel_families(tmp_path):
  """An older tree's impl names (ours-cuda_core, ours-tensor_core) pair with today's."""
  import json

  from benchmarks import compare

  key = {"graph": "g", "order": "none", "op": "spmm", "d": 64, "dtype": "fp16", "H": 1}
  before, after = tmp_path / "before.json", tmp_path / "after.json"
  rng = np.random.default_rng()
  t_rows, t_windows = rng.uniform(1, 10, 2)
  before.write_text(
    json.dumps(
      {
        "rows": [
          {**key, "impl": "ours-cuda_core", "us_per_call": t_rows},
          {**key, "impl": "ours-tensor_core", "us_per_call": t_windows},
        ]
      }
    )
  )
  after.write_text(
    json.dumps(
      {
        "rows": [
          {**key, "impl": "ours-rows", "us_per_call": 2 * t_rows},
          {**key, "impl": "ours-windows", "us_per_call": 3 * t_windows},
        ]
      }
    )
  )
  b, a = compare.load([before]), compare.load([after])
  assert set(b) == set(a) and len(a) == 2
  out = compare.compare(b, a)
  assert "| ours-rows |" in out and "| 2.000 |" in out and "| 3.000 |" in out
  assert "cuda_core" not in out and "tensor_core" not in out


# Block statistics of the real dense-community graphs in their own order (block_stats_table on
# ../shared/data's imdb-binary and imdb-multi) and the held-back large graph's figures: nnz per
# 8x8 block, distinct columns per 8-row window, row length mean / CV / max over mean.
DENSE_TARGETS = {
  "imdb": {"nnz/block": 21.2, "cols/window": 26.1, "row mean": 9.76, "row CV": 0.76},
  "imdbm": {"nnz/block": 24.5, "cols/window": 23.0, "row mean": 10.14, "row CV": 0.79},
  "large": {"nnz/block": 36.0, "cols/window": 113.0},
}
# The same after jst.reorder(g, "affinity", seed=0) (the held-back graph's are not known).
DENSE_AFFINITY_TARGETS = {
  "imdb": {"nnz/block": 26.6, "cols/window": 20.1},
  "imdbm": {"nnz/block": 30.0, "cols/window": 18.4},
}


@pytest.mark.parametrize(
  "preset,edges", [("imdb", 193_000), ("imdbm", 198_000), ("large", 600_000)]
)
def test_dense_standins_hit_their_block_statistics(preset, edges):
  """The stand-ins keep the block figures they were fitted to (within 15%; row CV 25%), in their
  own order and (imdb presets) in affinity order, at the requested edge count (within 5%),
  symmetric, no self loops, and a different seed draws another graph with the same figures."""
  from benchmarks import block_stats_table, standins

  for seed in (0, 1):
    g = standins.dense_communities(edges, preset, seed=seed)
    assert abs(g.nnz - edges) <= 0.05 * edges, (preset, seed, g.nnz)
    pattern = g.copy()
    pattern.data[:] = 1
    assert (pattern != pattern.T).nnz == 0 and g.diagonal().sum() == 0
    got = block_stats_table.graph_stats(g)
    for key, want in DENSE_TARGETS[preset].items():
      tol = 0.25 if key == "row CV" else 0.15
      assert abs(got[key] - want) <= tol * want, (preset, seed, key, got[key], want)
    if seed == 0 and preset in DENSE_AFFINITY_TARGETS:
      got = block_stats_table.graph_stats(g, jst.reorder(g, "affinity", seed=0).perm)
      for key, want in DENSE_AFFINITY_TARGETS[preset].items():
        assert abs(got[key] - want) <= 0.15 * want, (preset, "affinity", key, got[key], want)
  assert (standins.dense_communities(edges, preset, seed=1) != g).nnz == 0  # deterministic
  h = standins.dense_communities(edges, preset, seed=0)
  assert h.shape != g.shape or (h != g).nnz > 0


def test_dense_standin_names():
  """dense{E}{k|M}-{preset}[-rand] names parse, load through common.load_graph and are
  generated graphs; others are not dense names."""
  from benchmarks import standins

  assert standins.parse_dense_name("dense193k-imdb") == (193_000, "imdb", "listed")
  assert standins.parse_dense_name("dense24.6M-large") == (24_600_000, "large", "listed")
  assert standins.parse_dense_name("dense2M-imdbm-rand") == (2_000_000, "imdbm", "random")
  for bad in ("dense193-imdb", "dense2M-other", "dense2M", "comm12-c64-d16", "imdb-binary"):
    assert standins.parse_dense_name(bad) is None, bad
  assert common.graph_kind("dense50k-imdb") == "dense" and common.is_synthetic("dense50k-imdb")
  g = common.load_graph("dense50k-imdb")
  assert (g != standins.dense_communities(50_000, "imdb")).nnz == 0
  r = common.load_graph("dense50k-imdb-rand")
  assert r.nnz == g.nnz and (r != g).nnz > 0  # same graph, node ids permuted
  with pytest.raises(ValueError, match="shape must be one of"):
    standins.dense_communities(50_000, "nope")
  with pytest.raises(ValueError, match="edges must be at least"):
    standins.dense_communities(10, "imdb")


def test_flashsparse_peer_reports_the_fastest_right_variant(monkeypatch):
  """FlashSparse's SpMM row is its fastest variant among those matching float64: a faster wrong
  one (or one giving NaN) is never reported; none right gives an error, not a time."""
  import scipy.sparse as sp

  from benchmarks import flashsparse_peer

  csr = sp.random(40, 40, density=0.2, random_state=1, format="csr")
  pattern = csr.astype(np.float64)
  pattern.data[:] = 1.0
  ms_of = dict(zip(flashsparse_peer.SPMM_VARIANTS, (0.4, 0.1, 0.2, 0.3)))

  def fake_call(wrong):
    def call(fs, csr_, x, dtype, epochs, variant):
      out = pattern @ x.astype(np.float64)
      if variant in wrong:
        out = out + (np.nan if variant == ("map", 8) else 1.0)
      return out.astype(np.float32), ms_of[variant]

    return call

  def rows_of(wrong):
    monkeypatch.setattr(flashsparse_peer, "spmm_call", fake_call(wrong))
    got = []
    flashsparse_peer.peer_rows(
      lambda op, d, dtype, impl, fn: got.append(fn()), None, csr, {"spmm"}, [8], ["fp16"], 5
    )
    return got

  (row,) = rows_of({("balance", 16), ("map", 8)})  # the fastest (balance-16) is wrong
  assert row["us_per_call"] == pytest.approx(200.0) and row["how"].endswith("map-4")
  assert row["rel_err"] <= flashsparse_peer.CHECK_TOL
  assert row["variants"]["balance-16"]["rel_err"] > flashsparse_peer.CHECK_TOL
  assert np.isnan(row["variants"]["map-8"]["rel_err"])
  with pytest.raises(RuntimeError, match="no FlashSparse SpMM variant matched"):
    rows_of(set(flashsparse_peer.SPMM_VARIANTS))


def test_flashsparse_peer_import_failures_are_clear(tmp_path):
  """A missing folder, a folder without FlashSparse's modules and a module that fails to import
  each raise FlashSparseUnavailable naming the path and the modules; bench_kernels' run fails
  on it before timing anything."""
  import argparse
  import sys

  from benchmarks import flashsparse_peer

  missing = tmp_path / "nope"
  with pytest.raises(flashsparse_peer.FlashSparseUnavailable, match="is not a folder"):
    flashsparse_peer.load(missing)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(flashsparse_peer.FlashSparseUnavailable, match="cannot import FS_Block") as e:
    flashsparse_peer.load(empty)
  assert str(empty) in str(e.value) and "FS_SDDMM" in str(e.value)
  broken = tmp_path / "broken"
  (broken / "build" / "lib.linux-x86_64").mkdir(parents=True)
  for name in flashsparse_peer.MODULES:
    (broken / "build" / "lib.linux-x86_64" / f"{name}.py").write_text(
      "import a_dependency_that_is_not_installed\n"
    )
  try:
    with pytest.raises(flashsparse_peer.FlashSparseUnavailable, match="a_dependency") as e:
      flashsparse_peer.load(broken)
    assert "lib.linux-x86_64" in str(e.value)  # build/lib.* folders are searched
  finally:
    for name in flashsparse_peer.MODULES:
      sys.modules.pop(name, None)
    sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]
  a = argparse.Namespace(
    quick=True,
    chain=None,
    graphs="cora",
    dims="32",
    dtypes="fp16",
    ops="spmm",
    xla_dims="",
    attention_dims="",
    orders="none",
    skip="",
    flashsparse=str(missing),
  )
  with pytest.raises(flashsparse_peer.FlashSparseUnavailable, match="--flashsparse"):
    bench_kernels.run(a)
  with pytest.raises(SystemExit, match="not a folder"):
    flashsparse_peer.main([str(missing)])


def test_bench_kernels_split_blocks_reaches_the_schedule():
  """bench_kernels --split-blocks builds the matrix with FormatOptions(split_blocks) and records
  the schedule's largest split piece in every row (the split rule's probes ran this way)."""
  import scipy.sparse as sp

  from benchmarks import bench_kernels

  rng = np.random.default_rng(3)
  rows = np.concatenate([np.repeat(np.arange(8), 400), rng.integers(8, 4000, 70_000)])
  cols = rng.integers(0, 4000, rows.size)
  csr = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(4000, 4000))
  csr.sum_duplicates()
  csr.sort_indices()
  base = {"graph": "t", "order": "none"}
  for forced in (None, 16, 32):
    _, A, feats = bench_kernels._prepare(base, csr, "none", forced)
    assert feats["split_blocks"] == int(np.asarray(A.pattern.schedule)[:, 3].max())
    # one long window among short ones: the rule's finer pieces (8), or the forced size
    assert feats["split_blocks"] == (8 if forced is None else forced), forced


def test_window_model_counts_gathers_and_tiles(rng):
  """window_model's gathers (distinct columns per h-row window) and h x 8 tiles against a count
  done row by row, on a random pattern with empty rows and one dense 16 x 16 block."""
  import scipy.sparse as sp

  from benchmarks import window_model

  m, n = 70, 90
  dense = np.zeros((m, n), bool)
  dense[16:32, 40:56] = True
  dense |= rng.random((m, n)) < 0.05
  dense[50:58] = False
  csr = sp.csr_matrix(dense.astype(np.float32))
  for h in window_model.HEIGHTS:
    cols = [np.flatnonzero(dense[w : w + h].any(axis=0)).size for w in range(0, m, h)]
    gathers, tiles = window_model.window_figures(csr, h)
    assert gathers == sum(cols) and tiles == sum(-(-c // 8) for c in cols), h
  rows = window_model.model_rows("t", "caller", csr, 64)
  assert [r["h"] for r in rows] == list(window_model.HEIGHTS)
  assert rows[0]["saved vs h=8"] == 0 and rows[1]["saved vs h=8"] > 0
  # SDDMM adds each window row of one operand, attention a K and a V row per column and Q's rows
  g8, _ = window_model.window_figures(csr, 8)
  for op, rows_read in (("spmm", g8), ("sddmm", g8 + m), ("attention", 2 * g8 + m)):
    r8 = window_model.model_rows("t", "caller", csr, 64, op=op)[0]
    assert r8["gather MB"] == pytest.approx(rows_read * 64 * 2 / 1e6), op
  floors = [window_model.floor_bytes(csr, 64, 2, op) for op in ("spmm", "sddmm", "attention")]
  assert floors[0] < floors[2] and floors[1] < floors[2]


def test_summaries_read_older_runs_and_count_the_selector_targets(tmp_path):
  """Saved runs with the old family names load under today's (so --summarize --replan reads
  them), and the selector table counts configurations within 5% / past 15% of the best."""
  import json

  rng = np.random.default_rng()
  t_rows, t_windows = rng.uniform(1, 10, 2)
  key = {"graph": "g", "order": "none", "op": "spmm", "d": 64, "dtype": "fp16", "H": None}
  rows = [
    {**key, "impl": "ours-cuda_core", "us_per_call": t_rows, "plan": "cuda_core"},
    {**key, "impl": "ours-tensor_core", "us_per_call": t_windows},
    {**key, "impl": "ours-auto", "us_per_call": 1.1 * max(t_rows, t_windows), "plan": "rows"},
  ]
  path = tmp_path / "old.json"
  path.write_text(json.dumps({"rows": rows, "device": "test"}))
  loaded, device = bench_kernels._load_json([path])
  assert device == "test"
  assert sorted(r["impl"] for r in loaded) == ["ours-auto", "ours-rows", "ours-windows"]
  assert loaded[0]["plan"] == "rows"
  (sel, *_) = bench_kernels._selector_table(bench_kernels.derive(loaded), ["none"], "")
  far = max(t_rows, t_windows) * 1.1 > 1.15 * min(t_rows, t_windows)
  assert (sel["within 5%"], sel["past 15%"]) == (0, int(far))
