"""Graph classification on TU datasets (PROTEINS, DD) with GIN or GCN, 10-fold cross-validation.

    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS
    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS DD --quiet
    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS --model gcn --data DIR
    python -m jaxsparse_tc.examples.train --task graph --dataset PROTEINS     # the same entry point

Data (see load_dataset): `<dataset>.npz` in the --data folder where it holds one (the disjoint-union
layout of jaxsparse_tc.datasets.load_tu_npz), else the TU site's raw files under --data (default:
the user's cache folder, jaxsparse_tc.datasets.default_root()), downloaded there when missing
(jaxsparse_tc.datasets.load_tu). Node features: the one-hot node tags (labels); labels: the
graph classes.

Models (Flax nnx), as in Xu et al. 2019 ("How powerful are graph neural networks?", their
code: github.com/weihua916/powerful-gnns), `--layers` 5 counting the input layer:
- gin (GIN-0; GIN-eps with --train-eps): 4 x [GINConv(MLP Linear -> BatchNorm -> ReLU -> Linear)
  -> BatchNorm -> ReLU], sum aggregation, eps = 0 (or learned, starting at 0).
- gcn: 4 x [GCNConv on D^-1/2 (A+I) D^-1/2 -> BatchNorm -> ReLU] (normalised inside the step,
  `graph.normalize_symmetric`).
Readout of both ("jumping knowledge"): every layer's node embeddings, the input features
included, are sum-pooled per graph, each through its own Linear(classes) and dropout 0.5, and
the `layers` logit vectors are summed. Adam, lr 0.01 halved every 50 epochs, batch 32, hidden 64,
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
- both (default): one training per fold with the validation hold-out; reports the val figure
  and Xu's statistic computed on the same runs (trained on 90% of the training folds, so a
  little below a pure xu run).
The test accuracy after the last epoch is printed too; --json writes every fold's curves.

Batches and speed: every batch is padded to one budget (jaxsparse_tc.nn.batch), so arrays have
one shape and the program compiles once per dataset and model. Building a padded batch's sparse
format is host work (~4 ms for 32 PROTEINS graphs, ~20 ms for DD), so `--shuffles` (10) random
partitions of *all* the dataset's graphs into batches are built once (threads), kept on the
device and cycled (epoch e: partition e mod shuffles, its batches in a fresh order). A batch has
round(32 / training share) graph slots (40; 36 for xu), so that a fold finds 32 of its training
graphs in one on average; each fold masks out its other graphs (no loss, no gradient, no
BatchNorm statistics; messages never cross graphs: tests/test_graph_classification.py checks
that a fold's parameters ignore its held-out graphs). So all the folds train together: the
epoch is one jitted call, a lax.scan over the batches of a step vmapped over the folds (the
sparse operators run once per batch, the fold axis as their head axis), then an eval-mode scan
over one partition that scores each fold's validation and test graphs. No host
synchronisation within the run but 10 progress lines (--verbose: one per epoch). On a CPU this
is about the work of the folds one at a time (held-out graphs ride along and every graph is
evaluated, but the first layer's products are shared); on a GPU, where one fold's batches of
~2,500 (PROTEINS) or ~17,000 (DD) node slots leave it launch-bound, the 10 folds share every
kernel launch.

Measured (CPU, 2 shared cores, seed 0; val = val-selected, Xu = Xu et al.'s protocol on the
same runs, s = seconds per epoch of all the folds together):
  PROTEINS gin  10 folds x 350 epochs: val 0.728 +- 0.016, Xu 0.758 +- 0.024 (epoch 58); 2.3 s
  PROTEINS gcn  10 folds x 150 epochs: val 0.737 +- 0.024, Xu 0.757 +- 0.023 (epoch 75); 1.4 s
  DD gin        10 folds x  30 epochs: val 0.765 +- 0.034, Xu 0.766 +- 0.031 (epoch 22); 13.1 s
The val figure moves by ~0.02 between runs with other batches or seeds (a one-fold-at-a-time
version of this example gave 0.748 +- 0.024 on PROTEINS gin, 10 x 350).

Measured on an NVIDIA H100 80GB HBM3 (both datasets, 10 folds x 350 epochs, 93 s in all with
the build of the batches and compilation; docs/PERFORMANCE.md):
  PROTEINS gin: val 0.732 +- 0.026, Xu 0.769 +- 0.029; 0.042 s per epoch of all the folds
  DD gin:       val 0.757 +- 0.039, Xu 0.769 +- 0.042; 0.132 s
    python -m jaxsparse_tc.examples.graph_classification --dataset PROTEINS DD --data shared/data
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

from jaxsparse_tc.datasets import TUDataset, find_dataset_file, load_tu, load_tu_npz
from jaxsparse_tc.nn import flax as nnf
from jaxsparse_tc.nn import graph
from jaxsparse_tc.nn.batch import Budget, GraphBatch, GraphLoader, batch_graphs
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


# -- batches shared by the folds -------------------------------------------------------------------


def train_fraction(protocol: str) -> float:
  """The share of a dataset's graphs that a fold trains on (9 folds, less 10% for val)."""
  return 0.9 if protocol == "xu" else 0.9 * 0.9


def batch_slots(batch_size: int, protocol: str) -> int:
  """Graph slots of a shared batch: enough that a fold finds `batch_size` of its training
  graphs in one on average."""
  return max(1, round(batch_size / train_fraction(protocol)))


class SharedBatches:
  """`shuffles` random partitions of all the dataset's graphs into padded batches of one
  budget, built once on the host (threads: the format builder releases the GIL), stacked and
  kept on the device, for every fold at once (a fold masks the graphs that are not its
  training graphs).

  train: the batches, stacked [shuffles * most, ...]; gid [shuffles * most, graph slots]: each
  slot's graph (index into the dataset; -1 on padding); order, valid [shuffles, most]:
  partition s is batches order[s, k] for k with valid[s, k] (a partition with fewer batches,
  where one closed early for the budget, is padded with invalid entries).
  """

  def __init__(self, graphs, budget: Budget, slots: int, shuffles: int, seed: int, workers: int):
    loader = GraphLoader(graphs, budget, slots, shuffle=True, seed=seed)
    packings = [loader.index_batches(s) for s in range(shuffles)]
    most = max(len(p) for p in packings)
    self.order = np.zeros((shuffles, most), np.int32)
    self.valid = np.zeros((shuffles, most), bool)
    flat = []
    for s, packing in enumerate(packings):
      self.order[s, : len(packing)] = np.arange(len(flat), len(flat) + len(packing))
      self.valid[s, : len(packing)] = True
      flat += packing
    self.uniform = bool(self.valid.all())
    self.gid = np.full((len(flat), budget.graphs), -1, np.int32)
    for k, idx in enumerate(flat):
      self.gid[k, : len(idx)] = idx
    cpu = jax.devices("cpu")[0]

    def make(idx):
      with jax.default_device(cpu):  # host arrays, stacked below and moved once
        b = batch_graphs([graphs[i] for i in idx], budget)
      return jax.tree.map(np.asarray, b)

    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as ex:
      built = list(ex.map(make, flat))
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *built)
    del built
    self.train = jax.device_put(stacked)
    self.gid = jax.device_put(self.gid)
    self.device = self.train.graph_mask.devices().pop()


# -- training --------------------------------------------------------------------------------------

# per fold and epoch, summed over graphs: [loss, correct, count] for train, val and test
_TRAIN, _VAL, _TEST = 0, 3, 6


def _fold_view(batch: GraphBatch, gid, role):
  """The batch as one fold sees it: only its training graphs (role 0) are real (node_mask,
  graph_mask); and each slot's role in the fold ([graph slots]; -1 on padding)."""
  r = jnp.where(gid >= 0, role[jnp.maximum(gid, 0)], -1)
  train = r == 0
  node_train = jnp.concatenate([train, jnp.zeros(1, bool)])[batch.node_graph]  # padding -> False
  view = GraphBatch(
    batch.A,
    batch.x,
    batch.edge_index,
    batch.edge_attr,
    batch.y,
    batch.node_graph,
    node_train,
    batch.edge_mask,
    train,
  )
  return view, r


class Trainer:
  """All folds of one model structure trained together: the carry holds every fold's
  parameters, BatchNorm statistics, dropout keys and Adam state stacked on a leading fold
  axis, and the jitted epoch vmaps a training step over it (each fold with its own roles of the
  graphs) inside a lax.scan over the epoch's shared batches, then an eval-mode scan over one
  partition (every graph once) that scores each fold's validation and test graphs. The sparse
  operators run once per batch for all folds (the fold axis rides along as their head axis).
  Compiled once per dataset and model. `masked`: some partitions have fewer batches than the
  longest, and steps on padding entries of the order are skipped (a lax.cond)."""

  def __init__(self, model, masked: bool = True):
    self.masked = masked
    model.train()
    self.gd_train = nnx.split(model, nnx.Param, ...)[0]
    model.eval()
    self.gd_eval = nnx.split(model, nnx.Param, ...)[0]
    model.train()
    self.tx = optax.scale_by_adam()
    donate = () if jax.default_backend() == "cpu" else (0,)
    self.epoch = jax.jit(self._epoch, donate_argnums=donate, static_argnames=("evaluate",))

  def init(self, models, device):
    """The carry of freshly built models (one per fold), stacked on a leading fold axis, on
    `device` (committed like the epoch's outputs, so that the first call compiles the same
    program as the later ones)."""
    carries = []
    for model in models:
      model.train()
      gd, params, rest = nnx.split(model, nnx.Param, ...)
      if gd != self.gd_train:
        raise ValueError("internal: every fold's model must have the same structure")
      params, rest = nnx.as_pure(params), nnx.as_pure(rest)  # plain arrays: traced freely
      carries.append((params, rest, self.tx.init(params)))
    return jax.device_put(jax.tree.map(lambda *xs: jnp.stack(xs), *carries), device)

  def _step(self, carry, batch, gid, role, lr):
    """One fold's Adam step on its training graphs of a batch (mean cross-entropy); returns
    its new carry and [summed loss, correct, graphs]."""
    params, rest, opt_state = carry
    view, _ = _fold_view(batch, gid, role)

    def loss_fn(p):
      m = nnx.merge(self.gd_train, p, rest)
      logits = m(view)
      new_rest = nnx.as_pure(nnx.split(m, nnx.Param, ...)[2])  # BatchNorm stats, rng counts
      w = view.graph_mask.astype(jnp.float32)
      loss_sum = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, batch.y) * w)
      correct = jnp.sum((jnp.argmax(logits, -1) == batch.y) * w)
      count = jnp.sum(w)
      return loss_sum / jnp.maximum(count, 1), (new_rest, jnp.stack([loss_sum, correct, count]))

    (_, (rest, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = self.tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - lr * u, params, updates)  # Adam with this epoch's lr
    return (params, rest, opt_state), metrics

  def _scores(self, params, rest, batch, gid, role):
    """One fold's eval-mode [loss, correct, count] sums over its val and test graphs."""
    logits = nnx.merge(self.gd_eval, params, rest)(batch)
    _, r = _fold_view(batch, gid, role)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
    hit = (jnp.argmax(logits, -1) == batch.y).astype(jnp.float32)
    out = []
    for kind in (1, 2):
      w = (r == kind).astype(jnp.float32)
      out += [jnp.sum(ce * w), jnp.sum(hit * w), jnp.sum(w)]
    return jnp.stack(out)

  def _epoch(self, carry, lr, pool, gid, order, valid, role, eval_order, eval_valid, *, evaluate):
    """Every fold trains on pool[order[k]] for each k with valid[k]; then, with `evaluate`,
    every fold scores its val and test graphs over the batches eval_order[valid]. role
    [folds, graphs]: 0 train, 1 val, 2 test. Returns the carry and metrics [folds, 9]."""

    def train_body(c, k):
      i = order[k]
      batch, g = jax.tree.map(lambda a: a[i], pool), gid[i]
      step = jax.vmap(lambda c, r: self._step(c, batch, g, r, lr))
      if not self.masked:
        return step(c, role)
      skip = lambda c, r: (c, jnp.zeros((role.shape[0], 3), jnp.float32))
      return jax.lax.cond(valid[k], step, skip, c, role)

    carry, tm = jax.lax.scan(train_body, carry, jnp.arange(order.shape[0]))
    tm = tm.sum(0)
    if not evaluate:
      return carry, tm
    params, rest, _ = carry

    def eval_body(_, k):
      i = eval_order[k]
      batch, g = jax.tree.map(lambda a: a[i], pool), gid[i]
      em = jax.vmap(lambda p, s, r: self._scores(p, s, batch, g, r))(params, rest, role)
      return None, em * eval_valid[k]

    _, em = jax.lax.scan(eval_body, None, jnp.arange(eval_order.shape[0]))
    return carry, jnp.concatenate([tm, em.sum(0)], axis=-1)


def lr_at(epoch: int, args) -> float:
  """Xu et al.'s step decay: lr x 0.5 every `lr_step` epochs (epochs counted from 1)."""
  return args.lr * 0.5 ** ((epoch - 1) // args.lr_step)


def run_folds(trainer, models, data: SharedBatches, roles, args, log=print):
  """Trains the folds (one model each, roles [folds, graphs]) together; returns the per-epoch
  metrics [folds, epochs, 9] (see _TRAIN) and timings."""
  carry = trainer.init(models, data.device)
  roles = jax.device_put(roles, data.device)
  rng = np.random.default_rng([args.seed, 1])
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
      data.gid,
      order,
      data.valid[s],
      roles,
      data.order[0],
      data.valid[0],
      evaluate=True,
    )
    metrics.append(m)
    if epoch == 1:
      jax.block_until_ready(m)
      t_first = time.perf_counter()
    if args.verbose or epoch % max(1, args.epochs // 10) == 0:  # a sync: 10 lines in all
      v = np.asarray(m).sum(0)
      log(
        f"  epoch {epoch:3d}  loss {v[0] / v[2]:.4f}  train acc {v[1] / v[2]:.4f}  "
        f"val acc {_ratio(v[4], v[5])}  test acc {_ratio(v[7], v[8])}  (all folds; "
        f"{time.perf_counter() - t0:.0f} s)"
      )
  metrics = np.asarray(jnp.stack(metrics, axis=1))
  t_end = time.perf_counter()
  per_epoch = (t_end - t_first) / (args.epochs - 1) if args.epochs > 1 else t_first - t0
  return metrics, {"first_epoch_s": t_first - t0, "epoch_s": per_epoch, "total_s": t_end - t0}


def _rounded_ratio(a, b) -> list:
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.round(a / b, 4).tolist()


def _ratio(a, b) -> str:
  return f"{a / b:.4f}" if b else "-"


def model_seed(args, fold: int) -> int:
  return args.seed * 100 + fold


def select(m: np.ndarray, protocol: str) -> dict:
  """The protocol figures from the per-fold epoch metrics [folds, epochs, 9]."""
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


def load_dataset(name: str, data=None) -> TUDataset:
  """`<name>.npz` in the folder `data` (load_tu_npz) where it holds one, else the TU raw files
  under `data` (None: the user's cache folder), downloaded when missing (load_tu)."""
  if data is not None:
    try:
      return load_tu_npz(find_dataset_file(name, data), name)
    except FileNotFoundError:
      pass
  return load_tu(name, data)


def cross_validate(args, ds: TUDataset | None = None, log=print) -> dict:
  """Runs the protocol on one dataset and model (args.dataset[0] unless `ds` is given)."""
  if ds is None:
    ds = load_dataset(args.dataset if isinstance(args.dataset, str) else args.dataset[0], args.data)
  model_kind = args.model if isinstance(args.model, str) else args.model[0]
  t_start = time.perf_counter()
  slots = batch_slots(args.batch_size, args.protocol)
  budget = Budget.for_dataset(ds.graphs, slots, add_self_loops=model_kind == "gcn")
  roles = np.zeros((args.folds, len(ds)), np.int32)
  for f, split in enumerate(fold_splits(ds.labels, args)):
    roles[f, split["val"]], roles[f, split["test"]] = 1, 2
  shuffles = max(1, min(args.shuffles, args.epochs))
  workers = args.workers or max(1, min(8, (os.cpu_count() or 2) - 1))
  data = SharedBatches(ds.graphs, budget, slots, shuffles, args.seed, workers)
  build_s = time.perf_counter() - t_start
  log(
    f"{ds.name}: {len(ds)} graphs, {ds.num_features} node tags, {ds.num_classes} classes; "
    f"{model_kind}{' (learned eps)' if args.train_eps and model_kind == 'gin' else ''}, "
    f"{args.layers} layers, hidden {args.hidden}, batch {args.batch_size} (of {slots} slots), "
    f"lr {args.lr} (x0.5 every {args.lr_step} epochs), {args.epochs} epochs, protocol "
    f"{args.protocol}, {args.folds} of 10 folds trained together; budget {budget.num_nodes} node "
    f"slots, nnz {budget.nnz}; {shuffles} partitions x {data.order.shape[1]} batches built in "
    f"{build_s:.1f} s; device {data.device}"
  )
  models = [
    build_model(
      model_kind,
      ds.num_features,
      args.hidden,
      ds.num_classes,
      layers=args.layers,
      dropout=args.dropout,
      seed=model_seed(args, f),
      train_eps=args.train_eps,
    )
    for f in range(args.folds)
  ]
  trainer = Trainer(models[0], masked=not data.uniform)
  m, t = run_folds(trainer, models, data, roles, args, log)
  device = data.device
  del data
  sel = select(m, args.protocol)
  for f in range(args.folds):
    one = select(m[f : f + 1], args.protocol)
    extra = (
      f"; at the best val epoch {one['val'][2][0]}: {one['val'][0]:.4f}" if "val" in one else ""
    )
    log(
      f"fold {f}: test acc after the last epoch {one['last'][0]:.4f}, best "
      f"{(m[f, :, _TEST + 1] / m[f, :, _TEST + 2]).max():.4f}{extra}"
    )
  result = {
    "dataset": ds.name,
    "model": model_kind + ("-eps" if args.train_eps and model_kind == "gin" else ""),
    "protocol": args.protocol,
    "folds": args.folds,
    "epochs": args.epochs,
    "results": {k: {"mean": a, "std": s, "epoch": e} for k, (a, s, e) in sel.items()},
    "seconds_per_epoch": t["epoch_s"],  # one epoch of all the folds together
    "compile_s": t["first_epoch_s"],
    "build_s": build_s,
    "seconds": time.perf_counter() - t_start,
    "device": str(device.device_kind),
    "curves": {  # per fold, per epoch (for plots; NaN where a fold has no validation graphs)
      name: [_rounded_ratio(m[f, :, num], m[f, :, den]) for f in range(args.folds)]
      for name, num, den in (
        ("train_loss", _TRAIN, _TRAIN + 2),
        ("val_acc", _VAL + 1, _VAL + 2),
        ("test_acc", _TEST + 1, _TEST + 2),
      )
    },
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
    + f"; {t['epoch_s']:.3f} s per epoch of all {args.folds} folds (first epoch, with "
    f"compilation: {t['first_epoch_s']:.1f} s), {result['seconds']:.0f} s in all"
  )
  return result


def summary_table(results: list[dict]) -> str:
  """dataset, model, protocol, mean +- std over folds, the epoch(s) it reads (val: the median
  of the folds' picks), folds, epochs, s per epoch, total s."""
  names = {"val": "val-selected", "xu": "Xu (test-selected)", "last": "last epoch"}
  lines = [
    f"{'dataset':9s} {'model':7s} {'protocol':19s} {'test accuracy':>17s} {'at epoch':>8s} "
    f"{'folds':>5s} {'epochs':>6s} {'s/epoch':>8s} {'total s':>8s}"
  ]
  for r in results:
    for k in ("val", "xu", "last"):
      if k in r["results"]:
        v = r["results"][k]
        at = {"val": lambda e: int(np.median(e)), "xu": int, "last": lambda e: r["epochs"]}[k]
        lines.append(
          f"{r['dataset']:9s} {r['model']:7s} {names[k]:19s} "
          f"{v['mean']:8.4f} +- {v['std']:.4f} {at(v['epoch']):8d} {r['folds']:5d} "
          f"{r['epochs']:6d} {r['seconds_per_epoch']:8.3f} {r['seconds']:8.0f}"
        )
  return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
    "--dataset", nargs="+", default=["PROTEINS"], help="TU set names: PROTEINS, DD, MUTAG, ..."
  )
  p.add_argument(
    "--data",
    default=None,
    help="folder holding <dataset>.npz, or the TU raw files as <DATASET>/raw/ (default: the "
    "user's cache folder; missing raw files are downloaded)",
  )
  p.add_argument("--model", nargs="+", choices=["gin", "gcn"], default=["gin"])
  p.add_argument("--protocol", choices=["val", "xu", "both"], default="both")
  p.add_argument(
    "--epochs", type=int, nargs="+", default=[350], help="one count, or one per --dataset"
  )
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
  epochs = args.epochs * len(args.dataset) if len(args.epochs) == 1 else args.epochs
  if len(epochs) != len(args.dataset) or min(epochs) < 1:
    raise SystemExit("--epochs: one positive count, or one per --dataset")
  log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
  if args.quiet:  # the table's rows as they come (a run cut short keeps what it finished)
    print(summary_table([]), flush=True)
  results = []
  for name, n_epochs in zip(args.dataset, epochs):
    ds = load_dataset(name, args.data)
    for kind in args.model:
      one = argparse.Namespace(**{**vars(args), "dataset": name, "model": kind, "epochs": n_epochs})
      results.append(cross_validate(one, ds, log))
      if args.quiet:
        print(summary_table(results[-1:]).split("\n", 1)[1], flush=True)
      if args.json:
        with open(args.json, "w") as fh:
          json.dump(results, fh, indent=1)
  if not args.quiet:
    print(f"\n{args.folds} of 10 folds, seed {args.seed}, device {results[0]['device']}:")
    print(summary_table(results), flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
