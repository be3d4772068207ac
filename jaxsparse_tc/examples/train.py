"""Train a two-layer GNN on Cora (shipped with the package) with jit + grad + optax.

    python -m jaxsparse_tc.examples.train --model gcn            # GCN, Flax nnx
    python -m jaxsparse_tc.examples.train --model gat --framework equinox --seed 1
    python -m jaxsparse_tc.examples.train --model gcn --seeds 5 --quiet   # mean over seeds 0..4
    python -m jaxsparse_tc.examples.train --model gat --reorder affinity  # locality order
    python -m jaxsparse_tc.examples.train --task graph --dataset PROTEINS DD  # graph classif.
    python -m jaxsparse_tc.examples.train --task node-sampled --fanouts 15 10  # sampled SAGE

`--task graph` hands the other arguments to jaxsparse_tc.examples.graph_classification (GIN /
GCN on the TU datasets, 10-fold cross-validation; see its docstring and --help);
`--task node-sampled` to jaxsparse_tc.examples.train_sampled (GraphSAGE trained on sampled
neighbourhoods, mini-batches of seed nodes; see its docstring and --help).

Models (hyper-parameters of the papers / PyG's examples; Adam with L2 weight decay 5e-4 added
to the gradient, as torch's Adam does):
- gcn: Kipf & Welling: hidden 16, dropout 0.5, lr 0.01, weight decay on the first layer only.
- gat: Velickovic et al.: 8 heads x 8 hidden, ELU, 1 output head, dropout 0.6 (features and
  attention), lr 0.005.
- agnn: PyG's AGNN example: Linear(16) -> 2 AGNN propagations -> Linear, dropout 0.5, lr 0.01.
- gt: Linear(64) -> 2 graph-transformer blocks (4 heads, post-norm) -> Linear, dropout 0.6,
  lr 0.005.

Features are row-normalized. Reported test accuracy: the test accuracy at the epoch with the
best validation accuracy (the first such epoch); the last epoch's test accuracy is printed too.
On a GPU machine with the CUDA extension, the library's CUDA kernels run automatically.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsparse_tc.datasets import load_cora
from jaxsparse_tc.nn import graph


@dataclass(frozen=True)
class Config:
  hidden: int
  lr: float
  dropout: float
  weight_decay: float = 5e-4
  decay_only: str | None = None  # apply weight decay only to parameters under this name
  heads: int = 1
  attn_dropout: float = 0.0  # gt only
  norm_first: bool = False  # gt only


CONFIGS = {
  "gcn": Config(hidden=16, lr=0.01, dropout=0.5, decay_only="conv1"),
  "gat": Config(hidden=8, lr=0.005, dropout=0.6, heads=8),
  "agnn": Config(hidden=16, lr=0.01, dropout=0.5),
  "gt": Config(hidden=64, lr=0.005, dropout=0.6, heads=4),
}


def _matrix(model: str, ds):
  if model == "gcn":
    return graph.gcn_norm(ds.edge_index, ds.num_nodes)
  return graph.message_passing_matrix(ds.edge_index, ds.num_nodes, self_loops=True)


def _reorder(A, x, labels, splits, method: str, mode: str):
  """--reorder: A stored in a locality order of the nodes (docs/REORDER.md). transparent: A
  keeps the caller's node order (a ReorderedMatrix); explicit: the matrix, features, labels and
  splits all move to the new order once."""
  from jaxsparse_tc.reorder import reorder

  r = reorder(A, method)
  if mode == "transparent":
    return r.wrap(A), x, labels, splits
  splits = {k: jnp.asarray(r.permute_index(np.asarray(v))) for k, v in splits.items()}
  return r.permute_matrix(A), r.permute(x), r.permute(labels), splits


def _optimizer(cfg: Config):
  if cfg.decay_only is None:
    mask = None
  else:

    def mask(params):
      return jax.tree_util.tree_map_with_path(
        lambda path, _: cfg.decay_only in jax.tree_util.keystr(path), params
      )

  return optax.chain(optax.add_decayed_weights(cfg.weight_decay, mask=mask), optax.adam(cfg.lr))


def _loss_and_acc(logits, labels, idx):
  lg, y = logits[idx], labels[idx]
  loss = optax.softmax_cross_entropy_with_integer_labels(lg, y).mean()
  return loss, jnp.mean(jnp.argmax(lg, -1) == y)


def _evaluate(logits, labels, splits):
  out = {}
  for name, idx in splits.items():
    loss, acc = _loss_and_acc(logits, labels, idx)
    out[f"{name}_loss"], out[f"{name}_acc"] = loss, acc
  return out


def _build_model(layers, model_name, cfg, ds, **init):
  """The named two-layer model from `layers` (nn.flax or nn.equinox, same constructors);
  `init` is the framework's randomness (rngs= or key=)."""
  f, c = ds.num_features, ds.num_classes
  if model_name == "gcn":
    return layers.GCN(f, cfg.hidden, c, dropout=cfg.dropout, **init)
  if model_name == "gat":
    return layers.GAT(f, cfg.hidden, c, heads=cfg.heads, dropout=cfg.dropout, **init)
  if model_name == "agnn":
    return layers.AGNN(f, cfg.hidden, c, dropout=cfg.dropout, **init)
  return layers.GraphTransformer(
    f,
    cfg.hidden,
    c,
    heads=cfg.heads,
    dropout=cfg.dropout,
    attn_dropout=cfg.attn_dropout,
    norm_first=cfg.norm_first,
    **init,
  )


def _flax_runner(model_name, cfg, ds, seed):
  from flax import nnx

  from jaxsparse_tc.nn import flax as nnf

  model = _build_model(nnf, model_name, cfg, ds, rngs=nnx.Rngs(params=seed, dropout=seed + 10_000))
  opt = nnx.Optimizer(model, _optimizer(cfg), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, opt, A, x, labels, idx):
    def loss_fn(model):
      return _loss_and_acc(model(A, x), labels, idx)

    (loss, acc), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    opt.update(model, grads)
    return loss, acc

  @nnx.jit
  def eval_step(model, A, x, labels, splits):
    return _evaluate(model(A, x), labels, splits)

  def step(A, x, labels, idx):
    model.train()
    return train_step(model, opt, A, x, labels, idx)

  def evaluate(A, x, labels, splits):
    model.eval()
    return eval_step(model, A, x, labels, splits)

  return step, evaluate


def _equinox_runner(model_name, cfg, ds, seed):
  import equinox as eqx

  from jaxsparse_tc.nn import equinox as nne

  key, drop_key = jax.random.split(jax.random.key(seed))
  model = _build_model(nne, model_name, cfg, ds, key=key)
  tx = _optimizer(cfg)
  state = {"model": model, "opt": tx.init(eqx.filter(model, eqx.is_inexact_array)), "key": drop_key}

  @eqx.filter_jit
  def train_step(model, opt_state, key, A, x, labels, idx):
    key, sub = jax.random.split(key)

    def loss_fn(model):
      return _loss_and_acc(model(A, x, key=sub), labels, idx)

    (loss, acc), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), opt_state, key, loss, acc

  @eqx.filter_jit
  def eval_step(model, A, x, labels, splits):
    return _evaluate(eqx.nn.inference_mode(model)(A, x), labels, splits)

  def step(A, x, labels, idx):
    state["model"], state["opt"], state["key"], loss, acc = train_step(
      state["model"], state["opt"], state["key"], A, x, labels, idx
    )
    return loss, acc

  def evaluate(A, x, labels, splits):
    return eval_step(state["model"], A, x, labels, splits)

  return step, evaluate


def train(
  model: str = "gcn",
  framework: str = "flax",
  seed: int = 0,
  epochs: int = 200,
  verbose: bool = True,
  devices: int = 1,
  reorder: str | None = None,
  reorder_mode: str = "transparent",
) -> dict:
  """Trains one model on Cora; returns the final metrics (see the module docstring).
  `devices` > 1: full-graph training sharded over that many devices (train_sharded.py).
  `reorder`: a jaxsparse_tc.reorder method, applied in `reorder_mode` (see _reorder)."""
  if model not in CONFIGS:
    raise ValueError(f"model must be one of {sorted(CONFIGS)}; got {model!r}")
  cfg = CONFIGS[model]
  ds = load_cora(normalize_features=True)
  A = _matrix(model, ds)
  x, labels = jnp.asarray(ds.features), jnp.asarray(ds.labels)
  splits = {
    "train": jnp.asarray(ds.train_idx),
    "val": jnp.asarray(ds.val_idx),
    "test": jnp.asarray(ds.test_idx),
  }
  if reorder:  # a locality order of the nodes (docs/REORDER.md)
    A, x, labels, splits = _reorder(A, x, labels, splits, reorder, reorder_mode)
  if devices != 1:  # row blocks of the graph, one per device (jaxsparse_tc.distributed)
    from jaxsparse_tc.examples.train_sharded import shard_inputs

    A, x, labels, splits = shard_inputs(A, x, labels, splits, devices)
  runner = {"flax": _flax_runner, "equinox": _equinox_runner}[framework]
  step, evaluate = runner(model, cfg, ds, seed)

  t0 = time.perf_counter()
  best = {"val_acc": -1.0}
  history = []
  for epoch in range(1, epochs + 1):
    loss, _ = step(A, x, labels, splits["train"])
    m = {k: float(v) for k, v in evaluate(A, x, labels, splits).items()}
    m["loss"] = float(loss)
    history.append(m["loss"])
    if m["val_acc"] > best["val_acc"]:
      best = dict(m, epoch=epoch)
    if verbose:
      print(
        f"epoch {epoch:3d}  loss {m['loss']:.4f}  train acc {m['train_acc']:.3f}  "
        f"val acc {m['val_acc']:.3f}  val loss {m['val_loss']:.4f}",
        flush=True,
      )
  seconds = time.perf_counter() - t0
  result = {
    "model": model,
    "framework": framework,
    "seed": seed,
    "epochs": epochs,
    "best_epoch": best["epoch"],
    "best_val_acc": best["val_acc"],
    "test_acc": best["test_acc"],
    "final_test_acc": m["test_acc"],
    "loss_history": history,
    "seconds": seconds,
    "device": str(jax.devices()[0]),
    "devices": getattr(A, "num_shards", 1),
  }
  if verbose:
    print(
      f"{model} ({framework}, seed {seed}): test acc {best['test_acc']:.4f} at the best "
      f"val acc {best['val_acc']:.3f} (epoch {best['epoch']}); last epoch test acc "
      f"{m['test_acc']:.4f}; {epochs} epochs in {seconds:.1f} s on {result['device']}"
    )
  return result


def main(argv=None) -> int:
  task = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  task.add_argument("--task", choices=["node", "graph", "node-sampled"], default="node")
  known, rest = task.parse_known_args(argv)
  if known.task == "graph":  # graph classification: its own example and arguments
    from jaxsparse_tc.examples import graph_classification

    return graph_classification.main(rest)
  if known.task == "node-sampled":  # mini-batches of sampled neighbourhoods
    from jaxsparse_tc.examples import train_sampled

    return train_sampled.main(rest)
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
    "--task",
    choices=["node", "graph", "node-sampled"],
    default="node",
    help="node: Cora node classification (this example); graph: "
    "graph_classification.py (TU datasets); node-sampled: train_sampled.py (GraphSAGE on "
    "sampled neighbourhoods); those two take the other arguments",
  )
  p.add_argument("--model", choices=sorted(CONFIGS), default="gcn")
  p.add_argument("--framework", choices=["flax", "equinox"], default="flax")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--seeds",
    type=int,
    default=1,
    help="train with seeds seed .. seed+N-1 and print the mean test accuracy",
  )
  p.add_argument("--epochs", type=int, default=200)
  p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
  p.add_argument(
    "--devices",
    default="1",
    help="shard the graph over N devices ('auto': all visible; train_sharded.py)",
  )
  p.add_argument(
    "--reorder",
    default=None,
    choices=["affinity", "rabbit", "rcm", "degree", "identity"],
    help="store the graph in a locality order of its nodes (docs/REORDER.md)",
  )
  p.add_argument(
    "--reorder-mode",
    choices=["transparent", "explicit"],
    default="transparent",
    help="transparent: the matrix keeps the caller's node order; explicit: "
    "features, labels and splits are permuted once",
  )
  args = p.parse_args(argv)
  devices = len(jax.devices()) if args.devices in ("auto", "0") else int(args.devices)
  accs = []
  for s in range(args.seed, args.seed + args.seeds):
    r = train(
      args.model,
      args.framework,
      s,
      args.epochs,
      verbose=not args.quiet,
      devices=devices,
      reorder=args.reorder,
      reorder_mode=args.reorder_mode,
    )
    accs.append(r["test_acc"])
    if args.quiet:
      print(
        f"{args.model} ({args.framework}, seed {s}): test acc {r['test_acc']:.4f} "
        f"(best val acc {r['best_val_acc']:.3f} at epoch {r['best_epoch']}; last epoch "
        f"{r['final_test_acc']:.4f}) in {r['seconds']:.1f} s",
        flush=True,
      )
  if args.seeds > 1:
    print(
      f"{args.model} ({args.framework}): mean test acc over seeds {args.seed}.."
      f"{args.seed + args.seeds - 1}: {np.mean(accs):.4f} +- {np.std(accs):.4f}"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
