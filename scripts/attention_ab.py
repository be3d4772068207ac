"""The fused attention forward under each value of one launch switch, same process.

Usage: python3 scripts/attention_ab.py VAR=v1,v2,... [GRAPH ...]
  e.g. JAXSPARSE_TC_ATTN_HEAD_MAJOR=0,1 (work order), JAXSPARSE_TC_ATTN_SPLIT=1,0 (hub windows
  split across warps) or JAXSPARSE_TC_SPLIT_BLOCKS=8,32 (piece size, read when the pattern is
  built); graphs default to cora rmat17-d16 rmat20-d8.
Device time per call (a chain of dependent calls q <- out queued behind a matmul, as
bench_chained), fp16, H = 4, d in {64, 128}, next to XLA's unfused peer. The matrix is built and
the forward run with the switch set to each value in turn. Asserts every value's output agrees
with the first value's.
"""

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_attention as ba  # noqa: E402
import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402
from bench_chained import _chain  # noqa: E402

GRAPHS = {"rmat17-d16": (17, 16), "rmat20-d8": (20, 8)}
H = 4


def main() -> None:
  var, values = sys.argv[1].split("=")
  values = values.split(",")
  rows = []
  for name in sys.argv[2:] or ["cora", *GRAPHS]:
    g = common.rmat_csr(*GRAPHS[name]) if name in GRAPHS else common.package_graph(name).tocsr()
    mats = {}
    for val in values:
      os.environ[var] = val
      mats[val] = jst.SparseMatrix.from_scipy(g)
    os.environ.pop(var)
    edges = tuple(jnp.asarray(a) for a in ba.csr_edges(g))
    n = g.shape[0]
    K = 32 if g.nnz < 10**6 else 8  # calls per chain: enough that a small graph's chain is long
    for d in (64, 128):
      fns = ba.methods(1.0 / math.sqrt(d))
      q, k, v = (ba.normal_f16(i, (H, n, d)) for i in range(3))
      fused = _chain(lambda A, k_, v_, q_: fns["fused"](A, q_, k_, v_), K)
      row = {"graph": name, "d": d}
      first = None
      for val in values:
        os.environ[var] = val
        A = mats[val]
        out = jax.block_until_ready(fns["fused"](A, q, k, v))
        if first is None:
          first = out
        assert ba.rel_err(out, first) < 1e-2, (val, ba.rel_err(out, first))
        row[f"{val} us"] = common.time_jax_device(fused, (A, k, v, q), K)[0]
      os.environ.pop(var)
      xla = _chain(lambda e, k_, v_, q_: fns["xla"](e, q_, k_, v_), K)
      row["xla us"] = common.time_jax_device(xla, (edges, k, v, q), K)[0]
      for val in values:
        row[f"{val} vs xla"] = row["xla us"] / row[f"{val} us"]
      rows.append(row)
      print(row, flush=True)
    del A, mats, edges
  common.print_table(rows, list(rows[0].keys()),
                     f"attention forward, {var} A/B, H={H} fp16 ({common.device_name()})")


if __name__ == "__main__":
  main()
