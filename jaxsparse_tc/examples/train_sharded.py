"""Full-graph GNN training sharded over several devices (jaxsparse_tc.distributed).

    python -m jaxsparse_tc.examples.train_sharded --model gcn --devices 2
    python -m jaxsparse_tc.examples.train_sharded --model gat --framework equinox --devices auto
    python -m jaxsparse_tc.examples.train_sharded --model gcn --devices 2 --check   # = 1 device?
    python -m jaxsparse_tc.examples.train --model gcn --devices 2          # the same, main job

The graph is cut into contiguous row blocks balanced by nonzeros, one per device
(`distributed.shard_matrix`); node features, labels and every activation live in the padded
row layout, sharded along the same axis; the model's parameters and optimizer state are
replicated (XLA all-reduces their gradients). The layers are jaxsparse_tc.nn's, unchanged: the
library's operators dispatch on the ShardedMatrix. Models, hyper-parameters and the reported
accuracy are jaxsparse_tc.examples.train's.

`--check` trains the same model for a few steps with dropout off on one device and sharded,
and prints the largest relative difference of the losses and of the final logits (fp32: a few
1e-7; the sums run in another order). With dropout on, the two runs draw different masks
(shapes differ), so only their statistics agree.

On CPU, show several devices with XLA_FLAGS=--xla_force_host_platform_device_count=N (set
before jax starts).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc import distributed as dist


def resolve_devices(devices) -> int:
  """A device count from --devices: an int, or "auto"/0/None for every visible device."""
  if devices in (None, "auto", 0, "0"):
    return len(jax.devices())
  return int(devices)


# What shard_inputs builds when its caller does not say (train.train passes only the device
# count; this script's --exchange and --overlap set these).
SHARD_OPTIONS = {"exchange": "auto", "overlap": False}


def shard_inputs(
  A, x, labels, splits: dict, devices, *, exchange: str | None = None, overlap: bool | None = None
):
  """(A, x, labels, splits) of a single-device run -> the sharded run's: a ShardedMatrix over
  the first `devices` devices, features and labels in its padded row layout, split indices as
  padded positions (in the same order, so losses reduce in the same order). `overlap`: own and
  remote parts per shard (SpMM overlaps the exchange; GCN only: no edge softmax/attention)."""
  if hasattr(A, "restore") or type(A).__name__ == "ReorderedMatrix":
    raise ValueError(
      "sharding a transparently reordered matrix (ReorderedMatrix) is not "
      "supported: reorder explicitly (train.py --reorder-mode explicit), then "
      "the row blocks follow the locality order"
    )
  exchange = SHARD_OPTIONS["exchange"] if exchange is None else exchange
  overlap = SHARD_OPTIONS["overlap"] if overlap is None else overlap
  mesh = dist.make_mesh(resolve_devices(devices))
  SA = dist.shard_matrix(A, mesh, exchange=exchange, overlap=overlap)
  X = SA.shard_rows(np.asarray(x))
  Y = SA.shard_rows(np.asarray(labels))
  idx = {k: jnp.asarray(SA.node_positions(np.asarray(v))) for k, v in splits.items()}
  return SA, X, Y, idx


def passes(r: dict, rtol: float = 1e-5) -> bool:
  """Losses equal to `rtol` (relative); accuracies to within one node of the smallest split."""
  return r["loss_rel_diff"] <= rtol and r["metric_abs_diff"] <= r["metric_tolerance"] + 1e-12


def check(
  model: str = "gcn",
  framework: str = "flax",
  devices="auto",
  steps: int = 5,
  seed: int = 0,
  verbose: bool = True,
  exchange: str = "auto",
  overlap: bool = False,
) -> dict:
  """Trains `steps` steps with dropout off on one device and sharded over `devices`; returns
  the largest relative differences of the losses and of the final logits."""
  from jaxsparse_tc.datasets import load_cora
  from jaxsparse_tc.examples import train as T

  ds = load_cora(normalize_features=True)
  cfg = dataclasses.replace(T.CONFIGS[model], dropout=0.0)
  A = T._matrix(model, ds)
  x, labels = jnp.asarray(ds.features), jnp.asarray(ds.labels)
  splits = {
    "train": jnp.asarray(ds.train_idx),
    "val": jnp.asarray(ds.val_idx),
    "test": jnp.asarray(ds.test_idx),
  }
  runner = {"flax": T._flax_runner, "equinox": T._equinox_runner}[framework]
  results = []
  for sharded in (False, True):
    args = (A, x, labels, splits)
    if sharded:
      args = shard_inputs(*args, devices, exchange=exchange, overlap=overlap)
    step, evaluate = runner(model, cfg, ds, seed)
    losses = [float(step(args[0], args[1], args[2], args[3]["train"])[0]) for _ in range(steps)]
    metrics = {k: float(v) for k, v in evaluate(*args).items()}
    results.append((losses, metrics, args[0]))
  (l0, m0, _), (l1, m1, SA) = results

  def rel(a, b):
    return float(np.max(np.abs(np.subtract(a, b)) / np.maximum(np.abs(b), 1e-30)))

  # Accuracies are counts of argmax hits: a node whose two top logits tie to within float32
  # rounding may flip between the runs, so they are compared to within one node of a split.
  one_node = 1.0 / min(int(v.shape[0]) for v in splits.values())
  out = {
    "model": model,
    "framework": framework,
    "devices": SA.num_shards,
    "exchange": SA.layout.exchange,
    "loss_rel_diff": rel(l1, l0),
    "metric_rel_diff": rel([m1[k] for k in sorted(m0)], [m0[k] for k in sorted(m0)]),
    "metric_abs_diff": float(max((abs(m1[k] - m0[k]) for k in m0), default=0.0)),
    "metric_tolerance": one_node,
    "losses_1": l0,
    "losses_n": l1,
  }
  if verbose:
    print(
      f"{model} ({framework}): {steps} steps on 1 device and on {SA.num_shards} "
      f"({SA.layout.exchange}): losses differ by at most {out['loss_rel_diff']:.2e} "
      f"(relative), final metrics by {out['metric_rel_diff']:.2e}"
    )
  return out


def main(argv=None) -> int:
  from jaxsparse_tc.examples import train as T

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", choices=sorted(T.CONFIGS), default="gcn")
  p.add_argument("--framework", choices=["flax", "equinox"], default="flax")
  p.add_argument("--devices", default="auto", help="device count, or 'auto' (all visible)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--epochs", type=int, default=200)
  p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
  p.add_argument("--exchange", default="auto", choices=["auto", "allgather", "halo"])
  p.add_argument(
    "--overlap", action="store_true", help="own/remote parts: SpMM overlaps the exchange (gcn only)"
  )
  p.add_argument(
    "--check",
    action="store_true",
    help="compare a few dropout-free steps against one device and exit",
  )
  args = p.parse_args(argv)
  if args.check:
    r = check(
      args.model,
      args.framework,
      args.devices,
      seed=args.seed,
      exchange=args.exchange,
      overlap=args.overlap,
    )
    return 0 if passes(r) else 1
  SHARD_OPTIONS.update(exchange=args.exchange, overlap=args.overlap)
  T.train(
    args.model,
    args.framework,
    args.seed,
    args.epochs,
    verbose=not args.quiet,
    devices=resolve_devices(args.devices),
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
