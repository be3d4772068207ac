"""GraphSAGE trained on sampled neighbourhoods (mini-batches of seed nodes), Flax nnx.

    python -m jaxsparse_tc.examples.train --task node-sampled                  # Cora, [15, 10]
    python -m jaxsparse_tc.examples.train_sampled --fanouts 25 10 --seeds 5 --quiet
    python -m jaxsparse_tc.examples.train_sampled --full-batch --seeds 5 --quiet   # the baseline
    python -m jaxsparse_tc.examples.train_sampled --dataset pubmed --data DIR

Model: 2 x SAGEConv (mean aggregation, root weight), hidden 64, ReLU and dropout 0.5 between
them (none on the input: a mask of every input feature costs more than the layers on a CPU),
Adam lr 0.01 with L2 weight decay 5e-4 added to the gradient (torch's Adam). Features
row-normalised.

Sampled training (default): each epoch shuffles the training nodes into batches of
--batch-size seeds; jaxsparse_tc.sampling.NeighborLoader samples each batch's 2-hop
neighbourhood with --fanouts (the seeds' hop first: [15, 10] draws 15 neighbours of each seed and
10 of each of those) on a host thread ahead of the device, padded to the sampler's fixed budgets,
so that ONE compiled train step serves every batch (the last, smaller batch too: its padding
seeds are masked out of the loss). The layers take the sampled blocks directly (`conv(block,
h)`: targets are the sources' prefix). --full-batch trains the same model on the whole graph
(one step per epoch) for comparison.

Evaluation: full-graph inference after every epoch (both modes): the layers on the whole
graph's matrix, every node with its full neighbourhood (for a graph of this size it is the
layer-wise full-neighbourhood inference done in one go). Reported: the test accuracy at the epoch
of best validation accuracy (the first such epoch), and the last epoch's.

Data: --dataset cora (default) is the copy shipped in the package; with --data DIR, `<dataset>.npz`
in DIR in the shipped Cora's layout (jaxsparse_tc.datasets.load_npz) where DIR holds one, else the
raw Planetoid files under DIR (jaxsparse_tc.datasets.load_planetoid: cora, citeseer, pubmed;
downloaded there when missing). Without --data, other datasets come from the user's cache folder
(load_planetoid's default root).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Counts of the train step's traces (a Python side effect runs only while tracing): one per
# run when every batch has the same shapes.
TRACES = {"train_step": 0}


def load_dataset(name: str, data: str | None):
  """The node-classification dataset `name` (see the module docstring), features row-normalised."""
  from jaxsparse_tc import datasets

  if data is None and name.lower() == "cora":
    return datasets.load_cora(normalize_features=True)
  if data is not None:
    try:
      path = datasets.find_dataset_file(name, data)
    except FileNotFoundError:
      path = None
    if path is not None:
      ds = datasets.load_npz(path, normalize_features=True)
      if not isinstance(ds, datasets.GraphDataset):
        raise ValueError(
          f"{path} is an edge list without features or a split; node classification needs the "
          f"shipped Cora's layout (jaxsparse_tc.datasets.load_npz)"
        )
      return ds
  return datasets.load_planetoid(name, data, normalize_features=True)


def _model(num_features: int, hidden: int, num_classes: int, dropout: float, seed: int):
  from flax import nnx

  from jaxsparse_tc.nn import flax as nnf

  class GraphSAGE(nnx.Module):
    """Two SAGEConv layers; `graphs` holds each layer's matrix or sampled block."""

    def __init__(self, rngs: nnx.Rngs):
      self.conv1 = nnf.SAGEConv(num_features, hidden, aggr="mean", rngs=rngs)
      self.conv2 = nnf.SAGEConv(hidden, num_classes, aggr="mean", rngs=rngs)
      self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, graphs, x):
      h = jax.nn.relu(self.conv1(graphs[0], x))
      return self.conv2(graphs[1], self.dropout(h))

  return GraphSAGE(nnx.Rngs(params=seed, dropout=seed + 10_000))


def train(
  dataset: str = "cora",
  data: str | None = None,
  *,
  fanouts=(15, 10),
  batch_size: int = 32,
  epochs: int = 50,
  lr: float = 0.01,
  hidden: int = 64,
  dropout: float = 0.5,
  weight_decay: float = 5e-4,
  seed: int = 0,
  full_batch: bool = False,
  verbose: bool = True,
  ds=None,
) -> dict:
  """Trains GraphSAGE (sampled, or full-batch with `full_batch`); returns the metrics: best
  val accuracy and its epoch, the test accuracy there and at the last epoch, the loss per
  epoch, seconds per epoch and the train step's trace count. `ds`: a loaded dataset (else
  load_dataset(dataset, data))."""
  from flax import nnx

  from jaxsparse_tc.nn import graph
  from jaxsparse_tc.sampling import NeighborLoader, NeighborSampler

  ds = load_dataset(dataset, data) if ds is None else ds
  n = ds.num_nodes
  A = graph.message_passing_matrix(ds.edge_index, n)  # mean aggregation: 0/1, no self-loops
  x, labels = jnp.asarray(ds.features), jnp.asarray(ds.labels)
  splits = {k: jnp.asarray(getattr(ds, f"{k}_idx")) for k in ("train", "val", "test")}
  model = _model(ds.num_features, hidden, ds.num_classes, dropout, seed)
  tx = optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(lr))
  opt = nnx.Optimizer(model, tx, wrt=nnx.Param)

  def masked_loss(logits, y, mask):
    per = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(mask, y, 0))
    return jnp.sum(jnp.where(mask, per, 0)) / jnp.maximum(jnp.sum(mask), 1)

  @nnx.jit
  def sampled_step(model, opt, batch, x, labels):
    TRACES["train_step"] += 1
    h = x[batch.input_nodes]

    def loss_fn(model):
      return masked_loss(model(batch.blocks, h), labels[batch.seeds], batch.seed_mask)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  @nnx.jit
  def full_step(model, opt, A, x, labels, idx):
    TRACES["train_step"] += 1

    def loss_fn(model):
      logits = model((A, A), x)[idx]
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels[idx]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  @nnx.jit
  def evaluate(model, A, x, labels, splits):
    pred = jnp.argmax(model((A, A), x), -1)
    return {k: jnp.mean(pred[idx] == labels[idx]) for k, idx in splits.items()}

  loader = None
  if not full_batch:
    sampler = NeighborSampler.from_edge_index(
      ds.edge_index, n, list(fanouts), batch_size=batch_size
    )
    loader = NeighborLoader(sampler, np.asarray(ds.train_idx), seed=seed)

  traces0 = TRACES["train_step"]
  best = {"val": -1.0}
  losses, seconds = [], []
  for epoch in range(1, epochs + 1):
    t0 = time.perf_counter()
    model.train()
    if full_batch:
      loss = float(full_step(model, opt, A, x, labels, splits["train"]))
    else:
      total, count = 0.0, 0
      for batch in loader:
        total += sampled_step(model, opt, batch, x, labels)  # stays on the device
        count += 1
      loss = float(total) / count
    seconds.append(time.perf_counter() - t0)
    model.eval()
    acc = {k: float(v) for k, v in evaluate(model, A, x, labels, splits).items()}
    losses.append(loss)
    if acc["val"] > best["val"]:
      best = dict(acc, epoch=epoch)
    if verbose:
      print(
        f"epoch {epoch:3d}  loss {loss:.4f}  {seconds[-1]:.3f} s  train acc {acc['train']:.3f}  "
        f"val acc {acc['val']:.3f}",
        flush=True,
      )
  result = {
    "mode": "full-batch" if full_batch else f"sampled {list(fanouts)} x {batch_size}",
    "seed": seed,
    "epochs": epochs,
    "best_epoch": best["epoch"],
    "best_val_acc": best["val"],
    "test_acc": best["test"],
    "final_val_acc": acc["val"],
    "final_test_acc": acc["test"],
    "loss_history": losses,
    "seconds_per_epoch": float(np.mean(seconds[1:] if len(seconds) > 1 else seconds)),
    "traces": TRACES["train_step"] - traces0,
    "steps_per_epoch": 1 if full_batch else len(loader),
  }
  if verbose:
    print(
      f"GraphSAGE ({result['mode']}, seed {seed}): test acc {best['test']:.4f} at the best val "
      f"acc {best['val']:.3f} (epoch {best['epoch']}); last epoch val {acc['val']:.3f} test "
      f"{acc['test']:.4f}; {result['seconds_per_epoch']:.3f} s/epoch after the first; "
      f"train step traced {result['traces']}x"
    )
  return result


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--task", choices=["node-sampled"], default="node-sampled", help=argparse.SUPPRESS)
  p.add_argument("--dataset", default="cora", help="cora (shipped), citeseer, pubmed")
  p.add_argument("--data", default=None, help="folder of <dataset>.npz or raw Planetoid files")
  p.add_argument("--fanouts", type=int, nargs="+", default=[15, 10], help="the seeds' hop first")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--epochs", type=int, default=None, help="default 50 sampled, 200 full-batch")
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--dropout", type=float, default=0.5)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--seeds", type=int, default=1, help="seeds seed .. seed+N-1; prints the mean")
  p.add_argument("--full-batch", action="store_true", help="train on the whole graph instead")
  p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
  args = p.parse_args(argv)
  if len(args.fanouts) != 2:
    p.error(f"--fanouts takes one fanout per layer of the 2-layer model; got {args.fanouts}")
  epochs = args.epochs or (200 if args.full_batch else 50)
  ds = load_dataset(args.dataset, args.data)
  accs = []
  for s in range(args.seed, args.seed + args.seeds):
    r = train(
      args.dataset,
      fanouts=args.fanouts,
      batch_size=args.batch_size,
      epochs=epochs,
      lr=args.lr,
      hidden=args.hidden,
      dropout=args.dropout,
      seed=s,
      full_batch=args.full_batch,
      verbose=not args.quiet,
      ds=ds,
    )
    accs.append(r["test_acc"])
    if args.quiet:
      print(
        f"GraphSAGE ({r['mode']}, seed {s}): test acc {r['test_acc']:.4f} (best val "
        f"{r['best_val_acc']:.3f} at epoch {r['best_epoch']}; last epoch {r['final_test_acc']:.4f})"
        f"; {r['seconds_per_epoch']:.3f} s/epoch, train step traced {r['traces']}x",
        flush=True,
      )
  if args.seeds > 1:
    print(
      f"GraphSAGE ({r['mode']}, {args.dataset}): mean test acc over seeds {args.seed}.."
      f"{args.seed + args.seeds - 1}: {np.mean(accs):.4f} +- {np.std(accs):.4f}"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
