"""One fused attention forward, or forward and backward, for `ncu` (scripts/gpu_check.sh
--profile=attn:GRAPH:D or attnbwd:GRAPH:D).

Usage: python3 -m scripts.profile_attention [graph] [d] [heads] [bwd]
graph: cora (default), rmat17-d16 or rmat20-d8; fp16 Q, K, V of width d (64) and heads (4);
bwd: the gradients of sum(out) too. The program runs 3 times (compile + 2); profile the last
launch of a kernel with `--launch-skip 2`.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_tc as jst
from benchmarks import common

name = sys.argv[1] if len(sys.argv) > 1 else "cora"
d = int(sys.argv[2]) if len(sys.argv) > 2 else 64
heads = int(sys.argv[3]) if len(sys.argv) > 3 else 4
rmat = {"rmat17-d16": (17, 16), "rmat20-d8": (20, 8)}
g = common.rmat_csr(*rmat[name]) if name in rmat else common.package_graph(name).tocsr()
A = jst.SparseMatrix.from_scipy(g)
rng = np.random.default_rng(0)
q, k, v = (
  jnp.asarray(rng.standard_normal((heads, s, d)), jnp.float16)
  for s in (g.shape[0], g.shape[1], g.shape[1])
)
f = jax.jit(jst.sparse_attention)
if len(sys.argv) > 4 and sys.argv[4] == "bwd":
  f = jax.jit(
    jax.grad(
      lambda A, q, k, v: jst.sparse_attention(A, q, k, v).astype(jnp.float32).sum(),
      argnums=(1, 2, 3),
    )
  )
for _ in range(3):
  out = jax.block_until_ready(f(A, q, k, v))
out = out[0] if isinstance(out, tuple) else out
print("done", name, g.nnz, d, heads, float(jnp.abs(out.astype(jnp.float32)).mean()))
