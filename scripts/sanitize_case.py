"""A small SpMM/SDDMM/edge-softmax/attention case for `compute-sanitizer --tool memcheck`
(scripts/gpu_check.sh --sanitize): every dtype and precision, a split window, a partial last
window, d not a multiple of 8, rows that lane groups, CTAs and several CTAs walk, and a graph
past 2^18 nonzeros whose row kernels run streams (`python3 -m scripts.sanitize_case
streams`: that part alone; `grads`: the attention backward's grouped and large-graph parts
alone). Buffers come from plain cudaMalloc (platform allocator) so out-of-bounds accesses are
seen.
"""

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_tc as jst
from jaxsparse_tc.testing import rel_err, window_blocks_coo


def sddmm_err(A, q, x, s) -> float:
  """Relative error of SDDMM values s ([H, nnz]) against float64 <q_h[row], x[col]>."""
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  return rel_err(
    s, np.einsum("hkd,kd->hk", np.asarray(q, np.float64)[:, r], np.asarray(x, np.float64)[c])
  )


def spmm_err(A, x, out, dtype) -> float:
  """Relative error of SpMM out ([H, m, d] or [m, d]) against float64 A (values cast to dtype) @
  x, summed entry by entry (no dense A)."""
  v = np.asarray(A.values.astype(dtype), np.float64)  # [..., nnz]
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  terms = np.moveaxis(v[..., :, None] * np.asarray(x, np.float64)[c], -2, 0)  # [nnz, ..., d]
  ref = np.zeros((A.shape[0],) + terms.shape[1:])
  np.add.at(ref, r, terms)
  return rel_err(out, np.moveaxis(ref, 0, -2))


def streams(rng) -> None:
  """A graph past 2^18 nonzeros: the row kernels walk whole rows and single CTA items of up to
  64 entries as streams (row_stream_max)."""
  big_m, big_n = 17011, 2003
  deg = rng.integers(0, 33, big_m)
  deg[3] = 1500  # a row of several CTA items
  deg[[7, 8, 9]] = 40, 64, 65  # single CTA items: two streamed, one walked by a CTA
  br = np.repeat(np.arange(big_m), deg)
  B = jst.SparseMatrix.from_coo(br, rng.integers(0, big_n, br.size), shape=(big_m, big_n))
  assert (1 << 18) <= B.nnz < (1 << 20), B.nnz
  rows = jst.KernelOptions(spmm="cuda_core", sddmm="cuda_core")
  for dtype, d in ((jnp.float16, 64), (jnp.bfloat16, 5), (jnp.float32, 40)):
    q = jnp.asarray(rng.standard_normal((2, big_m, d)), dtype)
    x = jnp.asarray(rng.standard_normal((big_n, d)), dtype)
    s = jax.jit(lambda B, q, x: jst.sddmm(B, q, x, precision="highest", options=rows).values)(
      B, q, x
    )
    serr = sddmm_err(B, q, x, s)
    y = jax.jit(lambda B, x: jst.spmm(B, x, options=rows))(B, x)
    yerr = spmm_err(B, x, y, dtype)
    print(
      f"{np.dtype(dtype).name:9s} d={d:3d} sddmm / spmm, {B.nnz} nonzeros (streams) "
      f"{serr:.2e} / {yerr:.2e}"
    )
    assert serr < 2e-2 and yerr < 2e-2, (serr, yerr)


def attention_outputs_finite(A, q, k, v, bias=None, options=None) -> bool:
  """The fused forward and its gradients (the tensor-core backward for 16-bit d in {32, 64,
  128}) all finite."""
  f = lambda q, k, v: jst.sparse_attention(A, q, k, v, bias=bias, options=options)  # noqa: E731
  o = jax.jit(f)(q, k, v)
  g = jax.jit(
    jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) ** 2), argnums=(0, 1, 2))
  )(q, k, v)
  return all(bool(jnp.all(jnp.isfinite(a.astype(jnp.float32)))) for a in (o, *g))


def grouped(rng) -> None:
  """The attention forward and backward on grouped schedules (windows of 0 .. 32 blocks merged
  inside CTAs, three heads: each head's items padded to whole groups), fp16, d = 32 and 128."""
  rows, cols, (m, n) = window_blocks_coo(rng, 32, n=2000, keep=0.5)
  A = jst.SparseMatrix.from_coo(rows, cols, shape=(m, n))
  assert A.grouped[0]
  for d in (32, 128):
    q, k, v = (jnp.asarray(rng.standard_normal((3, s, d)), jnp.float16) for s in (m, n, n))
    ok = attention_outputs_finite(A, q, k, v)
    print(f"grouped attention d={d:3d} finite: {ok}")
    assert ok


def grads_large(rng) -> None:
  """The tensor-core backward past kSmallGraphNnz (columns a pair ahead, split windows merged
  across CTAs in A and A^T), forced on at d = 128, bias, fp16 and bf16."""
  n = 3000
  rows, cols = np.nonzero(rng.random((n, n)) < 0.008)
  keep = (rows != 0) & (cols != 5)
  rows = np.concatenate([rows[keep], np.zeros(2500, np.int64), 1 + rng.permutation(n - 1)[:2500]])
  cols = np.concatenate([cols[keep], 6 + rng.permutation(n - 6)[:2500], np.full(2500, 5)])
  A = jst.SparseMatrix.from_coo(rows, cols, shape=(n, n))
  assert A.nnz >= 1 << 16
  fused = jst.KernelOptions(attention_backward="fused")
  for dtype, d in ((jnp.float16, 64), (jnp.bfloat16, 128)):
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, d)), dtype) for _ in range(3))
    bias = jnp.asarray(rng.standard_normal((2, A.nnz)), dtype)
    ok = attention_outputs_finite(A, q, k, v, bias, fused)
    print(f"{np.dtype(dtype).name:9s} d={d:3d} attention grads, {A.nnz} nonzeros, finite: {ok}")
    assert ok


def main() -> None:
  rng = np.random.default_rng(0)
  m, n = 21, 3001
  # rows 0-7: CTA items of the row kernels; row 9 (~1100 distinct columns): several CTA items
  rows = np.concatenate([np.repeat(np.arange(8), 400), np.full(1300, 9), rng.integers(8, m, 60)])
  cols = rng.integers(0, n, rows.size)
  A = jst.SparseMatrix.from_coo(
    rows, cols, rng.uniform(-1, 1, (2, rows.size)).astype(np.float32), shape=(m, n)
  )
  worst = 0.0
  for dtype, precision in [
    (jnp.float32, None),
    (jnp.float32, "highest"),
    (jnp.float16, None),
    (jnp.bfloat16, None),
  ]:
    for d in (5, 64):
      x = jnp.asarray(rng.standard_normal((n, d)), dtype)
      q = jnp.asarray(rng.standard_normal((2, m, d)), dtype)
      out = jax.jit(lambda A, x: jst.spmm(A, x, precision=precision))(A, x)
      s = jax.jit(lambda A, q, x: jst.sddmm(A, q, x, precision=precision).values)(A, q, x)
      err = spmm_err(A, x, out, dtype)
      serr = sddmm_err(A, q, x, s)
      worst = max(worst, err, serr)
      print(
        f"{np.dtype(dtype).name:9s} {precision or 'default':8s} d={d:3d} spmm {err:.2e} "
        f"sddmm {serr:.2e}"
      )
  assert worst < 2e-2, worst
  # the pipelined tensor-core SpMM forced, with 256-byte slab rows (2-block stages) and 128-byte
  # ones (4-block stages)
  tc = jst.KernelOptions(spmm="tensor_core")
  for dtype, d in ((jnp.float16, 128), (jnp.float32, 64), (jnp.bfloat16, 64)):
    x = jnp.asarray(rng.standard_normal((n, d)), dtype)
    err = spmm_err(A, x, jax.jit(lambda A, x: jst.spmm(A, x, options=tc))(A, x), dtype)
    print(f"{np.dtype(dtype).name:9s} d={d:3d} spmm tensor cores {err:.2e}")
    assert err < 2e-2, err
  streams(rng)
  grouped(rng)
  grads_large(rng)
  # edge softmax and attention (forward, jvp, grad through the backward row pass), every dtype
  for dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
    for d in (24, 64):
      q = jnp.asarray(rng.standard_normal((2, m, d)), dtype)
      k = jnp.asarray(rng.standard_normal((2, n, d)), dtype)
      v = jnp.asarray(rng.standard_normal((2, n, d)), dtype)
      p = jax.jit(lambda A: jst.edge_softmax(A.with_values(A.values.astype(dtype))).values)(A)
      soft = lambda w: jst.edge_softmax(A.with_values(w)).values  # noqa: E731
      w = A.values.astype(dtype)
      _, pt = jax.jit(lambda w: jax.jvp(soft, (w,), (w,)))(w)  # the backward kernel
      f = lambda q, k, v: jst.sparse_attention(A, q, k, v)
      o = jax.jit(f)(q, k, v)
      _, t = jax.jit(lambda q: jax.jvp(lambda q: f(q, k, v), (q,), (q,)))(q)
      g = jax.jit(
        jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) ** 2), argnums=(0, 1, 2))
      )(q, k, v)
      ok = all(bool(jnp.all(jnp.isfinite(a.astype(jnp.float32)))) for a in (p, pt, o, t, *g))
      print(f"{np.dtype(dtype).name:9s} d={d:3d} edge_softmax/attention finite: {ok}")
      assert ok
  print("sanitize case ok")


if __name__ == "__main__":
  if sys.argv[1:] == ["streams"]:  # that part alone
    streams(np.random.default_rng(0))
  elif sys.argv[1:] == ["grads"]:  # the attention backward's parts alone
    grouped(np.random.default_rng(0))
    grads_large(np.random.default_rng(1))
  else:
    main()
