"""Where a training step's device time goes: one GCN/GAT step (benchmarks/bench_train_step.py's
models) between cuProfilerStart/Stop, for `nsys --capture-range=cudaProfilerApi` or
`ncu --profile-from-start off`.

Usage: python3 scripts/profile_step.py [gcn|gat] [lib|xla] [rmat20-d16|cora|rmat14-d8]
Runs 3 steps (compile + warm-up) outside the capture, then `STEPS` (default 2) inside it.
"""

import ctypes
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import bench_train_step as bts  # noqa: E402
import common  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else "gcn"
impl = sys.argv[2] if len(sys.argv) > 2 else "lib"
name = sys.argv[3] if len(sys.argv) > 3 else "rmat20-d16"
g = {"rmat20-d16": lambda: common.rmat(20, 16), "rmat14-d8": lambda: common.rmat(14, 8),
     "cora": lambda: common.package_graph("cora")}[name]()
x, y, c, edge_index = bts._graph_inputs(name, g, np.random.default_rng(0))
lib_step, xla_step, largs, xargs, losses = bts._jax_steps(model, x, y, c, edge_index, g.shape[0])
step, args = (lib_step, largs) if impl == "lib" else (xla_step, xargs)
params, opt_state, *rest = args
for _ in range(3):
  params, opt_state, loss = step(params, opt_state, *rest)
jax.block_until_ready(loss)
try:
  cuda = ctypes.CDLL("libcuda.so.1")
except OSError:  # no GPU driver here: run the steps anyway (a check of the script)
  cuda = None
if cuda:
  cuda.cuProfilerStart()
for _ in range(int(os.environ.get("STEPS", "2"))):
  params, opt_state, loss = step(params, opt_state, *rest)
jax.block_until_ready(loss)
if cuda:
  cuda.cuProfilerStop()
print(f"done {model} {impl} {name} loss {float(loss):.4f}")

if os.environ.get("PARTS"):  # device time of the step's parts, each jitted alone (ms)
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  if impl == "lib":
    A = rest[-1]
    n = A.shape[0]
    rng = np.random.default_rng(1)
    for d in (128, 16):
      h = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
      fwd = jax.jit(lambda A, h: jst.spmm(A, h))
      bwd = jax.jit(lambda A, h: jax.vjp(lambda z: jst.spmm(A, z), h)[1](h)[0])
      print(f"spmm d={d}: {common.time_fn(fwd, A, h, repeat=10):.3f} ms; "
            f"its vjp (A^T): {common.time_fn(bwd, A, h, repeat=10):.3f} ms")
  loss_fn = losses[0] if impl == "lib" else losses[1]
  grad_fn = jax.jit(jax.grad(loss_fn))
  print(f"loss (forward): {common.time_fn(loss_fn, params, *rest, repeat=10):.3f} ms; "
        f"grad: {common.time_fn(grad_fn, params, *rest, repeat=10):.3f} ms")
  print(f"step: {common.time_fn(step, params, opt_state, *rest, repeat=10):.3f} ms")
