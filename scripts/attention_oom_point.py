"""One out-of-memory point of sparse attention, fresh process (docs/NOTES.md, issue 4).

Usage: XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 \
         python3 scripts/attention_oom_point.py METHOD [SCALE] [HEADS] [D]
METHOD: fused, lib or xla (benchmarks/bench_attention.py's methods). One forward+backward
(its with_grad), fp16, on R-MAT 2**SCALE nodes with 16 edges per node (defaults: scale 20,
64 heads, d = 64). Prints the compiled footprint and whether the call ran or ran out of memory.
"""

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_attention as ba  # noqa: E402
import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402


def main() -> None:
  method = sys.argv[1]
  defaults = [20, 64, 64]  # scale, heads, d
  scale, heads, d = [int(a) for a in sys.argv[2:5]] + defaults[len(sys.argv[2:5]):]
  g = common.rmat_csr(scale, 16)
  graph = (tuple(jnp.asarray(a) for a in ba.csr_edges(g)) if method == "xla"
           else jst.SparseMatrix.from_scipy(g))
  f = jax.jit(ba.with_grad(ba.methods(1.0 / math.sqrt(d))[method]))
  q, k, v, w = (ba.normal_f16(i, (heads, g.shape[0], d)) for i in range(4))
  temp_mb, total_mb = ba.memory_mb(f.lower(graph, q, k, v, w).compile())
  print(f"{method} rmat{scale}-d16 nnz={g.nnz} H={heads} d={d}: temp {temp_mb:.0f} MB, "
        f"footprint {total_mb:.0f} MB", flush=True)
  try:
    t0 = time.perf_counter()
    jax.block_until_ready(f(graph, q, k, v, w))
    print(f"ran: first call {time.perf_counter() - t0:.2f} s", flush=True)
  except Exception as e:  # noqa: BLE001 - the out-of-memory error is what this records
    if not ba.is_oom(e):
      raise
    print(f"out of memory: {str(e).splitlines()[0][:160]}", flush=True)


if __name__ == "__main__":
  main()
