"""One out-of-memory point of sparse attention, fresh process (docs/NOTES.md, issue 4).

Usage: XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.97 \
         python3 scripts/attention_oom_point.py METHOD [SCALE] [HEADS] [D]
METHOD: fused (jaxsparse_tc.sparse_attention) or xla (benchmarks/bench_attention.py's unfused
XLA peer on CSR-ordered edges). One forward+backward (jax.grad w.r.t. Q, K, V), fp16, on
R-MAT 2**SCALE nodes with 16 edges per node (default 20, 64 heads, d = 64). Prints the
compiled footprint and whether the call ran or ran out of memory.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_attention  # noqa: E402
import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402


def main() -> None:
  method = sys.argv[1]
  defaults = [20, 64, 64]  # scale, heads, d
  scale, heads, d = [int(a) for a in sys.argv[2:5]] + defaults[len(sys.argv[2:5]):]
  g = common.rmat_csr(scale, 16)
  n = g.shape[0]
  if method == "fused":
    graph = jst.SparseMatrix.from_scipy(g)
    attn = lambda A, q, k, v: jst.sparse_attention(A, q, k, v)  # noqa: E731
  else:
    graph = tuple(jnp.asarray(a) for a in bench_attention.csr_edges(g))
    attn = bench_attention.methods(1.0 / d ** 0.5)["xla"]
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v, w = (jax.random.normal(keys[i], (heads, n, d), jnp.float16) for i in range(4))
  loss = lambda G, q, k, v, w: jnp.sum(attn(G, q, k, v).astype(jnp.float32) * w)  # noqa: E731
  f = jax.jit(jax.grad(loss, argnums=(1, 2, 3)))
  mem = f.lower(graph, q, k, v, w).compile().memory_analysis()
  total = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
  print(f"{method} rmat{scale}-d16 nnz={g.nnz} H={heads} d={d}: temp {mem.temp_size_in_bytes / 2**30:.1f} "
        f"GiB, footprint {total / 2**30:.1f} GiB", flush=True)
  try:
    t0 = time.perf_counter()
    jax.block_until_ready(f(graph, q, k, v, w))
    print(f"ran: first call {time.perf_counter() - t0:.2f} s", flush=True)
  except Exception as e:  # RESOURCE_EXHAUSTED is what this records
    print(f"failed: {str(e).splitlines()[0][:160]}", flush=True)


if __name__ == "__main__":
  main()
