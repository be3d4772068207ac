"""CUDA SpMM/SDDMM against a float64 reference and the CPU kernels (skipped without a GPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_graph, rel_err

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix


def _has_gpu() -> bool:
  try:
    return any(d.platform == "gpu" for d in jax.devices())
  except RuntimeError:
    return False


pytestmark = [
  pytest.mark.gpu,
  pytest.mark.skipif(
    not (jst.has_cuda() and _has_gpu()), reason="needs a CUDA GPU and the CUDA extension"
  ),
]

# (dtype, precision, tolerance on ||out - ref|| / ||ref||)
DTYPES = {
  "f32": (jnp.float32, None, 1e-3),  # tf32 tensor cores
  "f32-highest": (jnp.float32, "highest", 1e-5),  # exact fp32 on CUDA cores
  "f16": (jnp.float16, None, 1e-2),
  "bf16": (jnp.bfloat16, None, 1e-2),
}
DS = [1, 8, 17, 32, 64, 128, 256]


def _gpu():
  return next(d for d in jax.devices() if d.platform == "gpu")


def _cpu():
  return jax.devices("cpu")[0]


def _pattern(rng, kind: str):
  """COO (rows, cols, shape) of a named test pattern; rows listed in `empty` hold nothing."""
  if kind == "random":  # m, n not multiples of 8, empty rows, partial blocks
    m, n = 203, 131
    count = int(m * n * 0.06)
    rows, cols = rng.integers(0, m, count), rng.integers(0, n, count)
    empty = rng.choice(m, 23, replace=False)
    keep = ~np.isin(rows, empty)
    return rows[keep], cols[keep], (m, n), empty
  if kind == "heavy":  # windows with thousands of blocks: split items must combine
    m, n = 29, 30011
    hub = np.repeat(np.arange(8), 4000)  # rows 0..7: ~4000 columns each
    hub_cols = rng.integers(0, n, hub.size)
    mid = np.repeat(np.arange(16, 21), 300)  # a window with a few hundred columns
    mid_cols = rng.integers(0, n, mid.size)
    tail = rng.integers(21, m, 50)  # the last (partial) window, light
    tail_cols = rng.integers(0, n, tail.size)
    rows = np.concatenate([hub, mid, tail])
    cols = np.concatenate([hub_cols, mid_cols, tail_cols])
    empty = np.arange(8, 16)  # a whole empty window
    return rows, cols, (m, n), empty
  if kind == "medium":  # 2^16 .. 2^17 nonzeros: the row SDDMM's one row per group, shares >= 32
    m, n = 6007, 3001
    deg = rng.integers(0, 33, m)
    deg[5], deg[[11, 300, 2000]] = 2500, (40, 100, 129)  # several CTA items; single ones
    rows = np.repeat(np.arange(m), deg)
    assert (1 << 16) <= rows.size < (1 << 17), rows.size
    cols = rng.integers(0, n, rows.size)
    return rows, cols, (m, n), np.setdiff1d(np.arange(m), rows)
  if kind == "large":  # past 2^18 nonzeros: whole rows streamed per lane group, CTA items
    m, n = 17011, 1201
    deg = rng.integers(0, 33, m)  # rows of 0..32 entries: row changes inside and between batches
    deg[5], deg[77] = 2500, 400  # a row of several CTA items; a row of one
    # rows just past the row piece (32): single CTA items, those of up to 64 entries walked by
    # the streams (row_stream_max: 2^18 .. 2^20 nonzeros)
    deg[[11, 300, 2000, 3000, 4000, 5000]] = 40, 64, 65, 100, 128, 129
    rows = np.repeat(np.arange(m), deg)
    assert (1 << 18) <= rows.size < (1 << 20), rows.size
    cols = rng.integers(0, n, rows.size)
    empty = np.setdiff1d(np.arange(m), rows)
    return rows, cols, (m, n), empty
  if kind == "dense":  # communities: >= 20 nonzeros per block past 2^16, a split hub window
    m = 16 * 600 + 11  # an odd window count, a partial last window
    size = 24  # a community spans 3 windows and 24 columns; rows take ~70% of them
    rows = np.repeat(np.arange(m), size)
    cols = rows // size * size + np.tile(np.arange(size), m)
    keep = (rng.random(rows.size) < 0.7) & (cols < m)
    rows, cols = rows[keep], cols[keep]
    hub = np.repeat(np.arange(8), 3000)  # a window of hundreds of blocks: split items
    rows, cols = np.concatenate([hub, rows]), np.concatenate([rng.integers(0, m, hub.size), cols])
    empty = np.concatenate([np.arange(800, 808), rng.choice(np.arange(808, m), 40, replace=False)])
    keep = ~np.isin(rows, empty)
    return rows[keep], cols[keep], (m, m), empty
  if kind == "cora":
    g = load_graph("cora")
    if g is None:
      pytest.skip("cora.npz not in the package data")
    coo = g.tocoo()
    return coo.row, coo.col, g.shape, np.flatnonzero(np.diff(g.indptr) == 0)
  raise ValueError(kind)


def _matrix(rng, kind, heads=None):
  rows, cols, shape, empty = _pattern(rng, kind)
  vals = rng.uniform(-1, 1, rows.size if heads is None else (heads, rows.size))
  return SparseMatrix.from_coo(rows, cols, vals.astype(np.float32), shape=shape), empty


def _dense64(A, dtype):
  """A as float64 after the cast its values get inside spmm ([m, n] or [H, m, n])."""
  v = np.asarray(A.values.astype(dtype), np.float64)
  dense = np.zeros(v.shape[:-1] + A.shape)
  dense[..., np.asarray(A.rows), np.asarray(A.cols)] = v
  return dense


def _on(device, tree):
  return jax.device_put(tree, device)


def _check(out, ref, cpu_out, tol, what):
  out = np.asarray(out, np.float64)
  assert np.all(np.isfinite(out)), f"{what}: non-finite output"
  err = rel_err(out, ref)
  assert err < tol, f"{what}: relative error vs float64 {err:.3g} >= {tol}"
  err_cpu = rel_err(out, cpu_out)
  assert err_cpu < tol, f"{what}: relative error vs CPU kernel {err_cpu:.3g} >= {tol}"


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("kind", ["random", "heavy", "cora", "dense"])
def test_spmm(rng, kind, dt, d):
  dtype, precision, tol = DTYPES[dt]
  A, empty = _matrix(rng, kind)
  A = A.astype(dtype)  # the 16-bit kernels: values in X's dtype
  x = rng.standard_normal((A.shape[1], d)).astype(np.float32)
  xj = jnp.asarray(x, dtype)
  f = jax.jit(lambda A, x: jst.spmm(A, x, precision=precision))
  out = f(_on(_gpu(), A), _on(_gpu(), xj))
  assert out.dtype == dtype and out.shape == (A.shape[0], d)
  assert list(out.devices())[0].platform == "gpu"
  cpu_out = f(_on(_cpu(), A), _on(_cpu(), xj))
  ref = _dense64(A, dtype) @ np.asarray(xj, np.float64)
  _check(out, ref, cpu_out, tol, f"spmm {kind} {dt} d={d}")
  # Empty rows come out as exact zeros (every output element is written).
  np.testing.assert_array_equal(np.asarray(out, np.float64)[empty], 0.0)


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("kind", ["random", "heavy", "cora", "large"])
def test_sddmm(rng, kind, dt, d):
  dtype, precision, tol = DTYPES[dt]
  A, _ = _matrix(rng, kind)
  m, n = A.shape
  x = jnp.asarray(rng.standard_normal((m, d)), dtype)
  y = jnp.asarray(rng.standard_normal((n, d)), dtype)
  f = jax.jit(lambda A, x, y: jst.sddmm(A, x, y, precision=precision).values)
  out = f(_on(_gpu(), A), _on(_gpu(), x), _on(_gpu(), y))
  assert out.dtype == dtype and out.shape == (A.nnz,)
  cpu_out = f(_on(_cpu(), A), _on(_cpu(), x), _on(_cpu(), y))
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.einsum("kd,kd->k", np.asarray(x, np.float64)[r], np.asarray(y, np.float64)[c])
  _check(out, ref, cpu_out, tol, f"sddmm {kind} {dt} d={d}")


@pytest.mark.parametrize("launch", ["small", "large"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("kind", ["random", "heavy", "cora"])
def test_sddmm_window_parts(rng, kind, dt, launch):
  """The window SDDMM cuts each item into 8 parts on small launches (items x heads < 16384, so
  that they still fill the GPU) and not on large ones: every value comes out exactly once."""
  opts = jst.KernelOptions(sddmm="windows")
  dtype, precision, tol = DTYPES[dt]
  A, _ = _matrix(rng, kind)
  m, n = A.shape
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  items = A.pattern.schedule.shape[0]
  big = -(-16384 // items)  # heads that make the launch large
  cases = ((128, 1), (40, 3)) if launch == "small" else ((40, big),)
  if launch == "small" and 3 * items >= 16384:
    pytest.skip("this matrix's launch is never small")
  for d, h in cases:
    x = jnp.asarray(rng.standard_normal((h, m, d)), dtype)
    y = jnp.asarray(rng.standard_normal((h, n, d)), dtype)
    out = jax.jit(lambda A, x, y: jst.sddmm(A, x, y, options=opts).values)(
      _on(_gpu(), A), _on(_gpu(), x), _on(_gpu(), y)
    )
    ref = np.einsum("hkd,hkd->hk", np.asarray(x, np.float64)[:, r], np.asarray(y, np.float64)[:, c])
    assert rel_err(out, ref) < tol, f"sddmm {launch} launch {kind} {dt} d={d} H={h}"


def _head_cases(rng, Ag, a64, n, d, dtype):
  """(matrix, X, float64 reference) for heads H x H, H x 1 (dense broadcast), 1 x H."""
  xs = jnp.asarray(rng.standard_normal((a64.shape[0], n, d)), dtype)
  x1 = jnp.asarray(rng.standard_normal((n, d)), dtype)
  return [
    (Ag, xs, np.einsum("hmn,hnd->hmd", a64, np.asarray(xs, np.float64))),
    (Ag, x1, np.einsum("hmn,nd->hmd", a64, np.asarray(x1, np.float64))),
    (
      Ag.with_values(Ag.values[0]),
      xs,
      np.einsum("mn,hnd->hmd", a64[0], np.asarray(xs, np.float64)),
    ),
  ]


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["random", "heavy", "dense"])
def test_heads_and_vmap(rng, kind, dt):
  """Native heads (values [H, nnz], X [H, n, d], broadcasting) and vmap folding into them."""
  dtype, precision, tol = DTYPES[dt]
  H, d = 3, 24
  A, _ = _matrix(rng, kind, heads=H)
  A = A.astype(dtype)
  m, n = A.shape
  a64 = _dense64(A, dtype)
  gpu = _gpu()
  Ag = _on(gpu, A)
  spmm = jax.jit(lambda A, x: jst.spmm(A, x, options=CUDA_CORE))
  cases = _head_cases(rng, Ag, a64, n, d, dtype)
  for A_, x_, ref in cases:
    out = spmm(A_, _on(gpu, x_))
    assert rel_err(out, ref) < tol
  # vmap over value sets and dense operands (the H x H case)
  _, xs, ref = cases[0]
  vm = jax.jit(jax.vmap(lambda v, x: jst.spmm(Ag.with_values(v), x)))
  out = vm(Ag.values, _on(gpu, xs))
  assert out.shape == (H, m, d)
  assert rel_err(out, ref) < tol
  # sddmm with heads and vmap
  xq = jnp.asarray(rng.standard_normal((H, m, d)), dtype)
  yk = jnp.asarray(rng.standard_normal((H, n, d)), dtype)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.einsum("hkd,hkd->hk", np.asarray(xq, np.float64)[:, r], np.asarray(yk, np.float64)[:, c])
  s = jax.jit(jax.vmap(lambda q, k: jst.sddmm(Ag, q, k).values))(_on(gpu, xq), _on(gpu, yk))
  assert s.shape == (H, A.nnz) and rel_err(s, ref) < tol
  s = jax.jit(lambda q, k: jst.sddmm(Ag, q, k).values)(_on(gpu, xq), _on(gpu, yk[0]))
  ref1 = np.einsum("hkd,kd->hk", np.asarray(xq, np.float64)[:, r], np.asarray(yk, np.float64)[0, c])
  assert rel_err(s, ref1) < tol


@pytest.mark.parametrize("dt", ["f32", "f32-highest", "f16"])
@pytest.mark.parametrize("kind", ["random", "heavy"])
def test_grad_on_gpu(rng, kind, dt):
  """jax.grad through jit on GPU (SpMM's transpose is SpMM on A^T plus SDDMM) vs the CPU."""
  dtype, precision, tol = DTYPES[dt]
  A, _ = _matrix(rng, kind)
  m, n = A.shape
  d = 40
  x = jnp.asarray(rng.standard_normal((n, d)), dtype)
  y = jnp.asarray(rng.standard_normal((m, d)), dtype)
  wt = jnp.asarray(rng.standard_normal((m, d)), jnp.float32)

  # Linear in spmm, quadratic through sddmm: every transpose rule runs.
  def loss2(v, x, y, A):
    B = A.with_values(v)
    out = jst.spmm(B, x, precision=precision).astype(jnp.float32)
    s = jst.sddmm(B, y, x, precision=precision).values.astype(jnp.float32)
    return jnp.sum(out * wt) + jnp.sum(s * v.astype(jnp.float32))

  v = A.values.astype(dtype)
  g = jax.jit(jax.grad(loss2, argnums=(0, 1, 2)))
  gg = g(*_on(_gpu(), (v, x, y, A)))
  gc = g(*_on(_cpu(), (v, x, y, A)))
  for a, b, name in zip(gg, gc, ("dvalues", "dx", "dy")):
    assert list(a.devices())[0].platform == "gpu"
    a64 = np.asarray(a, np.float64)
    assert np.all(np.isfinite(a64)), name
    assert rel_err(a64, b) < 3 * tol, f"{name}: {rel_err(a64, b):.3g}"


def test_many_heads_split_workspace(rng):
  """Split windows with several heads and d not a multiple of 8 (scalar edge path)."""
  A, empty = _matrix(rng, "heavy", heads=5)
  d = 33
  x = jnp.asarray(rng.standard_normal((5, A.shape[1], d)), jnp.float16)
  out = jax.jit(jst.spmm)(_on(_gpu(), A), _on(_gpu(), x))
  ref = np.einsum("hmn,hnd->hmd", _dense64(A, jnp.float16), np.asarray(x, np.float64))
  assert rel_err(out, ref) < 1e-2
  np.testing.assert_array_equal(np.asarray(out, np.float64)[:, empty], 0.0)


@pytest.mark.parametrize("variant", ["rows", "windows"])
@pytest.mark.parametrize("kind", ["heavy", "cora"])
def test_spmm_chain_in_a_command_buffer(rng, kind, variant):
  """Four dependent SpMM pairs x <- A^T (A x) / scale in one program: XLA records consecutive
  FFI calls into a CUDA graph (command buffer), their workspace memsets and prep kernels
  included (heavy: rows cut into several CTA items, split windows). Two runs on fresh inputs,
  so the second replays the graph on other buffers; both against float64."""
  opts = jst.KernelOptions(spmm=variant)
  A, _ = _matrix(rng, kind)
  a64 = _dense64(A, jnp.float32)
  scale = float(np.linalg.norm(a64, 2)) ** 2  # keeps the iterates bounded

  def chain(A, x):
    for _ in range(4):
      x = jst.spmm(A.T, jst.spmm(A, x, options=opts), options=opts) / scale
    return x

  f = jax.jit(chain)
  Ag = _on(_gpu(), A)
  for _ in range(2):
    x = rng.standard_normal((A.shape[1], 24)).astype(np.float32)
    out = f(Ag, _on(_gpu(), jnp.asarray(x)))
    ref = x.astype(np.float64)
    for _ in range(4):
      ref = a64.T @ (a64 @ ref) / scale
    tol = 1e-5 if variant == "rows" else 1e-2  # exact float32 / tf32, 8 products deep
    assert rel_err(out, ref) < tol, f"{kind} {variant}"


@pytest.mark.parametrize("d", [32, 128])
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_spmm_many_units_per_warp(rng, dt, d):
  """Far more units (item x head x slab) than resident warps x 32, so each persistent warp of
  the pipelined kernel decodes several batches of units and crosses heads, windows and split
  pieces in one stream; empty rows. d = 128 stages 2 blocks at a time (256-byte slab rows), d =
  32 four."""
  import scipy.sparse as sp

  opts = jst.KernelOptions(spmm="windows")
  dtype, _, tol = DTYPES[dt]
  m, n, H = 24_011, 20_000, 40
  rows = np.repeat(np.arange(m), rng.integers(0, 12, m))
  rows = np.concatenate([rows, np.full(600, 5)])  # a hub row: a split window
  cols = rng.integers(0, n, rows.size)
  vals = rng.uniform(-1, 1, (H, rows.size)).astype(np.float32)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=(m, n))
  A = A.astype(dtype)
  x = jnp.asarray(rng.standard_normal((H, n, d)), dtype)
  out = np.asarray(
    jax.jit(lambda A, x: jst.spmm(A, x, options=opts))(_on(_gpu(), A), _on(_gpu(), x)), np.float64
  )
  v64 = np.asarray(A.values.astype(dtype), np.float64)
  x64 = np.asarray(x, np.float64)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.stack([sp.csr_matrix((v64[h], (r, c)), shape=(m, n)) @ x64[h] for h in range(H)])
  assert np.all(np.isfinite(out))
  assert rel_err(out, ref) < tol
  empty = np.setdiff1d(np.arange(m), rows)
  np.testing.assert_array_equal(out[:, empty], 0.0)


def test_repeatable(rng):
  """Same inputs twice: the split-window atomics may reorder sums, but only by rounding."""
  A, _ = _matrix(rng, "heavy")
  x = jnp.asarray(rng.standard_normal((A.shape[1], 64)), jnp.float32)
  f = jax.jit(lambda A, x: jst.spmm(A, x, precision="highest"))
  a = np.asarray(f(_on(_gpu(), A), _on(_gpu(), x)))
  b = np.asarray(f(_on(_gpu(), A), _on(_gpu(), x)))
  assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("kernel", ["auto", "rows", "windows"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("kind", ["random", "heavy"])
def test_spmm_kernel_families(rng, kind, dt, kernel):
  """Every kernel family computes the same function: d of every row-kernel group width (2, 4,
  8, 16, 32 lanes); on the window side the pipelined kernel (16-byte rows) and the
  register-gather one (rows not a multiple of 16 bytes: d = 5, 12, 20, 36 in fp16), every slab
  width of both."""
  opts = jst.KernelOptions(spmm=kernel)
  dtype, precision, tol = DTYPES[dt]
  A, empty = _matrix(rng, kind)
  A = A.astype(dtype)
  f = jax.jit(lambda A, x: jst.spmm(A, x, options=opts))
  # fp16 d = 20, 36 and fp32 d = 17, 33: the register-gather kernel's 2- and 4-tile slabs
  for d in (64, 128, 40, 16, 12, 5, 20, 36, 17, 33):
    x = jnp.asarray(rng.standard_normal((A.shape[1], d)), dtype)
    out = f(_on(_gpu(), A), _on(_gpu(), x))
    ref = _dense64(A, dtype) @ np.asarray(x, np.float64)
    assert rel_err(out, ref) < tol
    np.testing.assert_array_equal(np.asarray(out, np.float64)[empty], 0.0)


CUDA_CORE = jst.KernelOptions(spmm="rows")


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("kind", ["random", "heavy", "cora", "large"])
def test_spmm_cuda_core(rng, kind, dt, d):
  """The CUDA-core kernel family: every dtype (fp32 exact whatever the precision), every d
  (lane groups for d <= 64, several slabs for d > 128, scalar tails), split windows (heavy),
  whole rows and CTA items of up to 64 entries as streams (large), empty rows and windows
  written as zeros."""
  dtype, precision, tol = DTYPES[dt]
  if dtype == jnp.float32:
    tol = 1e-5  # no tf32 on this path
  A, empty = _matrix(rng, kind)
  A = A.astype(dtype)
  x = rng.standard_normal((A.shape[1], d)).astype(np.float32)
  xj = jnp.asarray(x, dtype)
  f = jax.jit(lambda A, x: jst.spmm(A, x, precision=precision, options=CUDA_CORE))
  out = f(_on(_gpu(), A), _on(_gpu(), xj))
  assert out.dtype == dtype and out.shape == (A.shape[0], d)
  cpu_out = f(_on(_cpu(), A), _on(_cpu(), xj))
  ref = _dense64(A, dtype) @ np.asarray(xj, np.float64)
  _check(out, ref, cpu_out, tol, f"spmm rows {kind} {dt} d={d}")
  np.testing.assert_array_equal(np.asarray(out, np.float64)[empty], 0.0)


@pytest.mark.parametrize("d", [8, 24, 33, 256])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["random", "heavy"])
def test_spmm_cuda_core_heads(rng, kind, dt, d):
  """CUDA-core kernels with heads: H x H, H x 1 and 1 x H (values x dense), split windows."""
  dtype, _, tol = DTYPES[dt]
  if dtype == jnp.float32:
    tol = 1e-5
  H = 3
  A, empty = _matrix(rng, kind, heads=H)
  A = A.astype(dtype)
  n = A.shape[1]
  a64 = _dense64(A, dtype)
  gpu = _gpu()
  Ag = _on(gpu, A)
  spmm = jax.jit(lambda A, x: jst.spmm(A, x, options=CUDA_CORE))
  for A_, x_, ref in _head_cases(rng, Ag, a64, n, d, dtype):
    out = spmm(A_, _on(gpu, x_))
    assert out.shape == ref.shape
    assert rel_err(out, ref) < tol, f"{kind} {dt} d={d}: {rel_err(out, ref):.3g}"
    np.testing.assert_array_equal(np.asarray(out, np.float64)[:, empty], 0.0)


def test_spmm_cuda_core_many_heads_split(rng):
  """Split windows with several heads, d not a multiple of 4 (scalar tails), CUDA cores."""
  A, empty = _matrix(rng, "heavy", heads=5)
  for d, dtype, tol in ((33, jnp.float16, 1e-2), (130, jnp.bfloat16, 1e-2), (7, jnp.float32, 1e-5)):
    x = jnp.asarray(rng.standard_normal((5, A.shape[1], d)), dtype)
    Ad = A.astype(dtype)
    out = jax.jit(lambda A, x: jst.spmm(A, x, options=CUDA_CORE))(_on(_gpu(), Ad), _on(_gpu(), x))
    ref = np.einsum("hmn,hnd->hmd", _dense64(A, dtype), np.asarray(x, np.float64))
    assert rel_err(out, ref) < tol
    np.testing.assert_array_equal(np.asarray(out, np.float64)[:, empty], 0.0)


@pytest.mark.parametrize("d", DS + [320])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("kind", ["random", "heavy", "cora", "medium", "large"])
def test_sddmm_cuda_core(rng, kind, dt, d):
  """The row-view SDDMM kernels (lane groups for small d, two slabs past 32 lanes, scalar
  tails, long rows as CTA items, the heavy rows as several; on the large graph whole rows and
  CTA items of up to 64 entries as streams of 4 rows per group), every dtype (fp32 exact) and
  heads x 1 / 1 x heads."""
  dtype, precision, tol = DTYPES[dt]
  if dtype == jnp.float32:
    tol = 1e-5  # no tf32 on this path
    if d == 320:
      d = 256  # the row kernels' width limit for fp32 is 256
  A, _ = _matrix(rng, kind)
  m, n = A.shape
  x = jnp.asarray(rng.standard_normal((2, m, d)), dtype)
  y = jnp.asarray(rng.standard_normal((n, d)), dtype)
  opts = jst.KernelOptions(sddmm="rows")
  f = jax.jit(lambda A, x, y: jst.sddmm(A, x, y, precision=precision, options=opts).values)
  out = f(*_on(_gpu(), (A, x, y)))
  assert out.dtype == dtype and out.shape == (2, A.nnz)
  cpu_out = f(*_on(_cpu(), (A, x, y)))
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.einsum("hkd,kd->hk", np.asarray(x, np.float64)[:, r], np.asarray(y, np.float64)[c])
  _check(out, ref, cpu_out, tol, f"sddmm rows {kind} {dt} d={d}")


def test_sddmm_cuda_core_too_wide_is_an_error(rng):
  """Forcing the row kernels past their width fails loudly; unforced, the launch falls back."""
  A, _ = _matrix(rng, "random")
  x = jnp.asarray(rng.standard_normal((A.shape[0], 300)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((A.shape[1], 300)), jnp.float32)
  f = jax.jit(lambda A, x, y: jst.sddmm(A, x, y, precision="highest").values)
  ref = np.einsum(
    "kd,kd->k",
    np.asarray(x, np.float64)[np.asarray(A.rows)],
    np.asarray(y, np.float64)[np.asarray(A.cols)],
  )
  assert rel_err(f(*_on(_gpu(), (A, x, y))), ref) < 1e-5
  opts = jst.KernelOptions(sddmm="rows")
  with pytest.raises(Exception, match="width"):
    jax.block_until_ready(
      jax.jit(lambda A, x, y: jst.sddmm(A, x, y, options=opts).values)(*_on(_gpu(), (A, x, y)))
    )


@pytest.mark.parametrize("variant", ["windows", "rows"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_sddmm_variants_agree(rng, variant, dt):
  """Both SDDMM kernel families compute the same function (the default picks one of them)."""
  opts = jst.KernelOptions(sddmm=variant)
  dtype, _, tol = DTYPES[dt]
  A, _ = _matrix(rng, "heavy")
  m, n = A.shape
  x = jnp.asarray(rng.standard_normal((m, 64)), dtype)
  y = jnp.asarray(rng.standard_normal((n, 64)), dtype)
  out = jax.jit(lambda A, x, y: jst.sddmm(A, x, y, options=opts).values)(*_on(_gpu(), (A, x, y)))
  ref = np.einsum(
    "kd,kd->k",
    np.asarray(x, np.float64)[np.asarray(A.rows)],
    np.asarray(y, np.float64)[np.asarray(A.cols)],
  )
  assert rel_err(out, ref) < tol


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("kind", ["random", "heavy"])
def test_sddmm_float32_out(rng, kind, dt):
  """16-bit operands with float32 values out (the attention backward's logits): GPU = CPU
  kernel = float64 up to summation order."""
  dtype = DTYPES[dt][0]
  A, _ = _matrix(rng, kind)
  m, n = A.shape
  x = jnp.asarray(rng.standard_normal((2, m, 64)) * 30, dtype)
  y = jnp.asarray(rng.standard_normal((2, n, 64)) * 30, dtype)
  f = jax.jit(lambda x, y, A: jst.sddmm(A, x, y, preferred_element_type=jnp.float32).values)
  out = f(*_on(_gpu(), (x, y, A)))
  assert out.dtype == jnp.float32 and list(out.devices())[0].platform == "gpu"
  cpu_out = f(*_on(_cpu(), (x, y, A)))
  full = np.einsum("hmd,hnd->hmn", np.asarray(x, np.float64), np.asarray(y, np.float64))
  ref = full[:, np.asarray(A.rows), np.asarray(A.cols)]
  _check(out, ref, cpu_out, 1e-5, f"sddmm float32_out {kind} {dt}")


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("kind", ["random", "heavy"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("d", [1, 17, 64, 128])
def test_spmm_extremum_matches_the_cpu_kernel(rng, reduce, kind, dt, d):
  """spmm(A, X, reduce=...) on the GPU gives the CPU kernel's outputs (products in float32 on
  both; ties are unlikely with random values) and its gradients (which follow the winners)."""
  dtype = DTYPES[dt][0]
  rows, cols, shape, _ = _pattern(rng, kind)
  vals = rng.standard_normal(rows.size).astype(np.float32)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=shape).astype(dtype)
  x = rng.standard_normal((shape[1], d)).astype(np.float32)
  f = lambda v, x: jst.spmm(A.with_values(v), x, reduce=reduce)
  loss = lambda v, x: jnp.sum(f(v, x).astype(jnp.float32) ** 2)
  outs = {}
  for name, dev in (("gpu", _gpu()), ("cpu", _cpu())):
    v_d = jax.device_put(A.values, dev)
    x_d = jax.device_put(jnp.asarray(x, dtype), dev)
    outs[name] = (jax.jit(f)(v_d, x_d), *jax.jit(jax.grad(loss, argnums=(0, 1)))(v_d, x_d))
  np.testing.assert_array_equal(
    np.asarray(outs["gpu"][0], np.float32), np.asarray(outs["cpu"][0], np.float32)
  )
  # the gradients scatter-add contributions, in another order on each platform
  tol = 1e-5 if dt == "f32" else 1e-2
  for got, want in zip(outs["gpu"][1:], outs["cpu"][1:]):
    assert rel_err(got, want) < tol
