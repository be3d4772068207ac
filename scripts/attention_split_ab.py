"""Fused attention with and without split windows, same process (docs/NOTES.md, issue 4).

Usage: python3 scripts/attention_split_ab.py [GRAPH ...]   (default: rmat17-d16 rmat20-d8)
Times the fused forward (and forward+backward) at d in {64, 128}, H in {1, 4}, fp16, once with
hub windows split across warps (the default) and once with JAXSPARSE_TC_ATTN_SPLIT=0 (one warp
per window), next to XLA's unfused peer; asserts the two fused outputs agree.
"""

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_attention as ba  # noqa: E402
import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402

GRAPHS = {"rmat17-d16": (17, 16), "rmat20-d8": (20, 8)}


def main() -> None:
  rows = []
  for name in sys.argv[1:] or list(GRAPHS):
    g = common.rmat_csr(*GRAPHS[name]) if name in GRAPHS else common.package_graph(name)
    A = jst.SparseMatrix.from_scipy(g)
    edges = tuple(jnp.asarray(a) for a in ba.csr_edges(g))
    n = g.shape[0]
    for d in (64, 128):
      fns = ba.methods(1.0 / math.sqrt(d))
      for H in (1, 4):
        q, k, v, w = (ba.normal_f16(i, (H, n, d)) for i in range(4))
        for mode in ("fwd", "fwd+bwd"):
          wrap = (lambda f: f) if mode == "fwd" else ba.with_grad
          extra = () if mode == "fwd" else (w,)
          fused = jax.jit(wrap(fns["fused"]))
          row = {"graph": name, "d": d, "H": H, "mode": mode}
          outs = {}
          for split in ("1", "0"):
            os.environ["JAXSPARSE_TC_ATTN_SPLIT"] = split  # read per launch
            outs[split] = jax.block_until_ready(fused(A, q, k, v, *extra))
            row[f"split={split} ms"] = common.time_fn(fused, A, q, k, v, *extra, repeat=20)
          os.environ.pop("JAXSPARSE_TC_ATTN_SPLIT")
          xla = jax.jit(wrap(fns["xla"]))
          row["xla ms"] = common.time_fn(xla, edges, q, k, v, *extra, repeat=10)
          errs = [ba.rel_err(a, b) for a, b in zip(jax.tree_util.tree_leaves(outs["1"]),
                                                   jax.tree_util.tree_leaves(outs["0"]))]
          assert max(errs) < 1e-2, errs
          row["split gain"] = row["split=0 ms"] / row["split=1 ms"]
          row["split=1 vs xla"] = row["xla ms"] / row["split=1 ms"]
          rows.append(row)
          print(row, flush=True)
    del A, edges
  common.print_table(rows, list(rows[0].keys()), f"attention split A/B ({common.device_name()})")


if __name__ == "__main__":
  main()
