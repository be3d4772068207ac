"""Where a small graph's chained call spends its GPU time: kernels, memsets and the gaps between.

Usage: python3 -m scripts.trace_chain [OP ...] [--graph cora] [--k 8]
OP: attn64, attn128 (fused attention forward, fp16, H=4; attn64bwd, attn128bwd: forward and
backward), xla64, xla128, xla64bwd, xla128bwd (XLA's unfused peer), spmm, sddmm (fp16, d=128;
sddmm's chain adds each call's summed scores to the next call's operand: one reduction more),
step-MODEL-IMPL (bench_train_step's training step, MODEL gcn or gat, IMPL lib or xla; one step
per call, --k does not apply).
Runs the chained program of bench_chained (K dependent calls) under torch.profiler, whose CUPTI
activity trace records every kernel and memset of the process, JAX's included, and prints per
call: the span of the program on the GPU, the time inside kernels and memsets, and each
activity's mean duration.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import tempfile

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import torch

import jaxsparse_tc as jst
from benchmarks import bench_attention as ba
from benchmarks import common
from benchmarks.bench_chained import _chain, grad_step

H = 4


def program(op: str, g, k: int, graph_name: str):
  """(program, args, calls per program run)."""
  n = g.shape[0]
  step = re.fullmatch(r"step-(gcn|gat)-(lib|xla)", op)
  if step:
    import numpy as np

    from benchmarks import bench_train_step as bts

    x, y, c, edge_index = bts._graph_inputs(graph_name, g, np.random.default_rng(0))
    lib, xla, largs, xargs, _ = bts._jax_steps(step.group(1), x, y, c, edge_index, n)
    return (lib, largs, 1) if step.group(2) == "lib" else (xla, xargs, 1)
  A = jst.SparseMatrix.from_scipy(g)
  attn = re.fullmatch(r"(attn|xla)(\d+)(bwd)?", op)
  if attn:
    kind, d, bwd = attn.group(1), int(attn.group(2)), attn.group(3)
    f = ba.methods(1.0 / math.sqrt(d))["fused" if kind == "attn" else "xla"]
    graph = A if kind == "attn" else tuple(jnp.asarray(a) for a in ba.csr_edges(g))
    q, kk, v = (ba.normal_f16(i, (H, n, d)) for i in range(3))
    if bwd:
      w = jnp.ones((H, n, d), jnp.float32)
      return _chain(grad_step(f), k), (graph, kk, v, w, q), k
    return _chain(lambda G, k_, v_, q_: f(G, q_, k_, v_), k), (graph, kk, v, q), k
  x = jnp.asarray(jax.random.normal(jax.random.key(0), (n, 128)), jnp.float16)
  if op == "spmm":
    An = A.with_values(jnp.asarray(A.values, jnp.float16) / 8)
    return _chain(lambda A_, x_: jst.spmm(A_, x_), k), (An, x), k
  if op == "sddmm":
    y = jnp.asarray(jax.random.normal(jax.random.key(1), (n, 128)), jnp.float16)
    return (
      _chain(lambda A_, y_, x_: (x_ + jst.sddmm(A_, x_, y_).values.sum() * 0).astype(x_.dtype), k),
      (A, y, x),
      k,
    )
  raise ValueError(op)


def trace(prog, args, runs: int = 3) -> list[dict]:
  jax.block_until_ready(prog(*args))
  jax.block_until_ready(prog(*args))
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(runs):
      jax.block_until_ready(prog(*args))
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
    path = f.name
  prof.export_chrome_trace(path)
  events = json.load(open(path))["traceEvents"]
  os.unlink(path)
  return [
    e
    for e in events
    if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
  ]


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("ops", nargs="*", default=["attn64", "attn128", "xla64", "xla128"])
  ap.add_argument("--graph", default="cora", help="a bundled graph, or rmatS-dE")
  ap.add_argument("--k", type=int, default=8)
  a = ap.parse_args()
  rmat = re.fullmatch(r"rmat(\d+)-d(\d+)", a.graph)  # rmatS-dE: 2^S nodes, E edges per node
  g = (
    common.rmat(int(rmat.group(1)), int(rmat.group(2))) if rmat else common.package_graph(a.graph)
  ).tocsr()
  g.sort_indices()
  print(common.device_name(), a.graph, "K =", a.k)
  for op in a.ops:
    prog, args, k = program(op, g, a.k, a.graph)
    ev = sorted(trace(prog, args), key=lambda e: e["ts"])
    if not ev:
      print(op, ": no GPU activity recorded (CUPTI saw none of JAX's work)")
      continue
    # The last of the 3 traced runs (each run the same activities, in order).
    last = ev[-(len(ev) // 3) :]
    span = last[-1]["ts"] + last[-1]["dur"] - last[0]["ts"]
    busy = sum(e["dur"] for e in last)
    by = collections.defaultdict(list)
    for e in last:
      by[(e["cat"], e["name"][:70])].append(e["dur"])
    print(
      f"\n== {op}: {len(last)} activities, per call: span {span / k:.2f} us, "
      f"busy {busy / k:.2f} us, idle {(span - busy) / k:.2f} us"
    )
    for (cat, name), durs in sorted(by.items(), key=lambda kv: -sum(kv[1])):
      print(f"  {cat:10s} x{len(durs) / k:4.1f}/call  mean {sum(durs) / len(durs):7.2f} us  {name}")


if __name__ == "__main__":
  main()
