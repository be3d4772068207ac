"""Several processes through JAX's distributed runtime: 2 processes x 2 host devices (gloo CPU
collectives over localhost) train as 1 process x 4 devices does, and both as a float64 dense
reference on one device.

Each worker (this file run as a script, `--worker`) trains a few steps of
- a full-graph GCN on a ShardedMatrix that every process builds from its own rows only
  (`distributed.shard_coo_local`: it generates only those rows' edges, features and labels),
  once with the halo exchange and the default row ranges, once with the all-gather, given
  row blocks and own / remote parts;
- a data-parallel sampled GraphSAGE: each device of each process trains on its own sampled
  batch (`sampling.NeighborSampler`, `nn.functional.sage_conv` on the block's matrix), the
  gradients averaged over all processes' devices by a `pmean` on the global mesh
  (`distributed.stack_batches`),
and writes its losses as JSON. The pytest side launches both runs side by side (free ports,
timeouts, each worker's output shown on failure) and compares.

    python -m pytest -q tests/test_multihost.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

N, D, HIDDEN, CLASSES = 240, 8, 16, 4  # graph nodes, features, hidden width, classes
GCN_STEPS, SAGE_STEPS = 3, 3
SHARDS = 4  # devices of the global mesh in both runs
FANOUTS, BATCH = (4, 3), 12  # the sampler's, per device
GIVEN_BOUNDS = [0, 50, 130, 170, N]  # the all-gather run's row blocks (uneven on purpose)
HIGHEST = "highest"
TIMEOUT_S = 400


# ----------------------------------------------------------------------------------------------
# The data: a function of (seed, row), so that a process generates its own rows only.
# ----------------------------------------------------------------------------------------------
def graph_rows(seed: int, start: int, stop: int):
  """Rows start .. stop of the test graph: (rows, cols, values) of a row-averaging matrix with
  self-loops and 1 to 6 random neighbours per row, features [stop - start, D], labels and the
  training mask."""
  rows, cols, vals = [], [], []
  x = np.zeros((stop - start, D), np.float32)
  labels = np.zeros(stop - start, np.int32)
  train = np.zeros(stop - start, bool)
  for r in range(start, stop):
    g = np.random.default_rng([seed, r])
    nbrs = np.unique(np.concatenate([[r], g.choice(N, int(g.integers(1, 7)), replace=False)]))
    w = g.uniform(0.5, 1.0, nbrs.size)
    rows.append(np.full(nbrs.size, r))
    cols.append(nbrs)
    vals.append((w / w.sum()).astype(np.float32))
    x[r - start] = g.standard_normal(D)
    labels[r - start] = g.integers(CLASSES)
    train[r - start] = g.random() < 0.7
  cat = np.concatenate
  return cat(rows).astype(np.int64), cat(cols).astype(np.int64), cat(vals), x, labels, train


def init_params(seed: int):
  g = np.random.default_rng([seed, 1 << 20])
  gcn = {
    "w1": g.standard_normal((D, HIDDEN)).astype(np.float32) / np.sqrt(D),
    "b1": 0.1 * g.standard_normal(HIDDEN).astype(np.float32),
    "w2": g.standard_normal((HIDDEN, CLASSES)).astype(np.float32) / np.sqrt(HIDDEN),
  }
  widths = [D, HIDDEN, CLASSES]
  sage = {}
  for i in range(len(FANOUTS)):
    a, b = widths[i], widths[i + 1]
    sage[f"wl{i}"] = g.standard_normal((a, b)).astype(np.float32) / np.sqrt(a)
    sage[f"wr{i}"] = g.standard_normal((a, b)).astype(np.float32) / np.sqrt(a)
    sage[f"b{i}"] = 0.1 * g.standard_normal(b).astype(np.float32)
  return gcn, sage


def gcn_loss(p, prop, x, labels, mask, dot):
  """Two GCN layers (prop: the graph's product) and the masked mean cross-entropy."""
  import jax
  import jax.numpy as jnp

  h = jnp.tanh(prop(dot(x, p["w1"])) + p["b1"])
  logits = prop(dot(h, p["w2"]))
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]
  return jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.sum(mask)


def sage_loss(p, layers, h, labels, seed_mask):
  """GraphSAGE over sampled blocks, outermost first: layers[i](h) is block i's mean-aggregation
  layer (its output's target rows); the masked mean cross-entropy of the seeds."""
  import jax
  import jax.numpy as jnp

  for i, layer in enumerate(layers):
    h = layer(h, p[f"wl{i}"], p[f"wr{i}"], p[f"b{i}"])
    if i + 1 < len(layers):
      h = jax.nn.relu(h)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(h), labels[:, None], axis=1)[:, 0]
  return jnp.sum(jnp.where(seed_mask, ce, 0.0)) / jnp.maximum(jnp.sum(seed_mask), 1)


def sgd(p, g, lr=0.5):
  import jax

  return jax.tree_util.tree_map(lambda w, d: w - lr * d, p, g)


def sub_batch_seeds(seed: int, step: int, shard: int, train_nodes):
  """The seeds and the sampling seed of device `shard`'s batch at `step` (global: every run
  gives device k of step s the same batch, whichever process holds it)."""
  order = np.random.default_rng([seed, 7]).permutation(train_nodes)
  k = step * SHARDS + shard
  picked = np.take(order, np.arange(k * BATCH, (k + 1) * BATCH), mode="wrap")
  return np.unique(picked), int(np.random.SeedSequence([seed, step, shard]).generate_state(1)[0])


def sampler_and_graph(seed: int):
  """The whole graph's sampler (data parallelism: every process samples from all of it), the
  features, labels and training nodes."""
  from jaxsparse_tc.sampling import NeighborSampler

  rows, cols, _, x, labels, train = graph_rows(seed, 0, N)
  sampler = NeighborSampler.from_edge_index(
    np.stack([cols, rows]), N, list(FANOUTS), batch_size=BATCH
  )
  return sampler, x, labels, np.flatnonzero(train)


# ----------------------------------------------------------------------------------------------
# The worker (one process of a run).
# ----------------------------------------------------------------------------------------------
def worker(a) -> dict:
  sys.path.insert(0, a.root)  # the jaxsparse_tc the driver imported
  import jax
  from conftest import use_host_devices

  use_host_devices(a.devices)
  if a.num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
      coordinator_address=f"localhost:{a.port}",
      num_processes=a.num_processes,
      process_id=a.process_id,
    )
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc.nn import functional as F

  assert len(jax.devices()) == SHARDS, jax.devices()
  mesh = dist.make_mesh()
  axis = mesh.axis_names[0]
  gcn_p0, sage_p0 = init_params(a.seed)
  out = {"process": jax.process_index(), "gcn": {}, "layouts": {}}

  def scalar(v):
    return float(np.asarray(v.addressable_data(0)))

  # -- full-graph GCN: this process's rows only ---------------------------------------------
  dot = lambda u, w: jnp.dot(u, w, precision=HIGHEST)  # noqa: E731

  @jax.jit
  def gcn_step(p, M, x, labels, mask):
    prop = lambda h: jst.spmm(M, h, precision=HIGHEST)  # noqa: E731
    loss, g = jax.value_and_grad(gcn_loss)(p, prop, x, labels, mask, dot)
    return sgd(p, g), loss

  # The halo run takes the default row ranges; the all-gather run given row blocks and own /
  # remote parts (the SpMM overlaps the exchange).
  for name, kwargs in (("halo", {}), ("allgather", {"bounds": GIVEN_BOUNDS, "overlap": True})):
    start, stop = dist.local_row_range(N, mesh, bounds=kwargs.get("bounds"))
    rows, cols, vals, x, labels, train = graph_rows(a.seed, start, stop)
    SA = dist.shard_coo_local(rows, cols, vals, num_nodes=N, mesh=mesh, exchange=name, **kwargs)
    assert SA.local_row_range == (start, stop), (SA.local_row_range, start, stop)
    assert SA.layout.exchange == name, SA.layout
    if jax.process_count() == 1:  # one process: the same matrix as shard_coo's
      whole = dist.shard_coo(rows, cols, vals, num_nodes=N, mesh=mesh, exchange=name, **kwargs)
      assert whole.layout == SA.layout, (whole.layout, SA.layout)
      for u, v in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(SA)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    X, Y = SA.shard_local_rows(x), SA.shard_local_rows(labels)
    mask = SA.shard_local_rows(train) & SA.row_mask()
    p, losses = jax.tree_util.tree_map(jnp.asarray, gcn_p0), []
    for _ in range(GCN_STEPS):
      p, loss = gcn_step(p, SA, X, Y, mask)
      losses.append(scalar(loss))
    out["gcn"][name] = losses
    lay = SA.layout
    out["layouts"][name] = {
      "bounds": list(lay.bounds),
      "rows_per_shard": lay.rows_per_shard,
      "nnz_per_shard": lay.nnz_per_shard,
      "halo_rows": lay.halo_rows,
      "exchange": lay.exchange,
      "parts": [part.kind for part in lay.parts],
    }

  # -- data-parallel sampled GraphSAGE --------------------------------------------------------
  sampler, x_all, labels_all, train_nodes = sampler_and_graph(a.seed)
  shards = dist.local_shards(mesh)

  def device_batch(step, k):
    seeds, sample_seed = sub_batch_seeds(a.seed, step, k, train_nodes)
    b = sampler.batch(seeds, sample_seed)
    feats = x_all[np.asarray(b.input_nodes)] * np.asarray(b.input_mask)[:, None]
    return b, feats, labels_all[np.asarray(b.seeds)]

  def local_loss(p, batch):
    b, h, y = jax.tree_util.tree_map(lambda v: v[0], batch)  # this device's batch
    layers = [
      (lambda blk: lambda h, wl, wr, bias: blk.dst(F.sage_conv(blk.A, h, wl, wr, bias)))(blk)
      for blk in b.blocks
    ]
    return sage_loss(p, layers, h, y, b.seed_mask)

  def dp_body(p, batch):
    loss, g = jax.value_and_grad(local_loss)(p, batch)
    return jax.lax.pmean(loss, axis), jax.lax.pmean(g, axis)

  dp = dist.shard_map_compat(
    dp_body, mesh, (PartitionSpec(), PartitionSpec(axis)), (PartitionSpec(), PartitionSpec())
  )

  @jax.jit
  def sage_step(p, batch):
    loss, g = dp(p, batch)
    return sgd(p, g), loss

  p, losses = jax.tree_util.tree_map(jnp.asarray, sage_p0), []
  for step in range(SAGE_STEPS):
    batch = dist.stack_batches([device_batch(step, k) for k in shards], mesh)
    p, loss = sage_step(p, batch)
    losses.append(scalar(loss))
  out["sage"] = losses
  if a.num_processes > 1:
    jax.distributed.shutdown()
  return out


# ----------------------------------------------------------------------------------------------
# The pytest side: launch both runs, compare with each other and with a float64 reference.
# ----------------------------------------------------------------------------------------------
def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(num_processes: int, devices: int, seed: int, workdir: str):
  """Starts one run's processes: [(Popen, output path, log file)]."""
  from conftest import host_devices_env

  port = _free_port()
  # The workers import the jaxsparse_tc this process imported (a checkout or an installed wheel).
  import jaxsparse_tc

  root = os.path.dirname(os.path.dirname(os.path.abspath(jaxsparse_tc.__file__)))
  procs = []
  for i in range(num_processes):
    out = os.path.join(workdir, f"run{num_processes}x{devices}_p{i}.json")
    log = open(os.path.join(workdir, f"run{num_processes}x{devices}_p{i}.log"), "w+")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--process-id", str(i)]
    cmd += ["--num-processes", str(num_processes), "--devices", str(devices)]
    cmd += ["--port", str(port), "--seed", str(seed), "--out", out, "--root", root]
    env = host_devices_env(devices)
    procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), out, log))
  return procs


def _collect(procs, deadline: float) -> list:
  """Each process's JSON results; a failure names the process and shows its output."""
  results, failures = [], []
  for i, (proc, out, log) in enumerate(procs):
    try:
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.seek(0)
    text = log.read()
    log.close()
    if proc.returncode != 0 or not os.path.exists(out):
      failures.append(f"process {i} (exit {proc.returncode}):\n{text[-4000:]}")
    else:
      with open(out) as f:
        results.append(json.load(f))
  if failures:
    raise AssertionError("a worker failed (or timed out):\n" + "\n".join(failures))
  return results


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))


def reference_losses(seed: int) -> dict:
  """The same training, dense float64 on one device (jax_enable_x64 on)."""
  import jax
  import jax.numpy as jnp

  rows, cols, vals, x, labels, train = graph_rows(seed, 0, N)
  A = np.zeros((N, N))
  np.add.at(A, (rows, cols), vals.astype(np.float64))
  A = jnp.asarray(A)
  gcn_p, sage_p = (
    jax.tree_util.tree_map(lambda w: jnp.asarray(w, jnp.float64), p) for p in init_params(seed)
  )
  x64 = jnp.asarray(x, jnp.float64)
  grad = jax.jit(jax.value_and_grad(gcn_loss, argnums=0), static_argnums=(1, 5))
  prop = lambda h: A @ h  # noqa: E731
  gcn = []
  for _ in range(GCN_STEPS):
    loss, g = grad(gcn_p, prop, x64, jnp.asarray(labels), jnp.asarray(train), jnp.dot)
    gcn_p = sgd(gcn_p, g)
    gcn.append(float(loss))

  sampler, x_all, labels_all, train_nodes = sampler_and_graph(seed)

  def dense_layer(A, num_dst):
    deg = jnp.maximum(A.sum(1, keepdims=True), 1.0)

    def layer(h, wl, wr, b):
      out = (A @ h) / deg @ wl + b + h @ wr
      k = out.shape[0]
      return out[:num_dst] if k >= num_dst else jnp.pad(out, [(0, num_dst - k), (0, 0)])

    return layer

  def step_loss(p, batches):
    total = 0.0
    for layers, h, y, m in batches:
      total = total + sage_loss(p, layers, h, y, m)
    return total / len(batches)

  sage = []
  for step in range(SAGE_STEPS):
    batches = []
    for k in range(SHARDS):
      seeds, sample_seed = sub_batch_seeds(seed, step, k, train_nodes)
      b = sampler.batch(seeds, sample_seed)
      layers = [
        dense_layer(jnp.asarray(np.asarray(blk.A.todense(), np.float64)), blk.num_dst)
        for blk in b.blocks
      ]
      h = x_all[np.asarray(b.input_nodes)] * np.asarray(b.input_mask)[:, None]
      y = labels_all[np.asarray(b.seeds)]
      batches.append((layers, jnp.asarray(h, jnp.float64), jnp.asarray(y), b.seed_mask))
    loss, g = jax.value_and_grad(step_loss)(sage_p, batches)
    sage_p = sgd(sage_p, g)
    sage.append(float(loss))
  return {"gcn": gcn, "sage": sage}


def test_two_processes_train_as_one(rng, x64):
  """2 processes x 2 devices == 1 process x 4 devices (float32 tolerance) == float64 dense:
  full-graph GCN (halo and all-gather exchanges across the processes) and data-parallel SAGE."""
  seed = int(rng.integers(1 << 30))
  with tempfile.TemporaryDirectory() as workdir:
    deadline = time.monotonic() + TIMEOUT_S
    runs = {"1x4": _launch(1, 4, seed, workdir), "2x2": _launch(2, 2, seed, workdir)}
    ref = reference_losses(seed)  # meanwhile
    got = {name: _collect(procs, deadline) for name, procs in runs.items()}
  one, two = got["1x4"][0], got["2x2"]
  assert [r["process"] for r in two] == [0, 1]
  for r in two:  # every process sees the same global losses
    assert r["gcn"] == two[0]["gcn"] and r["sage"] == two[0]["sage"], (r, two[0])
  assert two[0]["layouts"]["allgather"] == one["layouts"]["allgather"]
  for name in ("halo", "allgather"):
    for tag, run in (("2x2", two[0]), ("1x4", one)):
      assert run["layouts"][name]["exchange"] == name
      err = _rel(run["gcn"][name], ref["gcn"])
      assert err < 1e-4, f"{tag} GCN ({name}) losses {run['gcn'][name]} vs float64 {ref['gcn']}"
    err = _rel(two[0]["gcn"][name], one["gcn"][name])
    assert err < 2e-5, f"GCN ({name}): 2x2 {two[0]['gcn'][name]} vs 1x4 {one['gcn'][name]}"
  for tag, run in (("2x2", two[0]), ("1x4", one)):
    err = _rel(run["sage"], ref["sage"])
    assert err < 1e-4, f"{tag} SAGE losses {run['sage']} vs float64 {ref['sage']}"
  err = _rel(two[0]["sage"], one["sage"])
  assert err < 2e-5, f"SAGE: 2x2 {two[0]['sage']} vs 1x4 {one['sage']}"


# In-process (one process, one device): the single-process behaviour and the refusals.
def _coo(rng, n=60, e=300):
  rows, cols = rng.integers(0, n, e), rng.integers(0, n, e)
  return rows, cols, rng.standard_normal(e).astype(np.float32)


def test_shard_coo_local_in_one_process_is_shard_coo(rng):
  import jax

  from jaxsparse_tc import distributed as dist

  mesh = dist.make_mesh(1)
  n = 60
  rows, cols, vals = _coo(rng, n)
  assert dist.local_row_range(n, mesh) == (0, n)
  want = dist.shard_coo(rows, cols, vals, num_nodes=n, mesh=mesh)
  got = dist.shard_coo_local(rows, cols, vals, num_nodes=n, mesh=mesh)
  assert got.layout == want.layout
  for u, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  x = rng.standard_normal((n, 3)).astype(np.float32)
  assert got.local_shards == dist.local_shards(mesh) == range(1)
  assert got.local_row_range == (0, n)
  np.testing.assert_array_equal(np.asarray(got.shard_local_rows(x)), np.asarray(got.shard_rows(x)))
  dense = np.zeros((n, n))
  np.add.at(dense, (rows, cols), vals.astype(np.float64))
  np.testing.assert_allclose(got.to_scipy().toarray(), dense, rtol=1e-6, atol=1e-6)


def test_shard_coo_local_refusals(rng):
  import pytest

  from jaxsparse_tc import distributed as dist

  mesh = dist.make_mesh(1)
  n = 60
  rows, cols, vals = _coo(rng, n)
  with pytest.raises(ValueError, match=r"holds rows 0 \.\. 29"):
    dist.shard_coo_local(rows, cols, vals, num_nodes=n, mesh=mesh, row_range=(0, 30))
  with pytest.raises(ValueError, match="row_range must be"):
    dist.shard_coo_local(rows, cols, vals, num_nodes=n, mesh=mesh, row_range=(10, 70))
  keep = rows < 30
  with pytest.raises(ValueError, match="must tile the 60 rows"):
    dist.shard_coo_local(rows[keep], cols[keep], num_nodes=n, mesh=mesh, row_range=(0, 30))
  SA = dist.shard_coo_local(rows, cols, vals, num_nodes=n, mesh=mesh)
  with pytest.raises(ValueError, match="this process's 60 rows"):
    SA.shard_local_rows(np.zeros((59, 2), np.float32))
  batch = {"a": np.zeros((3, 2), np.float32)}
  with pytest.raises(ValueError, match="takes 1 batches"):
    dist.stack_batches([batch, batch], mesh)
  stacked = dist.stack_batches([batch], mesh)
  assert stacked["a"].shape == (1, 3, 2)


def _main(argv) -> int:
  ap = argparse.ArgumentParser(description="one process of a multi-process run")
  ap.add_argument("--worker", action="store_true", required=True)
  ap.add_argument("--process-id", type=int, required=True)
  ap.add_argument("--num-processes", type=int, required=True)
  ap.add_argument("--devices", type=int, required=True, help="CPU devices of this process")
  ap.add_argument("--port", type=int, required=True, help="the coordinator's, on localhost")
  ap.add_argument("--seed", type=int, required=True)
  ap.add_argument("--out", required=True, help="where the JSON results go")
  ap.add_argument("--root", required=True, help="the folder holding the jaxsparse_tc to import")
  a = ap.parse_args(argv)
  result = worker(a)
  with open(a.out, "w") as f:
    json.dump(result, f)
  return 0


if __name__ == "__main__":
  raise SystemExit(_main(sys.argv[1:]))
