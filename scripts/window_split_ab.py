"""The tensor-core window kernels (SpMM, SDDMM) under each piece size of a split window.

Usage: python3 scripts/window_split_ab.py [SIZES] [GRAPH]   (SIZES e.g. 8,4; GRAPH cora)
The pattern is built with JAXSPARSE_TC_SPLIT_BLOCKS set to each size (the schedule's pieces),
and the window kernels are forced (JAXSPARSE_TC_SPMM_VARIANT=async, JAXSPARSE_TC_SDDMM_VARIANT=tc;
the default picks the CUDA-core row kernels on sparse blocks). Device us per call, d=128 fp16, as
bench_chained: a chain of 32 dependent SpMMs, a fan of 32 independent SDDMMs. Asserts every size's
results agree with the first size's.
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
from bench_chained import SDDMM_TC, SPMM_TC, _chain  # noqa: E402

K = 32


def main() -> None:
  sizes = (sys.argv[1] if len(sys.argv) > 1 else "8,4").split(",")
  g = common.package_graph(sys.argv[2] if len(sys.argv) > 2 else "cora").tocsr()
  deg = np.maximum(np.diff(g.indptr), 1).astype(np.float32)
  g = g.multiply(1.0 / deg[:, None]).tocsr()  # rows scaled: a chain of SpMMs stays bounded
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((g.shape[1], 128)), jnp.float16)
  qs = tuple(jnp.asarray(rng.standard_normal((g.shape[0], 128)), jnp.float16) for _ in range(K))
  ys = tuple(jnp.asarray(rng.standard_normal((g.shape[1], 128)), jnp.float16) for _ in range(K))
  rows, first = [], {}
  for size in sizes:
    with common.environ({"JAXSPARSE_TC_SPLIT_BLOCKS": size}):
      A = jst.SparseMatrix.from_scipy(g)
    A = A.with_values(A.values.astype(jnp.float16))
    row = {"piece blocks": size, "split items": int((np.asarray(A.pattern.schedule)[:, 3] > 0).sum())}
    with common.environ({**SPMM_TC, **SDDMM_TC}):
      spmm = _chain(jst.spmm, K)
      sddmm = jax.jit(lambda A, qs, ys: tuple(jst.sddmm(A, q, y).values for q, y in zip(qs, ys)))
      outs = {"spmm": np.asarray(spmm(A, x), np.float32),
              "sddmm": np.asarray(sddmm(A, qs[:1], ys[:1])[0], np.float32)}
      for name, out in outs.items():
        ref = first.setdefault(name, out)
        assert np.allclose(out, ref, rtol=2e-2, atol=2e-2), (size, name)
      row["spmm us"] = common.time_jax_device(spmm, (A, x), K)[0]
      row["sddmm us"] = common.time_jax_device(sddmm, (A, qs, ys), K)[0]
    rows.append(row)
    print(row, flush=True)
  common.print_table(rows, list(rows[0].keys()),
                     f"window kernels by piece size, d=128 fp16 ({common.device_name()})")


if __name__ == "__main__":
  main()
