"""Small-d SpMM on the row kernels: gathers in flight per lane, A/B in one process.

Groups of 4 lanes (float32 d <= 16, 16-bit d <= 32) by default take two entries per lane per
chunk and keep 8 gathers in flight (JAXSPARSE_TC_ROWS_UNROLL unset); JAXSPARSE_TC_ROWS_UNROLL=4
gives them one entry per lane and 4 gathers (the kernel before session 8). Graphs: rmat17-d16
and GCN's propagation matrix of R-MAT 2^20 x 16 (bench_train_step's). SpMM and its vjp (A^T),
ms per call (block_until_ready medians), each variant compiled afresh.

  python3 scripts/rows_unroll_ab.py        (needs the CUDA extension and a GPU)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402
from jaxsparse_tc.nn import graph  # noqa: E402

VARIANTS = {"unroll4": {"JAXSPARSE_TC_ROWS_UNROLL": "4"}, "default": {}}


def gcn_matrix(g):
  csr = g.tocsr()
  targets = np.repeat(np.arange(g.shape[0]), np.diff(csr.indptr))
  return graph.gcn_norm(np.stack([csr.indices.astype(np.int64), targets]), g.shape[0])


def main():
  print("# device:", jax.devices()[0].device_kind)
  rng = np.random.default_rng(1)
  print("| graph | dtype | d | " + " | ".join(f"{v} spmm / vjp ms" for v in VARIANTS) + " |")
  print("|---|---|---|" + "---|" * len(VARIANTS))
  for name, make in (("rmat17-d16", lambda: jst.SparseMatrix.from_scipy(common.rmat(17, 16))),
                     ("gcn rmat20-d16", lambda: gcn_matrix(common.rmat(20, 16)))):
    A = make()
    for dt, ds in ((jnp.float32, (8, 16, 32)), (jnp.float16, (16, 32))):
      Ad = A.with_values(A.values.astype(dt))
      for d in ds:
        h = jnp.asarray(rng.standard_normal((A.shape[1], d)), dt)
        cells = []
        for env in VARIANTS.values():
          with common.environ(env):
            fwd = jax.jit(lambda A, h: jst.spmm(A, h))
            bwd = jax.jit(lambda A, h: jax.vjp(lambda z: jst.spmm(A, z), h)[1](h)[0])
            cells.append(f"{common.time_fn(fwd, Ad, h, repeat=20):.3f} / "
                         f"{common.time_fn(bwd, Ad, h, repeat=20):.3f}")
        print(f"| {name} | {jnp.dtype(dt).name} | {d} | " + " | ".join(cells) + " |", flush=True)
    del A


if __name__ == "__main__":
  main()
