"""Graph classification on TU datasets (PROTEINS, DD) with GIN or GCN, 10-fold cross-validation.

    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS
    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS DD --epochs 350 --quiet
    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS --model gcn --data DIR
    python -m jaxsparse_tc.examples.train --task graph --dataset PROTEINS     # the same entry point

Data: `<dataset>.npz` from --data, or ./shared/data or ../shared/data (not shipped; see
jaxsparse_tc.datasets.load_tu). Node features: the one-hot node tags; labels: `graph_label`.

Models (Flax nnx), as in Xu et al. 2019 ("How powerful are graph neural networks?", their
code: github.com/weihua916/powerful-gnns), `--layers` 5 counting the input layer:
- gin (GIN-0; GIN-eps with --train-eps): 4 x [GINConv(MLP Linear -> BatchNorm -> ReLU -> Linear)
  -> BatchNorm -> ReLU], sum aggregation, eps = 0 (or learned, starting at 0).
- gcn: 4 x [GCNConv on D^-1/2 (A+I) D^-1/2 -> BatchNorm -> ReLU] (normalised inside the step,
  `graph.normalize_symmetric`).
Readout of both ("jumping knowledge"): every layer's node embeddings, the input features
included, are sum-pooled per graph, each through its own Linear(classes) and dropout 0.5, and
the 5 logit vectors are summed. Adam, lr 0.01 halved every 50 epochs, batch 32, hidden 64,
350 epochs (Xu et al.'s values; an epoch here is one pass over the training graphs).
BatchNorm statistics, pooling and the loss see real nodes and graphs only (the padding of the
fixed-shape batches is masked); evaluation uses the running statistics (eval mode).

Protocols (stratified 10-fold CV, folds seeded by --seed; --folds N runs the first N folds):
- val (honest): per fold, a stratified 10% of the training graphs is held out as validation;
  the model trains on the rest; the reported figure is the test accuracy at the epoch with the
  best validation accuracy (ties: the lower validation loss, then the earlier epoch); mean and
  std over folds.
- xu: trains on all training graphs of the fold; the reported figure is the test accuracy at the
  single epoch that maximises the fold-averaged *test* curve (Xu et al.'s protocol: it selects
  on the test folds, an optimistic figure), mean and std over folds at that epoch.
- both: one training per fold with the validation hold-out; reports the val figure and Xu's
  statistic computed on the same runs (trained on 90% of the training folds, so a little below
  a pure xu run).
The test accuracy after the last epoch is printed too.

Speed: every batch is padded to one budget (jaxsparse_tc.nn.batch), so one training epoch (a
lax.scan over its batches) and the evaluation of the validation and test graphs (a scan over
their batches) are one jitted call, compiled once per dataset and model, with no host
synchronisation inside a fold (--verbose syncs once per epoch to print). Building a padded
batch's sparse format is host work (~4 ms for 32 PROTEINS graphs, ~20 ms for DD), so each
fold builds `--shuffles` reshuffles of its training graphs into batches once (threads; the next
fold's while this one trains) and keeps them on the device; epoch e trains on reshuffle
e mod shuffles, its batches in a fresh order.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxsparse_tc.datasets import TUDataset, load_tu
from jaxsparse_tc.nn import flax as nnf
from jaxsparse_tc.nn import graph
from jaxsparse_tc.nn.batch import Budget, GraphLoader, batch_graphs
from jaxsparse_tc.nn.pool import global_add_pool

# -- model -----------------------------------------------------------------------------------------


class Classifier(nnx.Module):
  """Xu et al.'s GIN (kind "gin") or its GCN variant ("gcn"): `model(batch)` -> logits
  [graph slots, classes] (see the module docstring). `layers` counts the input layer."""

  def __init__(
    self,
    kind: str,
    in_features: int,
    hidden: int,
    num_classes: int,
    *,
    layers: int,
    dropout: float,
    train_eps: bool,
    rngs: nnx.Rngs,
  ):
    if kind not in ("gin", "gcn"):
      raise ValueError(f"kind must be 'gin' or 'gcn'; got {kind!r}")
    if layers < 2:
      raise ValueError(f"layers counts the input layer and must be at least 2; got {layers}")
    self.kind = kind
    dims = [in_features] + [hidden] * (layers - 1)
    if kind == "gin":
      self.convs = nnf._List(
        [
          nnf.GINConv(nnf.MLP([a, hidden, hidden], batch_norm=True, rngs=rngs), train_eps=train_eps)
          for a in dims[:-1]
        ]
      )
    else:
      self.convs = nnf._List([nnf.GCNConv(a, hidden, rngs=rngs) for a in dims[:-1]])
    # torch.nn.BatchNorm1d's defaults (its momentum 0.1 is nnx's 0.9)
    self.norms = nnf._List(
      [nnx.BatchNorm(hidden, momentum=0.9, epsilon=1e-5, rngs=rngs) for _ in dims[1:]]
    )
    self.heads = nnf._List([nnf._torch_linear(d, num_classes, rngs=rngs) for d in dims])
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, batch):
    A, h, mask = batch.A, batch.x, batch.node_mask
    if self.kind == "gcn":
      A = graph.normalize_symmetric(A)
    # padding nodes: masked out of BatchNorm's statistics, dropped by the pooling
    logits = self.dropout(self.heads[0](global_add_pool(h, batch)))
    for conv, norm, head in zip(self.convs, self.norms, self.heads[1:]):
      h = conv(A, h, mask=mask) if self.kind == "gin" else conv(A, h)
      h = jax.nn.relu(norm(h, mask=mask[:, None]))
      logits = logits + self.dropout(head(global_add_pool(h, batch)))
    return logits


def build_model(
  kind: str,
  in_features: int,
  hidden: int,
  num_classes: int,
  *,
  layers: int = 5,
  dropout: float = 0.5,
  seed: int = 0,
  train_eps: bool = False,
) -> Classifier:
  """A `Classifier` with parameters from `seed` (dropout draws from seed + 1)."""
  return Classifier(
    kind,
    in_features,
    hidden,
    num_classes,
    layers=layers,
    dropout=dropout,
    train_eps=train_eps,
    rngs=nnx.Rngs(params=seed, dropout=seed + 1),
  )


# -- folds -----------------------------------------------------------------------------------------


def stratified_folds(labels: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
  """k disjoint test index sets, each class spread evenly over them."""
  rng = np.random.default_rng(seed)
  fold = np.empty(len(labels), np.int64)
  offset = 0
  for c in np.unique(labels):
    idx = rng.permutation(np.nonzero(labels == c)[0])
    fold[idx] = (np.arange(idx.size) + offset) % k
    offset += idx.size
  return [np.nonzero(fold == f)[0] for f in range(k)]


def stratified_holdout(
  idx: np.ndarray, labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Splits `idx` into (kept, held out), the held-out part `fraction` of each class (rounded,
  at least one graph of a class with two or more)."""
  rng = np.random.default_rng(seed)
  keep, out = [], []
  for c in np.unique(labels[idx]):
    members = rng.permutation(idx[labels[idx] == c])
    k = min(max(int(round(fraction * members.size)), 1), members.size - 1)
    out.append(members[:k])
    keep.append(members[k:])
  return np.sort(np.concatenate(keep)), np.sort(np.concatenate(out))


def fold_splits(labels: np.ndarray, args) -> list[dict]:
  """Per fold: train, val (empty for protocol xu) and test graph indices."""
  folds = stratified_folds(labels, 10, args.seed)
  out = []
  for f in range(args.folds):
    train = np.concatenate([folds[g] for g in range(10) if g != f])
    val = np.zeros(0, np.int64)
    if args.protocol != "xu":
      train, val = stratified_holdout(train, labels, 0.1, seed=args.seed * 1000 + f)
    out.append({"train": np.sort(train), "val": val, "test": np.sort(folds[f])})
  return out


# -- device-resident batch pools -------------------------------------------------------------------


def _build_stack(graphs, packing, budget: Budget, total: int, workers: int, device):
  """The padded batches of `packing` (lists of graph indices) built on the host (threads: the
  format builder releases the GIL), padded with copies of the first to `total`, stacked along a
  new leading axis and moved to `device` at once."""
  cpu = jax.devices("cpu")[0]

  def make(idx):
    with jax.default_device(cpu):
      b = batch_graphs([graphs[i] for i in idx], budget)
    return jax.tree.map(np.asarray, b)

  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as ex:
    built = list(ex.map(make, packing))
  built += [built[0]] * (total - len(built))
  return jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *built), device)


class FoldData:
  """One fold's device-resident batches: `train` [shuffles * max_batches] (the reshuffles'
  batches one after another; `order`/`valid` [shuffles, max_batches] index them), `evaluate`
  [max_eval] (the validation then test graphs, in order) with `split` [max_eval, graph slots]
  (1 val, 2 test, 0 none)."""

  def __init__(
    self, ds, split, budget, batch_size, shuffles, max_batches, max_eval, seed, workers, device
  ):
    train_graphs = [ds.graphs[i] for i in split["train"]]
    loader = GraphLoader(train_graphs, budget, batch_size, shuffle=True, seed=seed)
    packing, order = [], np.zeros((shuffles, max_batches), np.int32)
    valid = np.zeros((shuffles, max_batches), bool)
    for s in range(shuffles):
      batches = loader.index_batches(s)
      order[s, : len(batches)] = np.arange(len(packing), len(packing) + len(batches))
      valid[s, : len(batches)] = True
      packing += batches
    self.train = _build_stack(
      train_graphs, packing, budget, shuffles * max_batches, workers, device
    )
    self.order, self.valid = order, valid
    eval_idx = np.concatenate([split["val"], split["test"]])
    role = np.concatenate([np.full(len(split["val"]), 1), np.full(len(split["test"]), 2)])
    eval_graphs = [ds.graphs[i] for i in eval_idx]
    eval_packing = GraphLoader(eval_graphs, budget, batch_size).index_batches(0)
    self.split = np.zeros((max_eval, budget.graphs), np.int32)
    for k, idx in enumerate(eval_packing):
      self.split[k, : len(idx)] = role[idx]
    self.evaluate = _build_stack(eval_graphs, eval_packing, budget, max_eval, workers, device)
    self.num_val, self.num_test = len(split["val"]), len(split["test"])


def pool_shapes(ds, splits, budget, batch_size, shuffles, seeds) -> tuple[int, int]:
  """(max training batches of any reshuffle of any fold, max evaluation batches of any fold):
  the fixed pool lengths that make every fold's arrays the same shape (one compile)."""
  most, most_eval = 1, 1
  for split, seed in zip(splits, seeds):
    loader = GraphLoader(
      [ds.graphs[i] for i in split["train"]], budget, batch_size, shuffle=True, seed=seed
    )
    most = max([most] + [len(loader.index_batches(s)) for s in range(shuffles)])
    idx = np.concatenate([split["val"], split["test"]])
    most_eval = max(most_eval, len(GraphLoader([ds.graphs[i] for i in idx], budget, batch_size)))
  return most, most_eval


# -- training --------------------------------------------------------------------------------------

# metrics of an epoch, summed over graphs: [loss, correct, count] for train, val and test
_TRAIN, _VAL, _TEST = 0, 3, 6


class Trainer:
  """The jitted epoch of one model structure: a scan of Adam steps over the epoch's batches,
  then a scan of eval-mode forward passes over the evaluation batches. Compiled once (for the
  first fold's shapes; every fold's pools have the same shapes)."""

  def __init__(self, model):
    model.train()
    self.gd_train, params, rest = nnx.split(model, nnx.Param, ...)
    model.eval()
    self.gd_eval = nnx.split(model, nnx.Param, ...)[0]
    model.train()
    self.tx = optax.scale_by_adam()
    donate = () if jax.default_backend() == "cpu" else (0,)
    self.epoch = jax.jit(self._epoch, donate_argnums=donate)

  def init(self, model):
    """The carry (params, other state, Adam state) of a freshly built model."""
    model.train()
    gd, params, rest = nnx.split(model, nnx.Param, ...)
    if gd != self.gd_train:
      raise ValueError("internal: every fold's model must have the same structure")
    params, rest = nnx.as_pure(params), nnx.as_pure(rest)  # plain arrays: traced freely
    return params, rest, self.tx.init(params)

  def _step(self, carry, batch, lr):
    params, rest, opt_state = carry

    def loss_fn(p):
      m = nnx.merge(self.gd_train, p, rest)
      logits = m(batch)
      new_rest = nnx.as_pure(nnx.split(m, nnx.Param, ...)[2])
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
      w = batch.graph_mask.astype(ce.dtype)
      correct = jnp.sum((jnp.argmax(logits, -1) == batch.y) & batch.graph_mask)
      return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1), (
        new_rest,
        jnp.sum(ce * w),
        correct,
        jnp.sum(w),
      )

    (_, (rest, loss_sum, correct, count)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = self.tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
    return (params, rest, opt_state), jnp.stack([loss_sum, correct.astype(jnp.float32), count])

  def _epoch(self, carry, lr, pool, order, valid, eval_pool, split):

    def train_body(c, k):
      batch = jax.tree.map(lambda a: a[order[k]], pool)
      return jax.lax.cond(
        valid[k],
        lambda c: self._step(c, batch, lr),
        lambda c: (c, jnp.zeros(3, jnp.float32)),
        c,
      )

    carry, tm = jax.lax.scan(train_body, carry, jnp.arange(order.shape[0]))
    params, rest, _ = carry

    def eval_body(_, xs):
      batch, role = xs
      logits = nnx.merge(self.gd_eval, params, rest)(batch)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
      hit = (jnp.argmax(logits, -1) == batch.y).astype(jnp.float32)
      out = []
      for r in (1, 2):
        w = (role == r).astype(jnp.float32)
        out += [jnp.sum(ce * w), jnp.sum(hit * w), jnp.sum(w)]
      return None, jnp.stack(out)

    _, em = jax.lax.scan(eval_body, None, (eval_pool, split))
    return carry, jnp.concatenate([tm.sum(0), em.sum(0)])


def lr_at(epoch: int, args) -> float:
  """Xu et al.'s step decay: lr x 0.5 every `lr_step` epochs (epochs counted from 1)."""
  return args.lr * 0.5 ** ((epoch - 1) // args.lr_step)


def run_fold(trainer, model, data: FoldData, args, seed: int, log=print):
  """Trains one fold; returns the per-epoch metrics [epochs, 9] (see _TRAIN) and timings."""
  carry = trainer.init(model)
  rng = np.random.default_rng([seed, 1])
  shuffles = data.order.shape[0]
  metrics = []
  t0 = time.perf_counter()
  t_first = None
  for epoch in range(1, args.epochs + 1):
    s = (epoch - 1) % shuffles
    n = int(data.valid[s].sum())
    order = data.order[s].copy()
    order[:n] = order[:n][rng.permutation(n)]  # this epoch's batch order
    carry, m = trainer.epoch(
      carry,
      jnp.float32(lr_at(epoch, args)),
      data.train,
      order,
      data.valid[s],
      data.evaluate,
      data.split,
    )
    metrics.append(m)
    if epoch == 1:
      jax.block_until_ready(m)
      t_first = time.perf_counter()
    if args.verbose:
      v = np.asarray(m)
      log(
        f"  epoch {epoch:3d}  loss {v[0] / v[2]:.4f}  train acc {v[1] / v[2]:.4f}  "
        f"val acc {_ratio(v[4], v[5])}  test acc {_ratio(v[7], v[8])}"
      )
  metrics = np.asarray(jnp.stack(metrics))
  t_end = time.perf_counter()
  per_epoch = (t_end - t_first) / (args.epochs - 1) if args.epochs > 1 else t_first - t0
  return metrics, {"first_epoch_s": t_first - t0, "epoch_s": per_epoch, "total_s": t_end - t0}


def _ratio(a, b) -> str:
  return f"{a / b:.4f}" if b else "-"


def model_seed(args, fold: int) -> int:
  return args.seed * 100 + fold


def select(metrics: list[np.ndarray], protocol: str) -> dict:
  """The protocol figures from the per-fold epoch metrics ([folds][epochs, 9])."""
  m = np.stack(metrics)  # [folds, epochs, 9]
  test = m[:, :, _TEST + 1] / m[:, :, _TEST + 2]
  out = {"last": (test[:, -1].mean(), test[:, -1].std(), None)}
  if protocol in ("val", "both"):
    val_acc = m[:, :, _VAL + 1] / m[:, :, _VAL + 2]
    val_loss = m[:, :, _VAL] / m[:, :, _VAL + 2]
    picks = []
    for f in range(m.shape[0]):
      # best validation accuracy; ties: lower validation loss, then earlier epoch
      picks.append(np.lexsort((np.arange(m.shape[1]), val_loss[f], -val_acc[f]))[0])
    accs = test[np.arange(m.shape[0]), picks]
    out["val"] = (accs.mean(), accs.std(), [int(p) + 1 for p in picks])
  if protocol in ("xu", "both"):
    best = int(np.argmax(test.mean(0)))
    out["xu"] = (test[:, best].mean(), test[:, best].std(), best + 1)
  return {k: (float(a), float(s), e) for k, (a, s, e) in out.items()}


def cross_validate(args, ds: TUDataset | None = None, log=print) -> dict:
  """Runs the protocol on one dataset and model (args.dataset[0] unless `ds` is given)."""
  if ds is None:
    ds = load_tu(args.dataset if isinstance(args.dataset, str) else args.dataset[0], args.data)
  model_kind = args.model if isinstance(args.model, str) else args.model[0]
  t_start = time.perf_counter()
  budget = Budget.for_dataset(ds.graphs, args.batch_size, add_self_loops=model_kind == "gcn")
  splits = fold_splits(ds.labels, args)
  seeds = [model_seed(args, f) for f in range(args.folds)]
  shuffles = max(1, min(args.shuffles, args.epochs))
  max_batches, max_eval = pool_shapes(ds, splits, budget, args.batch_size, shuffles, seeds)
  device = jnp.zeros(()).devices().pop()  # this thread's default device (builds run on others)
  log(
    f"{ds.name}: {len(ds)} graphs, {ds.num_features} node tags, {ds.num_classes} classes; "
    f"{model_kind}{' (learned eps)' if args.train_eps and model_kind == 'gin' else ''}, "
    f"{args.layers} layers, hidden {args.hidden}, batch {args.batch_size}, lr {args.lr} "
    f"(x0.5 every {args.lr_step} epochs), {args.epochs} epochs, protocol {args.protocol}, "
    f"{args.folds} of 10 folds; budget {budget.num_nodes} node slots, nnz {budget.nnz}; "
    f"{shuffles} reshuffles x {max_batches} batches per fold; device {device}"
  )

  def make_model(f):
    return build_model(
      model_kind,
      ds.num_features,
      args.hidden,
      ds.num_classes,
      layers=args.layers,
      dropout=args.dropout,
      seed=seeds[f],
      train_eps=args.train_eps,
    )

  workers = args.workers or max(1, min(8, (os.cpu_count() or 2) - 1))

  def prepare(f):
    t = time.perf_counter()
    d = FoldData(
      ds,
      splits[f],
      budget,
      args.batch_size,
      shuffles,
      max_batches,
      max_eval,
      seeds[f],
      workers,
      device,
    )
    return d, time.perf_counter() - t

  trainer = None
  metrics, timings = [], []
  with concurrent.futures.ThreadPoolExecutor(1) as ahead:
    pending = ahead.submit(prepare, 0)
    for f in range(args.folds):
      data, build_s = pending.result()
      pending = ahead.submit(prepare, f + 1) if f + 1 < args.folds else None
      model = make_model(f)
      if trainer is None:
        trainer = Trainer(model)
      m, t = run_fold(trainer, model, data, args, seeds[f], log)
      del data
      t["build_s"] = build_s
      metrics.append(m)
      timings.append(t)
      one = select([m], args.protocol)
      extra = (
        f"; test acc at the best val epoch {one['val'][2][0]}: {one['val'][0]:.4f}"
        if "val" in one
        else ""
      )
      log(
        f"fold {f}: last-epoch test acc {one['last'][0]:.4f}, best test acc "
        f"{(m[:, _TEST + 1] / m[:, _TEST + 2]).max():.4f}{extra}; {t['epoch_s']:.3f} s per epoch "
        f"(first {t['first_epoch_s']:.1f} s, batches built in {build_s:.1f} s)"
      )
  sel = select(metrics, args.protocol)
  later = [t["epoch_s"] for t in timings[1:]] or [timings[0]["epoch_s"]]
  result = {
    "dataset": ds.name,
    "model": model_kind + ("-eps" if args.train_eps and model_kind == "gin" else ""),
    "protocol": args.protocol,
    "folds": args.folds,
    "epochs": args.epochs,
    "results": {k: {"mean": a, "std": s, "epoch": e} for k, (a, s, e) in sel.items()},
    "seconds_per_epoch": float(np.median(later)),
    "compile_s": timings[0]["first_epoch_s"],
    "build_s": float(sum(t["build_s"] for t in timings)),
    "seconds": time.perf_counter() - t_start,
    "device": str(device.device_kind),
  }
  parts = []
  if "val" in sel:
    parts.append(
      f"val-selected (honest) {sel['val'][0]:.4f} +- {sel['val'][1]:.4f} (epochs {sel['val'][2]})"
    )
  if "xu" in sel:
    parts.append(
      f"Xu et al.'s protocol (epoch {sel['xu'][2]} of the fold-averaged test curve; "
      f"optimistic) {sel['xu'][0]:.4f} +- {sel['xu'][1]:.4f}"
    )
  parts.append(f"last epoch {sel['last'][0]:.4f} +- {sel['last'][1]:.4f}")
  log(
    f"{ds.name} {result['model']}, {args.folds} folds x {args.epochs} epochs: "
    + "; ".join(parts)
    + f"; {result['seconds_per_epoch']:.3f} s per epoch, {result['seconds']:.0f} s in all"
  )
  return result


def summary_table(results: list[dict]) -> str:
  names = {
    "val": "val-selected",
    "xu": "Xu (test-selected)",
    "last": "last epoch",
  }
  lines = [
    f"{'dataset':9s} {'model':7s} {'protocol':19s} {'accuracy':>17s} {'folds':>5s} "
    f"{'epochs':>6s} {'s/epoch':>8s} {'total s':>8s}"
  ]
  for r in results:
    for k in ("val", "xu", "last"):
      if k in r["results"]:
        v = r["results"][k]
        lines.append(
          f"{r['dataset']:9s} {r['model']:7s} {names[k]:19s} "
          f"{v['mean']:8.4f} +- {v['std']:.4f} {r['folds']:5d} {r['epochs']:6d} "
          f"{r['seconds_per_epoch']:8.3f} {r['seconds']:8.0f}"
        )
  return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
    "--dataset", nargs="+", default=["PROTEINS"], help="PROTEINS and/or DD (TU .npz names)"
  )
  p.add_argument(
    "--data",
    default=None,
    help="folder holding <dataset>.npz (default: ./shared/data or ../shared/data)",
  )
  p.add_argument("--model", nargs="+", choices=["gin", "gcn"], default=["gin"])
  p.add_argument("--protocol", choices=["val", "xu", "both"], default="both")
  p.add_argument("--epochs", type=int, default=350)
  p.add_argument("--folds", type=int, default=10, help="how many of the 10 folds to run")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--layers", type=int, default=5, help="GNN layers, counting the input layer")
  p.add_argument("--dropout", type=float, default=0.5)
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--lr-step", type=int, default=50, help="halve the lr every N epochs")
  p.add_argument("--train-eps", action="store_true", help="GIN-eps (learned eps) for gin")
  p.add_argument(
    "--shuffles",
    type=int,
    default=10,
    help="reshuffles of each fold's training graphs built into device-resident batches",
  )
  p.add_argument("--workers", type=int, default=0, help="batch-building threads (0: auto)")
  p.add_argument("--json", default=None, help="also write the results to this JSON file")
  p.add_argument("--quiet", action="store_true", help="only the summary table")
  p.add_argument("--verbose", action="store_true", help="a line per epoch (syncs every epoch)")
  return p


def main(argv=None) -> int:
  args = parser().parse_args(argv)
  if not 1 <= args.folds <= 10:
    raise SystemExit("--folds must be in 1..10")
  if args.epochs < 1:
    raise SystemExit("--epochs must be positive")
  log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
  results = []
  for name in args.dataset:
    ds = load_tu(name, args.data)
    for kind in args.model:
      one = argparse.Namespace(**{**vars(args), "dataset": name, "model": kind})
      results.append(cross_validate(one, ds, log))
  print(
    f"\n{args.folds} of 10 folds, {args.epochs} epochs, seed {args.seed}, device "
    f"{results[0]['device']}:"
  )
  print(summary_table(results), flush=True)
  if args.json:
    with open(args.json, "w") as fh:
      json.dump(results, fh, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
