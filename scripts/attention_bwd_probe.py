"""Where the attention backward's time goes (NOTES, session 10): GPU time of its parts on one
graph, fp16, H=4: the forward; the per-edge pass (attention_bwd_p's kernel) against the same
quantities composed from two SDDMMs and XLA (attention._edge_pass); the three SpMMs (dQ; dV and
dK over A^T with their permutations); and the whole grad. K independent calls per program, each on its own
operands (common.time_jax_device).

  python3 scripts/attention_bwd_probe.py [graph] [d]     (graph: cora, rmat17-d16 (default))
"""

import functools
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
from jaxsparse_tc import attention  # noqa: E402
from jaxsparse_tc._src.pattern import PERM_T, transpose_operands  # noqa: E402
from jaxsparse_tc._src.spmm import spmm_p  # noqa: E402

K = int(os.environ.get("ATTN_PROBE_K", "4"))


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "rmat17-d16"
  d = int(sys.argv[2]) if len(sys.argv) > 2 else 64
  csr = common.rmat(17, 16) if name == "rmat17-d16" else common.package_graph(name)
  A = jst.SparseMatrix.from_scipy(csr.tocsr())
  m, n = A.shape
  h = 4
  scale = 1.0 / np.sqrt(d)
  rng = np.random.default_rng(0)
  mk = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float16)
  ops = [(mk(h, m, d), mk(h, n, d), mk(h, n, d), mk(h, m, d)) for _ in range(K)]
  bias = jnp.zeros((1, 1), jnp.float16)
  fwd = jax.jit(lambda A, ops: [attention.attention_fwd_p.bind(
      q, k, v, bias, *A.pattern_operands(), shape=A.shape, scale=scale, has_bias=False,
      grouped=A.grouped[0], grouped_t=A.grouped[1]) for q, k, v, _ in ops])
  saved = fwd(A, ops)
  print(f"# device: {jax.devices()[0].device_kind}; {name}: {m} rows, nnz {A.nnz}, d={d}, H={h}, "
        f"K={K}")

  def time(label, f, *args):
    us = common.time_jax_device(jax.jit(f), args, K)[0]
    print(f"| {label} | {us:.1f} |", flush=True)

  print("| part | us per call |\n|---|---|")
  time("forward", lambda A, ops: fwd(A, ops), A, ops)
  params = dict(shape=A.shape, scale=scale, has_bias=False)

  def edge_pass(f, A, ops, saved):
    return [f(q, k, v, bias, o, lse, do, *A.pattern_operands(), **params)
            for (q, k, v, do), (o, lse) in zip(ops, saved)]

  for unroll in ("4", "2"):
    os.environ["JAXSPARSE_TC_ATTN_BWD_UNROLL"] = unroll
    time(f"edge pass (one kernel, unroll {unroll})",
         functools.partial(edge_pass, attention.attention_bwd_p.bind), A, ops, saved)
  os.environ.pop("JAXSPARSE_TC_ATTN_BWD_UNROLL")
  time("edge pass composed (2 SDDMM + XLA)", functools.partial(edge_pass, attention._edge_pass),
       A, ops, saved)
  res = edge_pass(attention.attention_bwd_p.bind, A, ops, saved)

  def spmms(A, ops, res):
    pat = A.pattern_operands()
    pt, perm_t = transpose_operands(pat), pat[PERM_T]
    out = []
    for (q, k, v, do), (p, ds) in zip(ops, res):
      dss = (scale * ds).astype(q.dtype)
      out += [spmm_p.bind(dss, k, *pat, shape=A.shape, precision=0),
              spmm_p.bind(p[:, perm_t], do, *pt, shape=A.shape[::-1], precision=0),
              spmm_p.bind(dss[:, perm_t], q, *pt, shape=A.shape[::-1], precision=0)]
    return out

  time("dQ, dV, dK: 3 SpMMs (+ permutations)", spmms, A, ops, res)
  grad = jax.grad(lambda q, k, v, w: jnp.sum(jst.sparse_attention(A, q, k, v).astype(
      jnp.float32) * w), argnums=(0, 1, 2))
  time("forward + backward (grad)", lambda ops: [grad(q, k, v, do.astype(jnp.float32))
                                                 for q, k, v, do in ops], ops)


if __name__ == "__main__":
  main()
