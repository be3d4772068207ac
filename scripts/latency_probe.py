"""Where a small graph's time goes: host dispatch, host launch work, device time.

Cora, d=128, fp16 SpMM (ours) and float32 segment_sum (XLA), each timed three ways:
  per call  back-to-back jitted calls, one sync at the end (what bench_spmm_sddmm reports);
  chain     one program of K dependent calls, wall time / K (what bench_chained reports);
  device    the same chain queued behind a 2-20 ms matmul, so the host has finished queueing
            before the GPU reaches the chain: (T(matmul + chain) - T(matmul)) / K.
Plus the dispatch cost of a jitted no-op taking the SparseMatrix pytree against one taking two
arrays. Usage: python3 scripts/latency_probe.py [graph]   (JAXSPARSE_TC_* switches apply).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402
from bench_chained import _chain  # noqa: E402
from bench_spmm_sddmm import _time  # noqa: E402

K = int(os.environ.get("LATENCY_PROBE_K", "32"))  # calls per program


def per_call_us(f, *args):
  return _time(lambda: f(*args), jax.block_until_ready) * 1e3


def chain_and_device_us(step, consts, x):
  """(chain, device) us per call of K dependent calls x <- step(*consts, x) in one program."""
  device, wall = common.time_jax_device(_chain(step, K), (*consts, x), K)
  return wall, device


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "cora"
  csr = common.package_graph(name).tocsr()
  csr.sort_indices()
  deg = np.maximum(np.asarray(csr.sum(1)).ravel(), 1)
  csr = (csr.multiply(1.0 / deg[:, None])).tocsr()
  m, n = csr.shape
  A = jst.SparseMatrix.from_scipy(csr)
  A16 = A.with_values(A.values.astype(jnp.float16))
  x16 = jnp.asarray(np.random.default_rng(0).standard_normal((n, 128)), jnp.float16)
  coo = csr.tocoo()
  r = jnp.asarray(coo.row.astype(np.int32))
  c = jnp.asarray(coo.col.astype(np.int32))
  v = jnp.asarray(coo.data.astype(np.float32))
  x32 = x16.astype(jnp.float32)

  def seg(v, x):
    return jax.ops.segment_sum(v[:, None] * x[c], r, num_segments=m, indices_are_sorted=True)

  print(f"{name}: {m} nodes, nnz {csr.nnz}, pytree leaves {len(jax.tree_util.tree_leaves(A16))}, "
        f"device {jax.devices()[0].device_kind}")
  rows = []
  rows.append(("no-op (SparseMatrix, x)", per_call_us(jax.jit(lambda A, x: x[0, 0]), A16, x16), None, None))
  rows.append(("no-op (values, x)", per_call_us(jax.jit(lambda v, x: x[0, 0]), A16.values, x16), None, None))
  ours = jax.jit(jst.spmm)
  pc = per_call_us(ours, A16, x16)
  ch, dev = chain_and_device_us(lambda A, x: jst.spmm(A, x), (A16,), x16)
  rows.append(("ours spmm fp16", pc, ch, dev))
  pc = per_call_us(jax.jit(lambda x: jst.spmm(A16, x)), x16)
  rows.append(("ours spmm fp16, A closed over", pc, None, None))
  sj = jax.jit(seg)
  pc = per_call_us(sj, v, x32)
  ch, dev = chain_and_device_us(seg, (v,), x32)
  rows.append(("xla segment_sum fp32", pc, ch, dev))
  print(f"{'case':34s} {'per call':>9s} {'chain':>8s} {'device':>8s}  (us)")
  for label, a, b, cdev in rows:
    fmt = lambda t: f"{t:8.1f}" if t is not None else "       -"  # noqa: E731
    print(f"{label:34s} {a:9.1f} {fmt(b)} {fmt(cdev)}")


if __name__ == "__main__":
  main()
