"""One SpMM on a benchmark graph (rmat17-d16, d=128 by default), for `ncu`
(scripts/gpu_check.sh --profile).

Usage: python3 -m scripts.profile_spmm [dtype] [d] [auto|torch|rows|windows] [graph]
    [none|affinity]
(graph: a name of benchmarks.common.load_graph; affinity: jst.reorder's order first)
The SpMM runs 3 times (compile + 2); profile the last launch with `--launch-skip 2`.
With `torch` the same product runs through torch.sparse.mm on a CSR tensor (cuSPARSE).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_tc as jst
from benchmarks import common

dtype = {"fp16": jnp.float16, "bf16": jnp.bfloat16, "fp32": jnp.float32}[
  sys.argv[1] if len(sys.argv) > 1 else "fp16"
]
d = int(sys.argv[2]) if len(sys.argv) > 2 else 128
g = common.load_graph(sys.argv[4] if len(sys.argv) > 4 else "rmat17-d16").tocsr()
if len(sys.argv) > 5 and sys.argv[5] != "none":
  r = jst.reorder(g, sys.argv[5], seed=0)
  g = g[r.perm][:, r.perm].tocsr()
if len(sys.argv) > 3 and sys.argv[3] == "torch":
  import torch

  tdt = {jnp.float16: torch.float16, jnp.bfloat16: torch.bfloat16, jnp.float32: torch.float32}[
    dtype
  ]
  tA = common.torch_csr(g, tdt)
  tx = torch.randn(g.shape[1], d, dtype=tdt, device="cuda")
  for _ in range(3):
    torch.sparse.mm(tA, tx)
  torch.cuda.synchronize()
  print("done torch", g.nnz, d, dtype)
  sys.exit(0)
A = jst.SparseMatrix.from_scipy(g)
A = A.with_values(A.values.astype(dtype))
x = jnp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], d)), dtype)
kernel = sys.argv[3] if len(sys.argv) > 3 else "auto"
f = jax.jit(lambda A, x: jst.spmm(A, x, options=jst.KernelOptions(spmm=kernel)))
for _ in range(3):
  jax.block_until_ready(f(A, x))
print("done", A.nnz, d, dtype)
