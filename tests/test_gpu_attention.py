"""edge_softmax and sparse_attention on the CUDA kernels vs float64 references (and the CPU
kernels). Skipped without a GPU and the CUDA extension."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import rel_err, window_blocks_coo
from jax.test_util import check_grads
from test_attention import (
  DTYPES,
  attention_grads_ref,
  attention_ref,
  hub_pattern,
  make_pattern,
  qkv,
  softmax_jvp_ref,
  softmax_ref,
)

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix

pytestmark = [
  pytest.mark.gpu,
  pytest.mark.skipif(
    not (jst.has_cuda() and any(d.platform == "gpu" for d in jax.devices())),
    reason="needs a CUDA GPU and the CUDA extension",
  ),
]

TOL = {jnp.float32: 1e-5, jnp.float16: 4e-3, jnp.bfloat16: 3e-2}


def gpu(x):
  return jax.device_put(x, jax.devices("gpu")[0])


def on_gpu(A):
  return jax.tree_util.tree_map(gpu, A)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_edge_softmax(rng, dtype):
  A = on_gpu(make_pattern(rng, 301, 257, density=0.05, empty_rows=20))
  v = gpu(jnp.asarray(rng.standard_normal((3, A.nnz)) * 4, dtype))
  out = jax.jit(lambda x: jst.edge_softmax(A, x).values)(v)
  assert list(out.devices())[0].platform == "gpu"
  assert rel_err(out, softmax_ref(A, np.asarray(v, np.float64))) < TOL[dtype] * 2
  big = gpu(jnp.asarray(rng.uniform(-1e4, 1e4, A.nnz), dtype))
  out = np.asarray(jst.edge_softmax(A, big).values, np.float64)
  assert np.all(np.isfinite(out))
  assert rel_err(out, softmax_ref(A, np.asarray(big, np.float64))) < TOL[dtype] * 2
  if dtype == jnp.float32:
    check_grads(
      lambda x: jst.edge_softmax(A, x).values,
      (v,),
      order=1,
      modes=["fwd", "rev"],
      atol=2e-2,
      rtol=2e-2,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_edge_softmax_long_windows(rng, dtype):
  """Windows of more values than a warp holds in registers (8 per lane: 256; then each pass
  reloads them) beside shorter ones, a 2000-value hub row, empty rows, two heads: the forward,
  and the backward kernel through jvp and vjp, against float64."""
  A = on_gpu(hub_pattern(rng, 200, 3000, hub=2000, density=0.01))
  spans = np.diff(np.asarray(A.pattern.block_value_ptr)[np.asarray(A.pattern.window_block_ptr)])
  assert spans.max() > 256 and spans.min() < 256
  v = gpu(jnp.asarray(rng.standard_normal((2, A.nnz)) * 4, dtype))
  t = gpu(jnp.asarray(rng.standard_normal((2, A.nnz)), dtype))
  f = jax.jit(lambda x: jst.edge_softmax(A, x).values)
  y = softmax_ref(A, np.asarray(v, np.float64))
  assert rel_err(f(v), y) < TOL[dtype] * 2
  ref = softmax_jvp_ref(A, y, t)  # the jvp along t, and (self-adjoint) the vjp of t
  _, tangent = jax.jit(lambda x, dx: jax.jvp(f, (x,), (dx,)))(v, t)
  assert rel_err(tangent, ref) < TOL[dtype] * 4
  cot = jax.jit(lambda x, g: jax.vjp(f, x)[1](g)[0])(v, t)
  assert rel_err(cot, ref) < TOL[dtype] * 4


# d = dv in {32, 64, 128} with fp16/bf16 takes the tensor-core kernel; others the scalar one.
@pytest.mark.parametrize("d,dv", [(32, 32), (64, 64), (128, 128), (16, 24)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_attention_forward(rng, dtype, d, dv):
  A = on_gpu(make_pattern(rng, 203, 170, density=0.08, empty_rows=10))
  H = 2
  q, k, v = (gpu(x) for x in qkv(rng, A, d=d, dv=dv, dtype=dtype, h=H, amp=1.5))
  bias = gpu(jnp.asarray(rng.standard_normal((H, A.nnz)), dtype))
  for b in (None, bias):
    out = jax.jit(lambda *a: jst.sparse_attention(A, *a[:3], bias=a[3]))(q, k, v, b)
    ref = attention_ref(A, q, k, v, None, b)
    assert rel_err(out, ref) < TOL[dtype], b is None
  # one head of K/V broadcast, no head axis at all
  out = jst.sparse_attention(A, q[0], k[0], v[0])
  assert out.shape == (203, dv)
  assert rel_err(out, attention_ref(A, q[0], k[0], v[0])) < TOL[dtype]


def _check_forward_and_grads(rng, Ac, d, heads, empty_rows, options=None):
  """The fused forward (fp16 and bf16, d = dv = d, without and with bias ~1e3 whose maxima differ
  between a split window's pieces) against float64, empty rows exactly zero; then the gradients,
  which start from the merged row log-sum-exp, against the CPU kernels."""
  A = on_gpu(Ac)
  for dtype in (jnp.float16, jnp.bfloat16):
    q, k, v = (gpu(x) for x in qkv(rng, A, d=d, dv=d, dtype=dtype, h=heads))
    bias = gpu(jnp.asarray(rng.uniform(-1e3, 1e3, (heads, A.nnz)), dtype))
    for b in (None, bias):
      out = np.asarray(
        jax.jit(lambda *a: jst.sparse_attention(A, *a[:3], bias=a[3], options=options))(q, k, v, b),
        np.float64,
      )
      assert np.all(np.isfinite(out))
      assert rel_err(out, attention_ref(A, q, k, v, None, b)) < 2 * TOL[dtype]
      np.testing.assert_array_equal(out[:, empty_rows], 0.0)

  def loss(M, a, kk, vv, bb):
    return jnp.sum(jst.sparse_attention(M, a, kk, vv, bias=bb, options=options).astype(jnp.float32))

  got = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4)))(A, q, k, v, bias)
  cpu = jax.devices("cpu")[0]
  with jax.default_device(cpu):
    ref = jax.grad(loss, argnums=(1, 2, 3, 4))(
      jax.device_put(Ac, cpu), *jax.device_put((q, k, v, bias), cpu)
    )
  for g, r in zip(got, ref):
    assert rel_err(g, r) < 3e-2


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_gpu_attention_hub_window(rng, d, merge):
  """Windows far longer than one schedule item: each piece's warp writes a partial and the last
  one merges them (merge_split_windows=True), or one warp does the window (False: the path
  windows past the workspace's capacity take).
  Hub rows of different lengths, rows of a split window present in only some pieces, an empty
  row inside a split window, bias, logits ~1e3 whose maxima differ between pieces."""
  opts = jst.KernelOptions(merge_split_windows=merge, attention_backward="fused")
  m, n = 45, 3000
  hubs = {0: 2500, 9: 700, 17: 300, 20: 40}  # 20 shares window 2 with 17; row 1 stays empty
  rows = np.concatenate([np.full(c, r) for r, c in hubs.items()] + [rng.integers(2, m, 400)])
  cols = np.concatenate([rng.permutation(n)[:c] for c in hubs.values()] + [rng.integers(0, n, 400)])
  Ac = SparseMatrix.from_coo(rows, cols, shape=(m, n))
  assert np.asarray(Ac.pattern.schedule)[:, 3].sum() >= 3, "the hubs should split"
  _check_forward_and_grads(rng, Ac, d, 2, np.array([1]), opts)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_gpu_attention_grouped_windows(rng, d, grouped):
  """A small graph with windows of 0 .. 32 blocks: whole windows and windows of two and four
  pieces, merged inside a CTA (grouped schedule), or across CTAs through the workspace
  (FormatOptions(grouped=False)). Three heads (each head's items padded to whole groups), empty
  rows, bias with logits ~1e3 whose maxima differ between pieces, and the gradients after it."""
  rows, cols, shape = window_blocks_coo(rng, 32, keep=0.5)
  Ac = SparseMatrix.from_coo(
    rows, cols, shape=shape, format_options=jst.FormatOptions(grouped=None if grouped else False)
  )
  assert Ac.grouped[0] == grouped
  _check_forward_and_grads(rng, Ac, d, 3, np.setdiff1d(np.arange(shape[0]), rows))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_attention_large_logits(rng, dtype):
  A = on_gpu(make_pattern(rng, 120, 100, density=0.1, empty_rows=5))
  q, k, v = (gpu(x) for x in qkv(rng, A, d=64, dv=64, dtype=dtype, amp=6.0))  # |s| ~ 2e3
  bias = gpu(jnp.asarray(rng.uniform(-1e4, 1e4, A.nnz), dtype))
  for b in (None, bias):
    out = np.asarray(jst.sparse_attention(A, q, k, v, scale=1.0, bias=b), np.float64)
    assert np.all(np.isfinite(out))
    assert rel_err(out, attention_ref(A, q, k, v, 1.0, b)) < 2 * TOL[dtype]


@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_attention_check_grads(rng, with_bias):
  A = on_gpu(make_pattern(rng, 37, 29, density=0.2, empty_rows=3))
  q, k, v = (gpu(x) for x in qkv(rng, A, d=16, dv=8, h=2))
  args = [q, k, v]
  if with_bias:
    args.append(gpu(jnp.asarray(rng.standard_normal((2, A.nnz)), jnp.float32)))
  f = lambda *a: jst.sparse_attention(A, *a[:3], scale=0.6, bias=a[3] if len(a) > 3 else None)
  # float32 central differences: 1e-2 failed ~1 seed in a few hundred (the numerical side: the
  # analytic gradient matched float64 differences to 5e-7); the float64 tests below are tight
  check_grads(f, args, order=1, modes=["fwd", "rev"], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_attention_grads_match_cpu(rng, dtype):
  """GPU backward and jvp vs the CPU kernels on identical inputs, plus vmap == loop."""
  Ac = make_pattern(rng, 150, 130, density=0.06, empty_rows=8)
  A = on_gpu(Ac)
  H = 3
  qc, kc, vc = qkv(rng, Ac, d=64, dv=64, dtype=dtype, h=H)
  bc = jnp.asarray(rng.standard_normal((H, Ac.nnz)), dtype)
  w = jnp.asarray(rng.standard_normal((H, 150, 64)), jnp.float32)

  def loss(M, *a):
    return jnp.sum(jst.sparse_attention(M, *a[:3], bias=a[3]).astype(jnp.float32) * w)

  cpu = jax.devices("cpu")[0]
  with jax.default_device(cpu):
    ref = jax.grad(loss, argnums=(1, 2, 3, 4))(jax.device_put(Ac, cpu), qc, kc, vc, bc)
  args = [gpu(x) for x in (qc, kc, vc, bc)]
  got = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4)))(A, *args)
  tol = {jnp.float32: 1e-4, jnp.float16: 1e-2, jnp.bfloat16: 5e-2}[dtype]
  for g, r in zip(got, ref):
    assert rel_err(g, r) < tol
  tangents = [gpu(jnp.asarray(rng.standard_normal(x.shape), dtype)) for x in args]
  _, jg = jax.jvp(lambda *a: loss(A, *a), tuple(args), tuple(tangents))
  with jax.default_device(cpu):
    _, jc = jax.jvp(
      lambda *a: loss(jax.device_put(Ac, cpu), *a),
      (qc, kc, vc, bc),
      tuple(jax.device_put(t, cpu) for t in tangents),
    )
  assert abs(float(jg) - float(jc)) < tol * (abs(float(jc)) + 1)
  f = lambda a, b, c, bb: jst.sparse_attention(A, a, b, c, bias=bb)
  batched = jax.vmap(f)(*args)
  loop = jnp.stack([f(*(x[i] for x in args)) for i in range(H)])
  np.testing.assert_allclose(
    np.asarray(batched, np.float32), np.asarray(loop, np.float32), rtol=1e-6, atol=1e-6
  )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,dv", [(1, 1), (17, 40), (64, 64), (128, 128), (256, 256)])
def test_gpu_attention_backward_matches_float64(rng, dtype, d, dv):
  """grad on the GPU against float64 gradients: one Q head broadcast over H=2 K/V heads, bias,
  empty rows, a hub row cut into several CTA items (a small graph: pieces of 8; a large one,
  past 64k nonzeros: long rows shared by a CTA's groups). fp32 d=256 is past the CUDA per-edge
  kernel's width and takes the composed path."""
  tol = {jnp.float32: 1e-4, jnp.float16: 1e-2, jnp.bfloat16: 2e-2}[dtype]
  for Ac, large in (
    (hub_pattern(rng, 150, 400, hub=390), False),
    (hub_pattern(rng, 600, 3000, hub=2500, density=0.04), True),
  ):
    assert (Ac.nnz >= 1 << 16) == large
    A = on_gpu(Ac)
    H, m = 2, Ac.shape[0]
    q = gpu(qkv(rng, Ac, d=d, dv=dv, dtype=dtype, h=1)[0])
    _, k, v = (gpu(x) for x in qkv(rng, Ac, d=d, dv=dv, dtype=dtype, h=H))
    bias = gpu(jnp.asarray(rng.standard_normal((H, Ac.nnz)), dtype))
    w = gpu(jnp.asarray(rng.standard_normal((H, m, dv)), jnp.float32))
    scale = 1.0 / np.sqrt(d)

    def loss(a, kk, vv, bb, ww):
      return jnp.sum(jst.sparse_attention(A, a, kk, vv, bias=bb).astype(jnp.float32) * ww)

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias, w)
    ref = attention_grads_ref(Ac, q, k, v, scale, bias, w)
    for name, g, r in zip("qkvb", got, ref):
      assert g.shape == r.shape, name
      assert rel_err(g, r) < tol, name
    if d == 64:  # vmap of grad: attention_bwd_p's batch rule folds the batch into heads
      ws = jnp.stack([w, -2.0 * w, w[::-1]])
      gq = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, None, None, None, 0)))(q, k, v, bias, ws)
      for i in range(3):
        assert rel_err(gq[i], attention_grads_ref(Ac, q, k, v, scale, bias, ws[i])[0]) < tol


def _edge_attention_ref(A, q, k, v, w):
  """float64 attention and the gradients of sum(out * w), per edge (no dense matrix): for
  graphs too large for attention_grads_ref. q [H, m, d], k [H, n, d], v [H, n, dv], w [H, m, dv]."""
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
  H, m, d = q.shape
  scale = 1.0 / np.sqrt(d)
  out, dq, dk, dv = (np.zeros_like(x) for x in (w, q, k, v))
  for h in range(H):
    s = scale * np.einsum("ed,ed->e", q[h][r], k[h][c])
    mx = np.full(m, -np.inf)
    np.maximum.at(mx, r, s)
    e = np.exp(s - mx[r])
    p = e / np.bincount(r, e, m)[r]
    np.add.at(out[h], r, p[:, None] * v[h][c])
    np.add.at(dv[h], c, p[:, None] * w[h][r])
    dp = np.einsum("ed,ed->e", w[h][r], v[h][c])
    ds = p * (dp - np.einsum("ed,ed->e", w[h], out[h])[r])
    np.add.at(dq[h], r, scale * ds[:, None] * k[h][c])
    np.add.at(dk[h], c, scale * ds[:, None] * q[h][r])
  return out, (dq, dk, dv)


@pytest.mark.parametrize("hub", [False, True])
@pytest.mark.parametrize("backward", ["fused", "composed"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_attention_large_pattern(rng, d, backward, hub):
  """A pattern of ~80k nonzeros and as many condensed columns: the paths that only large graphs
  take (the forward's and the fused backward's next-pair prefetch, the composed backward's
  two-entry batches), forward and both backwards against float64, fp16, H=2. `hub`: one window
  of ~75 blocks and a column of 900 rows, so both orientations have a few long windows and get
  pieces shorter than SPLIT_BLOCKS (pattern.split_blocks)."""
  from jaxsparse_tc._src.pattern import SPLIT_BLOCKS, split_blocks

  n = 20_000
  rows = np.repeat(np.arange(n), rng.integers(0, 9, n))
  cols = rng.integers(0, n, rows.size)
  if hub:
    rows = np.concatenate([rows, np.repeat(np.arange(8, 16), 75), rng.integers(0, n, 900)])
    cols = np.concatenate([cols, rng.integers(0, n, 600), np.full(900, 77)])
  Ac = SparseMatrix.from_coo(rows, cols, shape=(n, n))
  assert Ac.nnz >= 1 << 16 and Ac.pattern.window_cols.shape[0] >= 1 << 16
  for p in (Ac.pattern, Ac.pattern_t):
    assert (split_blocks(p.window_block_ptr, Ac.nnz) < SPLIT_BLOCKS) == hub
  A = on_gpu(Ac)
  q, k, v = (gpu(x) for x in qkv(rng, Ac, d=d, dv=d, dtype=jnp.float16, h=2))
  w = gpu(jnp.asarray(rng.standard_normal((2, n, d)), jnp.float32))
  opts = jst.KernelOptions(attention_backward=backward)

  def loss(a, kk, vv):
    out = jst.sparse_attention(A, a, kk, vv, options=opts)
    return jnp.sum(out.astype(jnp.float32) * w), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  ref_out, ref_grads = _edge_attention_ref(Ac, q, k, v, w)
  assert rel_err(out, ref_out) < 2 * TOL[jnp.float16]
  for name, g, r in zip("qkv", grads, ref_grads):
    assert rel_err(g, r) < 1e-2, name


# -- one softmax rule for NaN, masked and empty rows --------------------------------------------
# A row's softmax runs over its stored entries' logits s = scale <q_i, k_j> + bias_ij. A NaN or
# +inf logit makes the whole row NaN (as jax.nn.softmax); a row without entries or whose logits
# are all -inf gives zeros and exactly zero gradients (its saved lse is +inf); -inf entries get
# weight 0 and zero gradient. Every kernel family must agree with the CPU kernels on it.


def rule_attention_ref(A, q, k, v, scale, bias, w):
  """float64 attention by the rule, and the gradients (dq, dk, dv, dbias) of sum(out * w), per
  edge. q [H, m, d], k [H, n, d], v [H, n, dv], bias [H, nnz] (format order), w [H, m, dv]; the
  gradients are meaningful where no row is NaN."""
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  q, k, v, b, w = (np.asarray(x, np.float64) for x in (q, k, v, bias, w))
  H, m, _ = q.shape
  out = np.zeros(w.shape)
  dq, dk, dv, db = (np.zeros(x.shape) for x in (q, k, v, b))
  with np.errstate(invalid="ignore", over="ignore"):
    for h in range(H):
      s = scale * np.einsum("ed,ed->e", q[h][r], k[h][c]) + b[h]
      mx = np.full(m, -np.inf)
      np.maximum.at(mx, r, s)  # NaN propagates into the row's max
      live = np.isfinite(mx)  # rows with a finite max: the usual softmax
      e = np.where(live[r], np.exp(s - np.where(live, mx, 0.0)[r]), 0.0)
      p = e / np.where(live, np.bincount(r, e, m), 1.0)[r]
      p[(np.isnan(mx) | (mx == np.inf))[r]] = np.nan
      np.add.at(out[h], r, p[:, None] * v[h][c])
      np.add.at(dv[h], c, p[:, None] * w[h][r])
      ds = p * (np.einsum("ed,ed->e", w[h][r], v[h][c]) - np.einsum("id,id->i", w[h], out[h])[r])
      np.add.at(dq[h], r, scale * ds[:, None] * k[h][c])
      np.add.at(dk[h], c, scale * ds[:, None] * q[h][r])
      db[h] = ds
  return out, (dq, dk, dv, db)


def _rule_case(rng, dtype, d, nan_rows: bool):
  """A pattern with empty rows, and a float32 bias [2, nnz] that masks one row entirely (-inf)
  and half of another; with nan_rows, head 0 of a third row has a NaN logit and head 1 of a
  fourth a +inf one. Returns A, q, k, v, bias, w and the rows (masked, partial, nan, inf,
  empty)."""
  A = make_pattern(rng, 70, 60, density=0.12, empty_rows=6)
  r = np.asarray(A.rows)
  counts = np.bincount(r, minlength=70)
  masked, partial, nan, inf = rng.choice(np.flatnonzero(counts >= 2), 4, replace=False)
  bias = rng.standard_normal((2, A.nnz)).astype(np.float32)
  bias[:, r == masked] = -np.inf
  bias[:, np.flatnonzero(r == partial)[::2]] = -np.inf
  if nan_rows:
    bias[0, np.flatnonzero(r == nan)[0]] = np.nan
    bias[1, np.flatnonzero(r == inf)[-1]] = np.inf
  q, k, v = (gpu(x) for x in qkv(rng, A, d=d, dv=d, dtype=dtype, h=2))
  w = gpu(jnp.asarray(rng.standard_normal((2, 70, d)), jnp.float32))
  rows = dict(masked=masked, partial=partial, nan=nan, inf=inf, empty=np.flatnonzero(counts == 0))
  return A, q, k, v, gpu(jnp.asarray(bias)), w, rows


# (dtype, d, backward): the tensor-core forward (16-bit, d in {32, 64, 128}) with the fused and the
# composed backward; the scalar forward (float32, or a d the tensor cores do not take)
RULE_FAMILIES = [
  (jnp.float16, 64, "fused"),
  (jnp.bfloat16, 32, "fused"),
  (jnp.float16, 64, "composed"),
  (jnp.float32, 24, "composed"),
  (jnp.float16, 24, "composed"),
]
RULE_IDS = ["f16-tc-fused", "bf16-tc-fused", "f16-tc-composed", "f32-scalar", "f16-scalar"]


def _on_cpu(f, *args):
  cpu = jax.devices("cpu")[0]
  with jax.default_device(cpu):
    return f(*jax.device_put(args, cpu))


@pytest.mark.parametrize("dtype,d,backward", RULE_FAMILIES, ids=RULE_IDS)
def test_gpu_attention_softmax_rule_forward(rng, dtype, d, backward):
  """NaN and +inf logits make their row (and only that head's) NaN; masked and empty rows are
  zeros with lse +inf; the rest is the usual softmax: against float64 and the CPU kernels."""
  from jaxsparse_tc._src import attention

  Ac, q, k, v, bias, w, rows = _rule_case(rng, dtype, d, nan_rows=True)
  A = on_gpu(Ac)
  scale = 0.3
  opts = jst.KernelOptions(attention_backward=backward)
  f = jax.jit(
    lambda A, q, k, v, b: jst.sparse_attention(A, q, k, v, bias=b, scale=scale, options=opts)
  )
  out = np.asarray(f(A, q, k, v, bias), np.float64)
  assert np.all(np.isnan(out[0, rows["nan"]])) and np.all(np.isnan(out[1, rows["inf"]]))
  assert np.all(np.isfinite(out[1, rows["nan"]])) and np.all(np.isfinite(out[0, rows["inf"]]))
  for r in (rows["masked"], *rows["empty"]):
    np.testing.assert_array_equal(out[:, r], 0.0)
  ref, _ = rule_attention_ref(Ac, q, k, v, scale, bias, w)
  np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
  ok = ~np.isnan(ref)
  assert rel_err(out[ok], ref[ok]) < 2 * TOL[dtype]
  cpu = np.asarray(_on_cpu(lambda A, *a: f(A, *a), Ac, q, k, v, bias), np.float64)
  np.testing.assert_array_equal(np.isnan(out), np.isnan(cpu))
  assert rel_err(out[ok], cpu[ok]) < 2 * TOL[dtype]
  # the saved row log-sum-exp: +inf without a finite logit, NaN with a NaN or +inf one
  _, lse = jax.jit(
    lambda A, *a: attention.attention_fwd_p.bind(
      *a,
      *A.pattern_operands(),
      shape=A.shape,
      scale=scale,
      has_bias=True,
      grouped=A.grouped[0],
      grouped_t=A.grouped[1],
      options=opts,
    )
  )(A, q, k, v, bias)
  lse = np.asarray(lse)
  for r in (rows["masked"], *rows["empty"]):
    np.testing.assert_array_equal(lse[:, r], np.inf)
  assert np.isnan(lse[0, rows["nan"]]) and np.isnan(lse[1, rows["inf"]])
  assert np.isfinite(lse[:, rows["partial"]]).all()


@pytest.mark.parametrize("dtype,d,backward", RULE_FAMILIES, ids=RULE_IDS)
def test_gpu_attention_softmax_rule_grads(rng, dtype, d, backward):
  """Gradients (the fused or composed backward) and the jvp with masked, half-masked and empty
  rows: finite, exactly zero where a row has no finite logit and at -inf entries (dq, dbias),
  against float64 and the CPU kernels."""
  Ac, q, k, v, bias, w, rows = _rule_case(rng, dtype, d, nan_rows=False)
  A = on_gpu(Ac)
  scale = 0.3
  opts = jst.KernelOptions(attention_backward=backward)

  def loss(A, q, k, v, b, w):
    out = jst.sparse_attention(A, q, k, v, bias=b, scale=scale, options=opts)
    return jnp.sum(out.astype(jnp.float32) * w)

  grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4)))
  got = [np.asarray(g, np.float64) for g in grad(A, q, k, v, bias, w)]
  for g in got:
    assert np.all(np.isfinite(g))
  dead = np.concatenate([[rows["masked"]], rows["empty"]])
  np.testing.assert_array_equal(got[0][:, dead], 0.0)  # dq of rows without finite logits
  np.testing.assert_array_equal(got[3][:, np.isinf(np.asarray(bias)).any(0)], 0.0)  # dbias
  _, ref = rule_attention_ref(Ac, q, k, v, scale, bias, w)
  cpu = _on_cpu(grad, Ac, q, k, v, bias, w)
  tol = {jnp.float32: 1e-4, jnp.float16: 1e-2, jnp.bfloat16: 3e-2}[dtype]
  for name, g, rf, c in zip("qkvb", got, ref, cpu):
    assert rel_err(g, rf) < tol, name
    assert rel_err(g, c) < tol, name
  # jvp: the tangent of masked and empty rows is zero
  dq = gpu(jnp.asarray(rng.standard_normal(q.shape), q.dtype))
  _, t = jax.jit(
    lambda A, q, dq: jax.jvp(
      lambda q: jst.sparse_attention(A, q, k, v, bias=bias, scale=scale), (q,), (dq,)
    )
  )(A, q, dq)
  t = np.asarray(t, np.float64)
  assert np.all(np.isfinite(t))
  np.testing.assert_array_equal(t[:, dead], 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_edge_softmax_rule(rng, dtype):
  """edge_softmax: a row with a NaN or +inf value is all NaN, a row of -inf values zeros (and
  zero gradient), -inf values weight 0: against the rule in float64 and the CPU kernels."""
  Ac = make_pattern(rng, 60, 50, density=0.12, empty_rows=4)
  r = np.asarray(Ac.rows)
  nan, inf, masked, partial = rng.choice(
    np.flatnonzero(np.bincount(r, minlength=60) >= 2), 4, replace=False
  )
  x = rng.standard_normal((2, Ac.nnz)) * 3
  x[0, np.flatnonzero(r == nan)[0]] = np.nan
  x[1, np.flatnonzero(r == inf)[0]] = np.inf
  x[:, r == masked] = -np.inf
  x[:, np.flatnonzero(r == partial)[::2]] = -np.inf
  A, xv = on_gpu(Ac), gpu(jnp.asarray(x, dtype))
  f = jax.jit(lambda A, x: jst.edge_softmax(A, x).values)
  out = np.asarray(f(A, xv), np.float64)
  ref = np.zeros_like(x)
  with np.errstate(invalid="ignore"):
    for h in range(2):
      for i in np.unique(r):
        s = np.asarray(xv, np.float64)[h, r == i]
        if np.isnan(s).any() or (s == np.inf).any():
          ref[h, r == i] = np.nan
        elif (s > -np.inf).any():
          e = np.exp(s - s.max())
          ref[h, r == i] = e / e.sum()
  np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
  assert np.isnan(out[0, r == nan]).all() and np.isnan(out[1, r == inf]).all()
  np.testing.assert_array_equal(out[:, r == masked], 0.0)
  ok = ~np.isnan(ref)
  assert rel_err(out[ok], ref[ok]) < TOL[dtype] * 2
  cpu = np.asarray(_on_cpu(f, Ac, xv), np.float64)
  np.testing.assert_array_equal(np.isnan(out), np.isnan(cpu))
  assert rel_err(out[ok], cpu[ok]) < TOL[dtype] * 2
  # gradient without the NaN rows: zero through the masked row and at -inf values
  xf = np.where(np.isnan(x) | (x == np.inf), 0.0, x)
  t = gpu(jnp.asarray(rng.standard_normal((2, Ac.nnz)), dtype))
  g = jax.jit(jax.grad(lambda x: jnp.sum(f(A, x).astype(jnp.float32) * t.astype(jnp.float32))))
  dx = np.asarray(g(gpu(jnp.asarray(xf, dtype))), np.float64)
  assert np.all(np.isfinite(dx))
  np.testing.assert_array_equal(dx[np.isneginf(xf)], 0.0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("d", [64, 24])
def test_gpu_attention_float32_bias(rng, dtype, d):
  """A float32 bias of +-1e5 (past float16's range, far past bfloat16's precision) with 16-bit
  Q, K, V: the kernels read it as float32 (tensor-core forward at d = 64, scalar at 24), so the
  logits are those of float64 (one entry per row dominates)."""
  Ac = make_pattern(rng, 80, 64, density=0.1, empty_rows=4)
  A = on_gpu(Ac)
  q, k, v = (gpu(x) for x in qkv(rng, Ac, d=d, dv=d, dtype=dtype, h=2))
  bias = gpu(jnp.asarray(rng.uniform(-1e5, 1e5, (2, Ac.nnz)), jnp.float32))
  w = gpu(jnp.asarray(rng.standard_normal((2, 80, d)), jnp.float32))
  out = jax.jit(lambda A, q, k, v, b: jst.sparse_attention(A, q, k, v, bias=b))(A, q, k, v, bias)
  out = np.asarray(out, np.float64)
  assert np.all(np.isfinite(out))
  ref, (_, _, ref_dv, _) = rule_attention_ref(Ac, q, k, v, 1.0 / np.sqrt(d), bias, w)
  assert rel_err(out, ref) < 2 * TOL[dtype]
  grads = jax.jit(
    jax.grad(
      lambda q, k, v, b: jnp.sum(jst.sparse_attention(A, q, k, v, bias=b).astype(jnp.float32) * w),
      argnums=(0, 1, 2, 3),
    )
  )(q, k, v, bias)
  assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)
  assert grads[3].dtype == jnp.float32
  assert rel_err(grads[2], ref_dv) < 2e-2
