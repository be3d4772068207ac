"""Sampled mini-batch training: 2-layer GraphSAGE epochs, ours vs PyTorch Geometric, and vs
PyG's SAGEConv fed by a neighbour sampler in plain PyTorch on the same GPU.

Ours: jaxsparse_tc.sampling.NeighborLoader (padded fixed-shape blocks, built ahead on host
threads; the epochs use the batches-in-flight count whose loader throughput measured fastest,
--prefetch to fix it) and nn.functional.sage_conv, forward + backward + Adam in one jitted
step. PyG:
torch_geometric.loader.NeighborLoader and SAGEConv on the same GPU, features and labels on the
device (the loader returns ids only). Both: mean aggregation, hidden 256, fanouts [15, 10],
batch 1024, 128 random input features, random labels over 16 classes.

Reported per graph: epoch time each (median over --epochs after a warm-up epoch), our sampler's
time per batch (sample + pad, serial, one batch at a time), our device-busy fraction (time
inside the jitted step, blocked on, over the epoch wall), PyG's loader time per batch
(iterating without training) and which PyG sampler backend ran (pyg-lib, torch-sparse, or
none: PyG's NeighborLoader then cannot sample, which is reported, not hidden).

torch-sampler (runs where PyG has no sampler backend): the same PyG model and Adam step on
subgraphs from TorchNeighborSampler, uniform sampling without replacement in PyTorch on the
device, laid out as PyG's NeighborLoader lays them out (n_id, one edge_index). Reported: its
epoch time, its sampler time per batch (synchronised, without training) and its epoch time
over ours. --quick first asserts the sampler's correctness on a small graph (CPU).

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

  def forward(params, batch, x):
    h = x[batch.input_nodes]
    for i, (block, p) in enumerate(zip(batch.blocks, params)):
      h = block.dst(F.sage_conv(block.A, h, p["wl"], p["wr"], p["b"], aggr="mean"))
      if i + 1 < len(params):
        h = jax.nn.relu(h)
    return h

  def loss_fn(params, batch, x, y):
    logits = forward(params, batch, x)
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, y[batch.seeds][:, None], axis=1)[:, 0]
    m = batch.seed_mask
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1)

  # Features and labels are arguments, not closed-over constants: captured device arrays would
  # be copied into the compiled program (gigabytes at rmat22 and a long first step).
  @jax.jit
  def step(params, opt, batch, x, y):
    loss, g = jax.value_and_grad(loss_fn)(params, batch, x, y)
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

  # Loader throughput alone, for each prefetch depth (batches in flight on host threads, the
  # cores shared among them).
  rates = {}
  for prefetch in args.prefetch_rates:
    loader = NeighborLoader(sampler, train, seed=2, prefetch=prefetch)
    k = min(len(batches), 4 * args.sampler_batches)
    a = time.perf_counter()
    for i, batch in enumerate(loader):
      if i + 1 == k:
        jax.block_until_ready(batch)
        break
    rates[prefetch] = k / (time.perf_counter() - a)
  log(
    "  ours: loader batches/s by prefetch: " + ", ".join(f"{p}: {r:.1f}" for p, r in rates.items())
  )

  prefetch = args.prefetch if args.prefetch >= 0 else max(rates, key=rates.get)
  log(f"  ours: epochs with prefetch {prefetch}")
  loader = NeighborLoader(sampler, train, seed=0, prefetch=prefetch)
  opt = adam_init(params)
  epochs = []
  for epoch in range(args.epochs + 1):  # epoch 0 compiles: a warm-up
    start = time.perf_counter()
    busy = 0.0
    loss = None
    for batch in loader:
      a = time.perf_counter()
      params, opt, loss = step(params, opt, batch, x, y)
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
    "prefetch": prefetch,
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


def pyg_sage(dims):
  """PyG's GraphSAGE over one homogeneous subgraph (NeighborLoader's output): a SAGEConv (mean
  aggregation) per layer, ReLU between layers."""
  import torch
  import torch.nn.functional as TF
  from torch_geometric.nn import SAGEConv

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

  return SAGE(dims)


def torch_epochs(tag, model, subgraphs, x, y, args, sync, log) -> float:
  """Median epoch time of PyG's model trained on the subgraphs `subgraphs()` yields per epoch,
  (n_id, edge_index, batch_size) each (the seeds are n_id's prefix), after a warm-up epoch; Adam
  lr 1e-3, synchronised at each epoch's end."""
  import torch
  import torch.nn.functional as TF

  opt = torch.optim.Adam(model.parameters(), lr=1e-3)
  epochs = []
  for epoch in range(args.epochs + 1):
    sync()
    start = time.perf_counter()
    for ids, ei, batch_size in subgraphs():
      opt.zero_grad()
      out = model(x[ids], ei)[:batch_size]
      loss = TF.cross_entropy(out, y[ids[:batch_size]])
      loss.backward()
      opt.step()
    sync()
    wall = time.perf_counter() - start
    warm = " (warm-up)" if epoch == 0 else ""
    log(f"  {tag}: epoch {epoch}{warm}: {wall:.3f} s, loss {loss.item():.4f}")
    if epoch:
      epochs.append(wall)
  return statistics.median(epochs)


def run_pyg(edge_index, n, train, features, labels, args, log):
  try:
    import torch
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
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

  dims = [args.features] + [args.hidden] * (len(args.fanouts) - 1) + [args.classes]
  model = pyg_sage(dims).to(dev)
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

  def subgraphs():
    for batch in loader:
      ids = batch.n_id.to(dev, non_blocking=True)
      yield ids, batch.edge_index.to(dev, non_blocking=True), batch.batch_size

  epoch_s = torch_epochs("pyg", model, subgraphs, x, y, args, sync, log)
  return {"backend": backend, "epoch_s": epoch_s, "loader_ms": sampler_ms}


# -- PyG's SAGEConv fed by a neighbour sampler in plain PyTorch on the device ---------------------


class TorchNeighborSampler:
  """Uniform neighbour sampling without replacement in plain PyTorch, on the graph's device:
  what a PyTorch user writes when PyG's NeighborLoader has no sampler backend.

  The graph is kept as CSR with rows = targets: row v lists the sources u of the edges
  u -> v of edge_index (messages flow edge_index[0] -> edge_index[1]), as
  NeighborSampler.from_edge_index builds ours, so both sample in-neighbours.

  `sample` returns PyG NeighborLoader's layout: n_id (the seeds first, then each hop's new
  nodes) and one edge_index [2, E] in local ids over the union of the hops' edges (row 0 the
  source, row 1 the target). As in PyG, hop l + 1 samples from the nodes hop l added (its
  frontier), not again from the seeds.
  """

  def __init__(self, edge_index, num_nodes: int, fanouts, device):
    import torch

    self.torch = torch
    self.device = torch.device(device)
    self.fanouts = list(fanouts)
    ei = torch.as_tensor(edge_index, dtype=torch.int64, device=self.device)
    order = torch.argsort(ei[1], stable=True)
    self.indices = ei[0, order]
    self.indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=self.device)
    self.indptr[1:] = torch.cumsum(torch.bincount(ei[1], minlength=num_nodes), 0)
    del ei, order
    # Global id -> local id of the batch being sampled (-1: not in it); reset after each batch.
    self.local = torch.full((num_nodes,), -1, dtype=torch.int64, device=self.device)

  def _expand(self, count):
    """(row, position in row) of every slot of rows holding count[i] slots each."""
    torch = self.torch
    total = int(count.sum())
    rows = torch.repeat_interleave(
      torch.arange(count.numel(), device=self.device), count, output_size=total
    )
    first = torch.cumsum(count, 0) - count
    return rows, torch.arange(total, device=self.device) - first[rows]

  def sample_hop(self, targets, fanout: int, generator):
    """(row, edge): each sampled edge's target (an index into targets) and CSR position.
    Rows of degree <= fanout (or fanout -1) take every edge; the others keep the `fanout` edges
    of smallest uniform random key: one sort of row * 2 + key (key in [0, 1), float64) orders
    every row's edges by key and keeps the rows apart."""
    torch = self.torch
    start = self.indptr[targets]
    degree = self.indptr[targets + 1] - start
    if fanout < 0:
      rows, pos = self._expand(degree)
      return rows, start[rows] + pos
    full = degree <= fanout
    rows_f, pos_f = self._expand(torch.where(full, degree, 0))
    many = torch.where(full, 0, degree)
    rows_m, pos_m = self._expand(many)
    key = torch.rand(rows_m.numel(), dtype=torch.float64, device=self.device, generator=generator)
    order = torch.sort(rows_m.to(torch.float64) * 2 + key).indices
    rows_m, pos_m = rows_m[order], pos_m[order]
    # The sort keeps rows in order, so a row's edges start where they started before it.
    rank = torch.arange(rows_m.numel(), device=self.device) - (torch.cumsum(many, 0) - many)[rows_m]
    keep = rank < fanout
    rows_m, pos_m = rows_m[keep], pos_m[keep]
    rows = torch.cat([rows_f, rows_m])
    return rows, start[rows] + torch.cat([pos_f, pos_m])

  def sample(self, seeds, generator, hops: list | None = None):
    """(n_id, edge_index) of the subgraph around `seeds` (distinct global ids, on the device).
    hops: a list that receives, per hop, (begin, end, rows, edges): the hop's targets are
    n_id[begin:end], rows index them and edges are CSR positions (for checks)."""
    torch = self.torch
    n_id = [seeds]
    count = seeds.numel()
    self.local[seeds] = torch.arange(count, device=self.device)
    begin, end = 0, count
    src_local, dst_local = [], []
    for fanout in self.fanouts:
      targets = n_id[-1]
      rows, edges = self.sample_hop(targets, fanout, generator)
      src = self.indices[edges]
      new = torch.unique(src[self.local[src] < 0])
      self.local[new] = torch.arange(count, count + new.numel(), device=self.device)
      src_local.append(self.local[src])
      dst_local.append(rows + begin)
      if hops is not None:
        hops.append((begin, end, rows, edges))
      n_id.append(new)
      begin, end = count, count + new.numel()
      count = end
    n_id = torch.cat(n_id)
    self.local[n_id] = -1
    return n_id, torch.stack([torch.cat(src_local), torch.cat(dst_local)])


def check_graph(rng, n: int = 300, edges: int = 3000):
  """(edge_index, n, seeds) of a random simple graph for check_torch_sampler: in-degrees from 0
  (the last tenth of the nodes has no in-edges) to above the default fanouts; 40 seeds, some
  of them without in-edges."""
  ei = np.unique(np.stack([rng.integers(0, n, edges), rng.integers(0, n - n // 10, edges)]), axis=1)
  ei = ei[:, ei[0] != ei[1]]
  seeds = np.concatenate([rng.choice(n - n // 10, 36, replace=False), [n - 1, n - 2, n - 3, n - 4]])
  return ei, n, rng.permutation(seeds)


def check_torch_sampler(edge_index, n: int, fanouts, seeds, seed: int = 0):
  """Asserts what TorchNeighborSampler promises, on CPU: every sampled edge is an edge of the
  graph (source -> target), each hop's target draws min(fanout, degree) distinct edges, n_id is
  distinct with the seeds first, and each hop's targets are the nodes the hop before added."""
  import torch

  sampler = TorchNeighborSampler(edge_index, n, fanouts, "cpu")
  g = torch.Generator().manual_seed(seed)
  hops = []
  seeds_t = torch.as_tensor(seeds, dtype=torch.int64)
  n_id, ei = sampler.sample(seeds_t, g, hops)
  n_id, ei = n_id.numpy(), ei.numpy()
  assert np.unique(n_id).size == n_id.size, "n_id repeats a node"
  assert np.array_equal(n_id[: seeds_t.numel()], seeds), "the seeds are not n_id's prefix"
  assert (sampler.local == -1).all(), "the local-id map was not reset"
  graph = np.unique(edge_index[0].astype(np.int64) * n + edge_index[1])
  sampled = n_id[ei[0]].astype(np.int64) * n + n_id[ei[1]]
  assert np.isin(sampled, graph).all(), "a sampled edge is not in the graph"
  degree = np.bincount(edge_index[1], minlength=n)
  indices = sampler.indices.numpy()
  total, begin_next = 0, 0
  for (begin, end, rows, edges), fanout in zip(hops, fanouts):
    assert begin == begin_next, "a hop's targets are not the nodes the hop before added"
    rows, edges = rows.numpy(), edges.numpy()
    targets = n_id[begin:end]
    want = degree[targets] if fanout < 0 else np.minimum(degree[targets], fanout)
    assert np.array_equal(np.bincount(rows, minlength=targets.size), want), "wrong draw counts"
    assert np.unique(rows * indices.size + edges).size == edges.size, "an edge drawn twice"
    # The CSR row of each target holds the edge it drew.
    ip = sampler.indptr.numpy()
    assert ((ip[targets[rows]] <= edges) & (edges < ip[targets[rows] + 1])).all()
    assert np.array_equal(indices[edges], n_id[ei[0, total : total + edges.size]])
    assert (n_id[ei[1, total : total + edges.size]] == targets[rows]).all()
    total += edges.size
    begin_next = end
  assert total == ei.shape[1]
  # Uniform: one target of degree 24 drawing 6 edges 2000 times draws each edge 500 times on
  # average (binomial sd ~19); a biased scheme (first edges, low ids) leaves that band.
  star = np.stack([np.arange(1, 25), np.zeros(24, np.int64)])
  one = TorchNeighborSampler(star, 25, [6], "cpu")
  hits = np.zeros(24, np.int64)
  zero = torch.zeros(1, dtype=torch.int64)
  for _ in range(2000):
    _, edges = one.sample_hop(zero, 6, g)
    hits[edges.numpy()] += 1
  assert hits.min() > 400 and hits.max() < 600, hits
  return {"edges": int(ei.shape[1]), "nodes": int(n_id.size)}


def run_torch_sampler(edge_index, n, train, features, labels, args, log):
  try:
    import torch
  except ImportError as e:
    log(f"  torch-sampler: skipped ({e})")
    return {"skipped": str(e)}
  try:
    model_dims = [args.features] + [args.hidden] * (len(args.fanouts) - 1) + [args.classes]
    torch.manual_seed(0)
    model = pyg_sage(model_dims)
  except ImportError as e:
    log(f"  torch-sampler: skipped ({e})")
    return {"skipped": str(e)}
  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
  x = torch.from_numpy(features).to(dev)
  y = torch.from_numpy(labels.astype(np.int64)).to(dev)
  train_t = torch.from_numpy(train).to(dev)
  sync()
  t0 = time.perf_counter()
  sampler = TorchNeighborSampler(edge_index, n, args.fanouts, dev)
  sync()
  log(
    f"  torch-sampler: torch {torch.__version__} on {dev}; CSR built in "
    f"{time.perf_counter() - t0:.2f} s"
  )
  g = torch.Generator(device=dev).manual_seed(0)

  def batches():
    perm = train_t[torch.randperm(train_t.numel(), device=dev, generator=g)]
    return perm.split(args.batch)

  # Sampler alone: per batch, synchronised (after one untimed batch: first calls set up).
  sampler.sample(batches()[0], g)
  times, sizes = [], []
  for seeds in batches()[: args.sampler_batches]:
    sync()
    a = time.perf_counter()
    n_id, ei = sampler.sample(seeds, g)
    sync()
    times.append(time.perf_counter() - a)
    sizes.append((n_id.numel(), ei.shape[1]))
  sampler_ms = 1e3 * statistics.median(times)
  nodes, edges = (int(statistics.median(v)) for v in zip(*sizes))
  log(
    f"  torch-sampler: sampler per batch {sampler_ms:.1f} ms (median; {nodes} nodes, {edges} edges)"
  )

  def subgraphs():
    for seeds in batches():
      yield (*sampler.sample(seeds, g), seeds.numel())

  epoch_s = torch_epochs("torch-sampler", model.to(dev), subgraphs, x, y, args, sync, log)
  return {
    "device": str(dev),
    "epoch_s": epoch_s,
    "sampler_ms": sampler_ms,
    "batch_nodes": nodes,
    "batch_edges": edges,
    "batches": -(-train.size // args.batch),
  }


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
  p.add_argument(
    "--prefetch",
    type=int,
    default=-1,
    help="our loader's prefetch depth (-1: the fastest measured)",
  )
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
  p.add_argument("--skip-pyg", action="store_true", help="no PyG NeighborLoader peer")
  p.add_argument(
    "--skip-torch-sampler", action="store_true", help="no PyTorch-sampler + SAGEConv peer"
  )
  p.add_argument("--json", default=None, help="write the results here")
  args = p.parse_args(argv)
  args.fanouts = [int(f) for f in args.fanouts.split(",")]
  args.prefetch_rates = (0, 2, 4, 8, 12)
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

  if args.quick and not args.skip_torch_sampler:
    try:
      import torch  # noqa: F401
    except ImportError as e:
      log(f"torch-sampler check skipped ({e})")
    else:
      ei, n, seeds = check_graph(np.random.default_rng(1))
      c = check_torch_sampler(ei, n, args.fanouts, seeds, seed=2)
      degree = np.bincount(ei[1], minlength=n)
      log(
        f"torch-sampler check passed ({n} nodes, {ei.shape[1]} edges, in-degrees "
        f"{degree.min()}..{degree.max()}; {c['nodes']} nodes, {c['edges']} edges sampled from "
        f"{seeds.size} seeds)"
      )

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
    if not args.skip_torch_sampler:
      r["torch_sampler"] = run_torch_sampler(ei, n, train, features, labels, args, log)
    results[name] = r
    o, q, t = r["ours"], r.get("pyg", {}), r.get("torch_sampler", {})
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
    if "epoch_s" in t:
      line += (
        f"; torch-sampler {t['epoch_s']:.3f} s/epoch (sampler {t['sampler_ms']:.1f} ms/batch): "
        f"{t['epoch_s'] / o['epoch_s']:.2f}x"
      )
    else:
      line += f"; torch-sampler: {t.get('skipped', 'skipped')}"
    log(line)
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
  main()
