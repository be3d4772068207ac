"""Where a training step's time goes: bench_train_step.py's GCN/GAT step and its parts, each
jitted alone (ms, block_until_ready medians): on `lib`, the model's SpMMs at its widths (d=128
and 16, float32) and their vjp (A^T); then the forward (loss), forward + backward (grad) and
the whole step (Adam included), its device time, and a jitted no-op taking the step's arguments
(their dispatch cost).

Usage: python3 -m scripts.profile_step [gcn|gat] [lib|xla] [rmat20-d16|cora|rmat14-d8]
"""

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_tc as jst
from benchmarks import bench_train_step as bts
from benchmarks import common

model = sys.argv[1] if len(sys.argv) > 1 else "gcn"
impl = sys.argv[2] if len(sys.argv) > 2 else "lib"
name = sys.argv[3] if len(sys.argv) > 3 else "rmat20-d16"
g = {
  "rmat20-d16": lambda: common.rmat(20, 16),
  "rmat14-d8": lambda: common.rmat(14, 8),
  "cora": lambda: common.package_graph("cora"),
}[name]()
x, y, c, edge_index = bts._graph_inputs(name, g, np.random.default_rng(0))
lib_step, xla_step, largs, xargs, losses = bts._jax_steps(model, x, y, c, edge_index, g.shape[0])
step, (params, opt_state, *rest), loss_fn = (
  (lib_step, largs, losses[0]) if impl == "lib" else (xla_step, xargs, losses[1])
)
print(f"# device: {common.device_name()}; {model} {impl} {name}")

if impl == "lib":
  A = rest[-1]
  rng = np.random.default_rng(1)
  for d in (128, 16):
    h = jnp.asarray(rng.standard_normal((A.shape[0], d)), jnp.float32)
    fwd = jax.jit(lambda A, h: jst.spmm(A, h))
    bwd = jax.jit(lambda A, h: jax.vjp(lambda z: jst.spmm(A, z), h)[1](h)[0])
    print(
      f"spmm d={d}: {common.time_fn(fwd, A, h, repeat=10):.3f} ms; "
      f"its vjp (A^T): {common.time_fn(bwd, A, h, repeat=10):.3f} ms"
    )
grad_fn = jax.jit(jax.grad(loss_fn))
print(
  f"loss (forward): {common.time_fn(loss_fn, params, *rest, repeat=10):.3f} ms; "
  f"grad: {common.time_fn(grad_fn, params, *rest, repeat=10):.3f} ms"
)
device, wall = common.time_jax_device(step, (params, opt_state, *rest), 1)
print(f"step: {wall / 1e3:.3f} ms (on the device: {device / 1e3:.3f} ms)")
# What the step's arguments alone cost to dispatch: a jitted no-op taking all of them.
noop = jax.jit(lambda *a: jnp.zeros(()), keep_unused=True)
print(
  f"no-op with the step's {len(jax.tree_util.tree_leaves((params, opt_state, *rest)))} "
  f"arrays: {common.time_fn(noop, params, opt_state, *rest, repeat=50):.3f} ms"
)
