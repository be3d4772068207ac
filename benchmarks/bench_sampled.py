"""Sampled mini-batch training: 2-layer GraphSAGE epochs, ours vs PyTorch Geometric.

Ours: jaxsparse_tc.sampling.NeighborLoader (padded fixed-shape blocks, prefetched on a host
thread) and nn.functional.sage_conv, forward + backward + Adam in one jitted step. PyG:
torch_geometric.loader.NeighborLoader and SAGEConv on the same GPU, features and labels on the
device (the loader returns ids only). Both: mean aggregation, hidden 256, fanouts [15, 10],
batch 1024, 128 random input features, random labels over 16 classes.

Reported per graph: epoch time each (median over --epochs after a warm-up epoch), our sampler's
time per batch (sample + pad, serial, one batch at a time), our device-busy fraction (time
inside the jitted step, blocked on, over the epoch wall), PyG's loader time per batch
(iterating without training) and which PyG sampler backend ran (pyg-lib, torch-sparse, or
none: PyG's NeighborLoader then cannot sample, which is reported, not hidden).

Memory: JAX keeps its default pool (75% of the GPU); PyG runs in the rest (R-MAT 2^22 x 16
with 128 float32 features: 2.1 GB of features on the device).

Graphs: R-MAT 2^scale x degree (benchmarks/common.py rmat_csr; edges u -> v as generated)
and, with --data, a real graph: a .npz of benchmarks' shared/data layout (row/col edge lists,
symmetrized when stored once, or indptr/indices CSR), --data PATH.npz or --data DIR --graph NAME.

    python benchmarks/bench_sampled.py                      # GPU machine: rmat22-d16
    python benchmarks/bench_sampled.py --data shared/data --graph DD
    python benchmarks/bench_sampled.py --quick              # CPU smoke run, tiny graph
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import SHARED_DATA, rmat_csr  # noqa: E402

# -- graphs ----------------------------------------------------------------------------------------


def rmat_graph(scale: int, degree: int, seed: int = 0):
  """edge_index (int64 [2, E], u -> v) and node count of R-MAT 2^scale x degree."""
  m = rmat_csr(scale, degree, seed=seed)
  rows = np.repeat(np.arange(m.shape[0], dtype=np.int32), np.diff(m.indptr))
  return np.stack([rows, m.indices.astype(np.int32)]), m.shape[0]


def real_graph(data: str, name: str | None):
  """edge_index and node count of a benchmark .npz (shared/data/README.md layouts)."""
  path = Path(data)
  if path.is_dir():
    if name is None:
      raise SystemExit("--data DIR needs --graph NAME (a NAME.npz inside DIR)")
    path = path / f"{name}.npz"
  d = np.load(path)
  if "row" in d.files:
    row, col = d["row"].astype(np.int32), d["col"].astype(np.int32)
    n = int(d["num_nodes"])
    stored = str(d["stored_as"]) if "stored_as" in d.files else ""
    if "once" in stored:  # undirected, each edge listed once: both directions
      row, col = np.concatenate([row, col]), np.concatenate([col, row])
  else:
    indptr, col = d["indptr"], d["indices"].astype(np.int32)
    n = int(indptr.shape[0] - 1)
    row = np.repeat(np.arange(n, dtype=np.int32), np.diff(indptr))
  return np.stack([row, col]), n, path.stem


# -- ours ------------------------------------------------------------------------------------------


def adam_init(params):
  import jax

  zeros = jax.tree_util.tree_map(lambda p: p * 0, params)
  return (zeros, zeros, 0)


def run_ours(edge_index, n, train, features, labels, args, log):
  import jax
  import jax.numpy as jnp

  from jaxsparse_tc.nn import functional as F
  from jaxsparse_tc.sampling import NeighborLoader, NeighborSampler

  rng = np.random.default_rng(0)
  x = jax.device_put(features)
  y = jax.device_put(labels)
  t0 = time.perf_counter()
  sampler = NeighborSampler.from_edge_index(
    edge_index, n, args.fanouts, batch_size=args.batch, threads=args.sampler_threads
  )
  if args.caps == "auto":
    # Caps a little above the largest of some sampled batches: the worst-case budgets (targets
    # x fanout) are several times what batches hold, and every padded slot costs format-build
    # time on the host and kernel time on the device. The graph's CSR is reused.
    max_sources, max_edges = sampler.suggest_caps(
      train, batches=args.sampler_batches, slack=args.cap_slack
    )
    sampler = NeighborSampler(
      sampler.indptr,
      sampler.indices,
      args.fanouts,
      batch_size=args.batch,
      threads=args.sampler_threads,
      edge_order=sampler._edge_order,
      max_sources=max_sources,
      max_edges=max_edges,
    )
  log(
    f"  ours: sampler built in {time.perf_counter() - t0:.2f} s; caps {args.caps}: "
    f"(node slots, nnz) per layer {[(b.num_nodes, b.nnz) for b in sampler.budgets]}"
  )
  dims = [args.features] + [args.hidden] * (len(args.fanouts) - 1) + [args.classes]
  params = []
  for a, b in zip(dims[:-1], dims[1:]):
    s = 1 / np.sqrt(a)
    params.append(
      {
        "wl": jnp.asarray(rng.uniform(-s, s, (a, b)), jnp.float32),
        "wr": jnp.asarray(rng.uniform(-s, s, (a, b)), jnp.float32),
        "b": jnp.zeros(b, jnp.float32),
      }
    )

  def forward(params, batch):
    h = x[batch.input_nodes]
    for i, (block, p) in enumerate(zip(batch.blocks, params)):
      h = block.dst(F.sage_conv(block.A, h, p["wl"], p["wr"], p["b"], aggr="mean"))
      if i + 1 < len(params):
        h = jax.nn.relu(h)
    return h

  def loss_fn(params, batch):
    logits = forward(params, batch)
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, y[batch.seeds][:, None], axis=1)[:, 0]
    m = batch.seed_mask
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1)

  @jax.jit
  def step(params, opt, batch):
    loss, g = jax.value_and_grad(loss_fn)(params, batch)
    m, v, t = opt
    t = t + 1
    b1, b2, lr = 0.9, 0.999, 1e-3
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    params = jax.tree_util.tree_map(
      lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), params, m, v
    )
    return params, (m, v, t), loss

  # Sampler time per batch, serial: sample (C++) and pad (format build + transfer).
  batches = NeighborLoader(sampler, train, seed=1).seed_batches()
  t_sample, t_pad = [], []
  for i, seeds in enumerate(batches[: args.sampler_batches]):
    a = time.perf_counter()
    layers = sampler.sample(seeds, seed=i)
    b = time.perf_counter()
    jax.block_until_ready(sampler.pad(layers))
    c = time.perf_counter()
    t_sample.append(b - a)
    t_pad.append(c - b)
  sample_ms = 1e3 * statistics.median(t_sample)
  pad_ms = 1e3 * statistics.median(t_pad)
  log(f"  ours: sampler per batch: sample {sample_ms:.1f} ms + pad {pad_ms:.1f} ms (median)")

  # Loader throughput alone, for each prefetch depth.
  rates = {}
  for prefetch in args.prefetch_rates:
    loader = NeighborLoader(sampler, train, seed=2, prefetch=prefetch)
    k = min(len(batches), args.sampler_batches)
    a = time.perf_counter()
    for i, batch in enumerate(loader):
      if i + 1 == k:
        jax.block_until_ready(batch)
        break
    rates[prefetch] = k / (time.perf_counter() - a)
  log(
    "  ours: loader batches/s by prefetch: " + ", ".join(f"{p}: {r:.1f}" for p, r in rates.items())
  )

  loader = NeighborLoader(sampler, train, seed=0, prefetch=args.prefetch)
  opt = adam_init(params)
  epochs = []
  for epoch in range(args.epochs + 1):  # epoch 0 compiles: a warm-up
    start = time.perf_counter()
    busy = 0.0
    loss = None
    for batch in loader:
      a = time.perf_counter()
      params, opt, loss = step(params, opt, batch)
      jax.block_until_ready(loss)
      busy += time.perf_counter() - a
    wall = time.perf_counter() - start
    log(
      f"  ours: epoch {epoch}{' (warm-up)' if epoch == 0 else ''}: {wall:.3f} s, "
      f"device busy {busy / wall:.0%}, loss {float(loss):.4f}"
    )
    if epoch:
      epochs.append((wall, busy))
  wall = statistics.median(w for w, _ in epochs)
  busy = statistics.median(b / w for w, b in epochs)
  return {
    "epoch_s": wall,
    "busy_fraction": busy,
    "sample_ms": sample_ms,
    "pad_ms": pad_ms,
    "loader_batches_per_s": rates,
    "batches": len(batches),
  }


# -- PyG -------------------------------------------------------------------------------------------


def pyg_backend() -> str:
  """The sampler PyG's NeighborLoader runs: pyg-lib, torch-sparse, or none."""
  import torch_geometric.typing as tg

  if getattr(tg, "WITH_PYG_LIB", False):
    return "pyg-lib"
  if getattr(tg, "WITH_TORCH_SPARSE", False):
    return "torch-sparse"
  return "none (neither pyg-lib nor torch-sparse imports)"


def run_pyg(edge_index, n, train, features, labels, args, log):
  try:
    import torch
    import torch.nn.functional as TF
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import SAGEConv
  except ImportError as e:
    log(f"  pyg: skipped ({e})")
    return {"skipped": str(e)}
  backend = pyg_backend()
  log(f"  pyg: torch {torch.__version__}, sampler backend: {backend}")
  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  x = torch.from_numpy(features).to(dev)
  y = torch.from_numpy(labels.astype(np.int64)).to(dev)
  data = Data(edge_index=torch.from_numpy(edge_index.astype(np.int64)), num_nodes=n)
  try:
    loader = NeighborLoader(
      data,
      num_neighbors=list(args.fanouts),
      batch_size=args.batch,
      input_nodes=torch.from_numpy(train),
      shuffle=True,
      num_workers=args.pyg_workers,
      persistent_workers=args.pyg_workers > 0,
    )
  except (ImportError, RuntimeError) as e:
    log(f"  pyg: NeighborLoader unavailable ({e})")
    return {"backend": backend, "skipped": str(e)}

  class SAGE(torch.nn.Module):
    def __init__(self, dims):
      super().__init__()
      self.convs = torch.nn.ModuleList(
        SAGEConv(a, b, aggr="mean") for a, b in zip(dims[:-1], dims[1:])
      )

    def forward(self, x, edge_index):
      for i, conv in enumerate(self.convs):
        x = conv(x, edge_index)
        if i + 1 < len(self.convs):
          x = TF.relu(x)
      return x

  dims = [args.features] + [args.hidden] * (len(args.fanouts) - 1) + [args.classes]
  model = SAGE(dims).to(dev)
  opt = torch.optim.Adam(model.parameters(), lr=1e-3)
  sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

  # Loader alone: time per batch of sampling (and PyG's subgraph filtering) without training.
  k = 0
  a = time.perf_counter()
  try:
    for _ in loader:
      k += 1
      if k == args.sampler_batches:
        break
  except (ImportError, RuntimeError) as e:  # PyG samples only with pyg-lib or torch-sparse
    log(f"  pyg: NeighborLoader cannot sample ({e})")
    return {"backend": backend, "skipped": str(e)}
  sampler_ms = 1e3 * (time.perf_counter() - a) / max(k, 1)
  log(f"  pyg: loader per batch {sampler_ms:.1f} ms ({args.pyg_workers} workers)")

  epochs = []
  for epoch in range(args.epochs + 1):
    sync()
    start = time.perf_counter()
    for batch in loader:
      ids = batch.n_id.to(dev, non_blocking=True)
      ei = batch.edge_index.to(dev, non_blocking=True)
      opt.zero_grad()
      out = model(x[ids], ei)[: batch.batch_size]
      loss = TF.cross_entropy(out, y[ids[: batch.batch_size]])
      loss.backward()
      opt.step()
    sync()
    wall = time.perf_counter() - start
    log(f"  pyg: epoch {epoch}{' (warm-up)' if epoch == 0 else ''}: {wall:.3f} s, loss {loss:.4f}")
    if epoch:
      epochs.append(wall)
  return {"backend": backend, "epoch_s": statistics.median(epochs), "loader_ms": sampler_ms}


# -- main ------------------------------------------------------------------------------------------


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--quick", action="store_true", help="tiny graph, 1 epoch: a CPU smoke run")
  p.add_argument("--scale", type=int, default=22)
  p.add_argument("--degree", type=int, default=16)
  p.add_argument("--no-rmat", action="store_true", help="only the --data graph")
  p.add_argument("--data", default=None, help="a .npz file, or a folder with --graph")
  p.add_argument("--graph", default=None, help="NAME.npz inside --data")
  p.add_argument(
    "--train-nodes", type=int, default=1 << 17, help="seeds per epoch (random nodes; 0: all)"
  )
  p.add_argument("--batch", type=int, default=1024)
  p.add_argument("--fanouts", default="15,10")
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--features", type=int, default=128)
  p.add_argument("--classes", type=int, default=16)
  p.add_argument("--epochs", type=int, default=3, help="timed epochs (after a warm-up)")
  p.add_argument("--prefetch", type=int, default=2, help="our loader's prefetch depth")
  p.add_argument(
    "--caps",
    choices=("auto", "worst"),
    default="auto",
    help="our budgets: auto (--cap-slack x the largest of --sampler-batches sampled batches) "
    "or worst (targets x fanout: no batch can overflow)",
  )
  p.add_argument("--cap-slack", type=float, default=1.25)
  p.add_argument("--sampler-threads", type=int, default=0, help="our sampler's threads (0: all)")
  p.add_argument("--sampler-batches", type=int, default=20)
  p.add_argument("--pyg-workers", type=int, default=4, help="PyG loader worker processes")
  p.add_argument("--skip-pyg", action="store_true")
  p.add_argument("--json", default=None, help="write the results here")
  args = p.parse_args(argv)
  args.fanouts = [int(f) for f in args.fanouts.split(",")]
  args.prefetch_rates = (0, 2, 4)
  if args.quick:
    args.scale, args.degree, args.train_nodes = 12, 8, 2048
    args.batch, args.hidden, args.features, args.epochs = 256, 32, 16, 1
    args.sampler_batches, args.pyg_workers = 4, 0
    if args.data is None and (SHARED_DATA / "cora.npz").exists():
      args.data, args.graph = str(SHARED_DATA), "cora"

  import jax

  log = lambda s: print(s, flush=True)
  log(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; cpus {os.cpu_count()}")
  graphs = []
  if not args.no_rmat:
    t0 = time.perf_counter()
    ei, n = rmat_graph(args.scale, args.degree)
    log(
      f"rmat{args.scale}-d{args.degree}: {n} nodes, {ei.shape[1]} edges "
      f"({time.perf_counter() - t0:.1f} s)"
    )
    graphs.append((f"rmat{args.scale}-d{args.degree}", ei, n))
  if args.data:
    ei, n, name = real_graph(args.data, args.graph)
    log(f"{name}: {n} nodes, {ei.shape[1]} edges")
    graphs.append((name, ei, n))

  results = {}
  for name, ei, n in graphs:
    log(f"== {name}")
    rng = np.random.default_rng(0)
    k = n if args.train_nodes <= 0 else min(args.train_nodes, n)
    train = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
    features = rng.standard_normal((n, args.features), dtype=np.float32)
    labels = rng.integers(0, args.classes, n).astype(np.int32)
    r = {"nodes": n, "edges": int(ei.shape[1]), "train_nodes": k}
    r["ours"] = run_ours(ei, n, train, features, labels, args, log)
    if not args.skip_pyg:
      r["pyg"] = run_pyg(ei, n, train, features, labels, args, log)
    results[name] = r
    o, q = r["ours"], r.get("pyg", {})
    line = (
      f"{name}: ours {o['epoch_s']:.3f} s/epoch ({o['batches']} batches, busy "
      f"{o['busy_fraction']:.0%}, sampler {o['sample_ms'] + o['pad_ms']:.1f} ms/batch)"
    )
    if "epoch_s" in q:
      line += (
        f"; PyG {q['epoch_s']:.3f} s/epoch (backend {q['backend']}, loader "
        f"{q['loader_ms']:.1f} ms/batch): {q['epoch_s'] / o['epoch_s']:.2f}x"
      )
    else:
      line += f"; PyG: {q.get('skipped', 'skipped')}"
    log(line)
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
  main()
