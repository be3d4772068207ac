"""Graph classification, time per training epoch: this library (Flax nnx, padded batches) against
PyTorch Geometric, the same GIN model, batches and optimizer, in one process.

    python benchmarks/bench_graph_classification.py                      # PROTEINS and DD
    python benchmarks/bench_graph_classification.py --dataset PROTEINS --epochs 5
    python benchmarks/bench_graph_classification.py --quick             # CPU smoke check

Model (jaxsparse_tc/examples/graph_classification.py, `gin`, Xu et al.'s GIN-0): 4 x
[GINConv(MLP d -> 64 -> 64 with BatchNorm) -> BatchNorm -> ReLU]; every layer's node
embeddings, the input included, sum-pooled, each through Linear(classes) and dropout 0.5, the
logits summed; Adam lr 0.01; cross-entropy. PyG: the same with GINConv,
torch_geometric.nn.MLP(norm="batch_norm"), BatchNorm1d and global_add_pool.
An epoch: one pass over every graph of the dataset in batches of --batch-size, ended by a device
synchronisation. Both sides train on batches built before the timed epochs, the same graphs in
the same batches (`--shuffles` random partitions, cycled; ours: the example's device-resident
`SharedBatches` and its jitted epoch, one lax.scan over the padded batches, for one model with
every graph a training graph and no evaluation; PyG: `Batch.from_data_list` per batch, moved
to the device once, a Python loop of steps). "PyG loader" is PyG's usual path, for reference:
a DataLoader(shuffle=True) that collates every batch during the epoch. Reported: the median
epoch time after `--warmup` epochs (compilation and cuDNN/cuBLAS warm-up excluded), and the
time to build ours' batches once.
Data: <dataset>.npz in --data (default: the benchmark graphs' folder,
benchmarks.common.SHARED_DATA; no network needed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from benchmarks.common import SHARED_DATA  # noqa: E402


def _packings(ds, args):
  """The batches of the timed epochs: `--shuffles` reshuffles of all graphs (the example's)."""
  from jaxsparse_tc.nn.batch import Budget, GraphLoader

  budget = Budget.for_dataset(ds.graphs, args.batch_size)
  loader = GraphLoader(ds.graphs, budget, args.batch_size, shuffle=True, seed=0)
  return budget, [loader.index_batches(s) for s in range(args.shuffles)]


def _ours(ds, args, budget):
  import jax
  import jax.numpy as jnp

  from jaxsparse_tc.examples import graph_classification as gc

  t0 = time.perf_counter()
  data = gc.SharedBatches(ds.graphs, budget, args.batch_size, args.shuffles, seed=0, workers=8)
  jax.block_until_ready(data.train)
  build_s = time.perf_counter() - t0
  model = gc.build_model(
    "gin", ds.num_features, args.hidden, ds.num_classes, layers=args.layers, dropout=0.5, seed=0
  )
  trainer = gc.Trainer(model, masked=not data.uniform)
  carry = trainer.init([model], data.device)
  roles = jnp.zeros((1, len(ds)), jnp.int32)  # one model, every graph a training graph
  lr = jnp.float32(args.lr)
  times, losses = [], []
  for e in range(args.warmup + args.epochs):
    s = e % args.shuffles
    t0 = time.perf_counter()
    carry, m = trainer.epoch(
      carry,
      lr,
      data.train,
      data.gid,
      data.order[s],
      data.valid[s],
      roles,
      data.order[0],
      data.valid[0],
      evaluate=False,
    )
    m = np.asarray(m)[0]  # synchronises
    times.append(time.perf_counter() - t0)
    losses.append(float(m[0] / m[2]))
  return (
    times[args.warmup :],
    int(data.valid[0].sum()),
    str(data.device.device_kind),
    losses,
    build_s,
  )


def _pyg(ds, args, packings):
  import torch
  import torch.nn.functional as tF
  from torch_geometric.data import Batch, Data
  from torch_geometric.loader import DataLoader
  from torch_geometric.nn import MLP, GINConv, global_add_pool

  device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
  data = [
    Data(
      x=torch.from_numpy(np.asarray(g.x, np.float32)),
      edge_index=torch.from_numpy(np.asarray(g.edge_index, np.int64)),
      y=torch.tensor([g.y]),
    )
    for g in ds.graphs
  ]

  class GIN(torch.nn.Module):
    def __init__(self, d, h, c, layers):
      super().__init__()
      dims = [d] + [h] * (layers - 1)
      self.convs = torch.nn.ModuleList(
        [GINConv(MLP([a, h, h], norm="batch_norm")) for a in dims[:-1]]
      )
      self.norms = torch.nn.ModuleList([torch.nn.BatchNorm1d(h) for _ in dims[1:]])
      self.heads = torch.nn.ModuleList([torch.nn.Linear(a, c) for a in dims])

    def forward(self, x, edge_index, batch):
      out = tF.dropout(self.heads[0](global_add_pool(x, batch)), 0.5, self.training)
      for conv, norm, head in zip(self.convs, self.norms, self.heads[1:]):
        x = tF.relu(norm(conv(x, edge_index)))
        out = out + tF.dropout(head(global_add_pool(x, batch)), 0.5, self.training)
      return out

  def timed(batches_of_epoch):
    torch.manual_seed(0)
    model = GIN(ds.num_features, args.hidden, ds.num_classes, args.layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    times, losses = [], []
    for e in range(args.warmup + args.epochs):
      t0 = time.perf_counter()
      for b in batches_of_epoch(e):
        b = b.to(device, non_blocking=True)
        opt.zero_grad()
        loss = tF.cross_entropy(model(b.x, b.edge_index, b.batch), b.y)
        loss.backward()
        opt.step()
      if device.type == "cuda":
        torch.cuda.synchronize()
      times.append(time.perf_counter() - t0)
      losses.append(float(loss))
    return times[args.warmup :], losses

  pool = [
    [Batch.from_data_list([data[i] for i in idx]).to(device) for idx in packing]
    for packing in packings
  ]
  prebuilt, _ = timed(lambda e: pool[e % len(pool)])
  loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
  with_loader, losses = timed(lambda e: loader)
  name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
  return prebuilt, with_loader, name, losses, torch.__version__


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--dataset", action="append", help="PROTEINS and/or DD (default: both)")
  p.add_argument(
    "--data", default=str(SHARED_DATA), help="folder holding <dataset>.npz (default: %(default)s)"
  )
  p.add_argument("--epochs", type=int, default=5, help="timed epochs")
  p.add_argument("--warmup", type=int, default=2, help="untimed epochs first (compilation)")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--layers", type=int, default=5, help="counting the input layer")
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--shuffles", type=int, default=3, help="prebuilt reshuffles, cycled")
  p.add_argument("--cpu", action="store_true", help="run both on the CPU")
  p.add_argument(
    "--quick",
    action="store_true",
    help="smoke check: every 5th PROTEINS graph, 1 + 1 epochs, on the CPU",
  )
  args = p.parse_args(argv)
  if args.quick:
    args.cpu, args.epochs, args.warmup, args.shuffles = True, 1, 1, 1
  if args.cpu:
    import jax

    jax.config.update("jax_platforms", "cpu")
  from jaxsparse_tc.datasets import TUDataset, find_dataset_file, load_tu_npz

  names = args.dataset or (["PROTEINS"] if args.quick else ["PROTEINS", "DD"])
  rows = []
  nan = float("nan")
  for name in names:
    ds = load_tu_npz(find_dataset_file(name, args.data), name)
    if args.quick:
      ds = TUDataset(ds.name, ds.graphs[::5], ds.labels[::5], ds.num_features, ds.num_classes)
    budget, packings = _packings(ds, args)
    ours, batches, device, our_losses, build_s = _ours(ds, args, budget)
    row = {
      "dataset": ds.name,
      "graphs": len(ds),
      "batch": args.batch_size,
      "device": device,
      "ours_s": statistics.median(ours),
      "ours_batches": batches,
      "build_s": build_s,
    }
    try:
      pyg, pyg_loader, pyg_device, _, torch_version = _pyg(ds, args, packings)
      row.update(
        pyg_s=statistics.median(pyg),
        pyg_loader_s=statistics.median(pyg_loader),
        pyg_device=pyg_device,
        speedup=statistics.median(pyg) / statistics.median(ours),
        torch=torch_version,
      )
    except ImportError as e:
      row.update(pyg_s=nan, pyg_loader_s=nan, speedup=nan, pyg_device=f"skipped ({e.name})")
    rows.append(row)
    print(
      f"{ds.name}: ours {row['ours_s']:.3f} s/epoch ({batches} batches, last loss "
      f"{our_losses[-1]:.3f}; {args.shuffles} reshuffles built in {build_s:.1f} s); PyG "
      f"{row['pyg_s']:.3f} s/epoch, with its DataLoader {row['pyg_loader_s']:.3f}, on "
      f"{row['pyg_device']}",
      flush=True,
    )
  print(
    f"\nGIN graph classification, seconds per training epoch (median of {args.epochs} "
    f"after {args.warmup} warm-up), batch {args.batch_size}, hidden {args.hidden}, "
    f"{args.layers} layers; ours on {rows[0]['device']}"
  )
  print(
    f"{'dataset':10s} {'graphs':>7s} {'ours s':>9s} {'PyG s':>9s} {'PyG/ours':>9s} "
    f"{'PyG loader s':>13s}"
  )
  for r in rows:
    print(
      f"{r['dataset']:10s} {r['graphs']:7d} {r['ours_s']:9.4f} {r['pyg_s']:9.4f} "
      f"{r['speedup']:9.2f} {r['pyg_loader_s']:13.4f}"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
