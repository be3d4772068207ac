"""The kernel selector asked from Python (jst.kernel_plan), on any machine: its features against a
numpy recomputation, today's rules (block fill, exact float32, row widths, the attention
backward's), forced options, and agreement with what the CUDA lowering and the attention
dispatch do. Then, on a GPU only, the operators with default options on the same matrices
against float64 references."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import rel_err
from test_gpu_attention import _edge_attention_ref

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix
from jaxsparse_tc._src.extensions import cuda_built
from jaxsparse_tc._src.pattern import SMALL_GRAPH_NNZ

KINDS = ["empty", "tiny", "hub", "block_dense", "rmat"]
FAMILIES = {"rows", "windows"}


def _rmat(rng, scale: int, edges: int, probs=(0.57, 0.19, 0.19, 0.05)):
  """R-MAT edges on 2^scale nodes (Graph500's probabilities): skewed degrees, sparse blocks."""
  r = np.zeros(edges, np.int64)
  c = np.zeros(edges, np.int64)
  for _ in range(scale):
    quadrant = rng.choice(4, size=edges, p=probs)
    r = 2 * r + (quadrant >= 2)
    c = 2 * c + (quadrant % 2)
  return r, c, (1 << scale, 1 << scale)


def _coo(rng, kind):
  """(rows, cols, shape) of a named test matrix."""
  if kind == "empty":
    return np.zeros(0, np.int64), np.zeros(0, np.int64), (40, 30)
  if kind == "tiny":
    return np.array([0, 0, 1, 2, 2]), np.array([0, 2, 1, 0, 2]), (3, 3)
  if kind == "hub":  # row 7 holds every column; the rest sparse
    m, n = 300, 5000
    rest = sp.random(m, n, density=0.003, random_state=rng, format="coo")
    keep = rest.row != 7
    rows = np.concatenate([np.full(n, 7), rest.row[keep]])
    cols = np.concatenate([np.arange(n), rest.col[keep]])
    return rows, cols, (m, n)
  if kind == "block_dense":  # dense 64 x 64 blocks on the diagonal
    b, count = 64, 8
    i, j = np.meshgrid(np.arange(b), np.arange(b), indexing="ij")
    rows = np.concatenate([k * b + i.ravel() for k in range(count)])
    cols = np.concatenate([k * b + j.ravel() for k in range(count)])
    return rows, cols, (b * count, b * count)
  if kind == "rmat":  # past SMALL_GRAPH_NNZ once duplicates are merged
    return _rmat(rng, 13, 12 << 13)
  raise ValueError(kind)


def _matrix(rng, kind):
  rows, cols, shape = _coo(rng, kind)
  vals = rng.uniform(-1, 1, rows.size).astype(np.float32)
  return SparseMatrix.from_coo(rows, cols, vals, shape=shape)


def _features_ref(rows, cols, shape):
  """The selector's features recomputed from COO indices with numpy (docs/FORMAT.md)."""
  m, n = shape
  key = np.unique(np.asarray(rows, np.int64) * n + cols)
  r, c = key // max(n, 1), key % max(n, 1)
  windows = -(-m // 8)
  window_col = np.unique((r // 8) * n + c)  # distinct (window, column) pairs
  per_window = np.bincount(window_col // max(n, 1), minlength=windows)
  blocks = int(np.sum(-(-per_window // 8)))
  nnz, cols_total = key.size, window_col.size
  ratio = lambda a, b: a / b if b else 0.0
  return jst.PatternFeatures(
    rows=m,
    nnz=nnz,
    windows=windows,
    blocks=blocks,
    condensed_cols=cols_total,
    nnz_per_block=ratio(nnz, blocks),
    cols_per_window=ratio(cols_total, windows),
    mean_row_length=ratio(nnz, m),
  )


@pytest.fixture(scope="module")
def matrices():
  """Each kind's matrix and its COO, built once per module with a fixed seed (the rmat one takes
  a moment, and the rules' expectations hold for it)."""
  rng = np.random.default_rng(0)
  out = {}
  for kind in KINDS:
    rows, cols, shape = _coo(rng, kind)
    vals = rng.uniform(-1, 1, rows.size).astype(np.float32)
    out[kind] = (SparseMatrix.from_coo(rows, cols, vals, shape=shape), (rows, cols, shape))
  return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,d", [(jnp.float16, 64), (jnp.bfloat16, 128), (jnp.float32, 17)])
def test_kernel_plan_features_and_families(matrices, kind, dtype, d):
  A, coo = matrices[kind]
  plan = jst.kernel_plan(A, d, dtype)
  assert isinstance(plan, jst.KernelPlan)
  assert plan.spmm in FAMILIES and plan.sddmm in FAMILIES
  assert plan.attention_backward in ("fused", "composed")
  ref = _features_ref(*coo)
  assert plan.features[:5] == ref[:5]
  np.testing.assert_allclose(plan.features[5:], ref[5:], rtol=1e-12)
  with pytest.raises(AttributeError):
    plan.spmm = "windows"  # frozen


def _rule(f, d, esize):
  """csrc/plan/select.h's rules, restated: (spmm, sddmm) prefer tensor cores."""
  reuse = f.nnz / f.condensed_cols if f.condensed_cols else 0.0
  mean_row = f.nnz / f.rows if f.rows else 0.0
  rb = d * esize
  large = f.nnz >= 2**20
  if reuse >= 6:
    spmm = True
  elif f.nnz < 2**18:
    spmm = False
  elif esize == 2:
    spmm = reuse >= 4 or (reuse >= 3 and rb >= 128)
  else:
    spmm = reuse >= 3.5
  if esize == 2 and reuse >= 2.5:
    sddmm = True
  elif reuse >= 6 or (large and reuse >= 3):
    sddmm = esize == 2 or rb <= 512
  elif f.nnz < 2**17:
    sddmm = rb <= 64
  elif esize == 2 and f.nnz >= 2**19 and reuse >= 2 and rb >= 256:
    sddmm = True
  elif mean_row >= 12 and f.nnz < 2**22:
    sddmm = rb <= 64 or (reuse >= 1.8 and (esize == 2 or rb <= 128))
  else:
    sddmm = False
  return spmm, sddmm


@pytest.mark.parametrize("kind", KINDS)
def test_selector_rule(matrices, kind):
  """kernel_plan answers with the selector's rules (csrc/plan/select.h)."""
  A, _ = matrices[kind]
  for dtype, esize in ((jnp.float16, 2), (jnp.float32, 4)):
    for d in (8, 32, 64, 128, 256):
      plan = jst.kernel_plan(A, d, dtype)
      spmm, sddmm = _rule(plan.features, d, esize)
      want = lambda tc: "windows" if tc else "rows"  # noqa: E731
      assert (plan.spmm, plan.sddmm) == (want(spmm), want(sddmm)), (kind, dtype, d)


def test_block_dense_takes_tensor_cores_and_rmat_the_row_kernels(matrices):
  dense, rmat = matrices["block_dense"][0], matrices["rmat"][0]
  assert jst.kernel_plan(dense, 64).features.nnz_per_block == 64
  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    for d in (64, 128):
      plan = jst.kernel_plan(dense, d, dtype)
      assert (plan.spmm, plan.sddmm) == ("windows", "windows"), (dtype, d)
    # block-dense (reuse 8): the SpMM's tensor cores at any width, even 64-byte rows of a small
    # graph
    assert jst.kernel_plan(dense, 64 // jnp.dtype(dtype).itemsize, dtype).spmm == "windows"
  for dtype in (jnp.float16, jnp.float32):
    for d in (32, 64, 128, 256):
      assert jst.kernel_plan(rmat, d, dtype).spmm == "rows", (dtype, d)
  # A small graph's SDDMM: tensor cores for 64-byte rows, the row kernels for wider ones.
  assert rmat.nnz < 2**17
  assert jst.kernel_plan(rmat, 32, jnp.float16).sddmm == "windows"
  assert jst.kernel_plan(rmat, 64, jnp.float16).sddmm == "rows"
  assert jst.kernel_plan(rmat, 16, jnp.float32).sddmm == "windows"
  assert jst.kernel_plan(rmat, 32, jnp.float32).sddmm == "rows"
  assert jst.kernel_plan(rmat, 64).features.nnz_per_block < 16


def _window_shared(rng, m, ncols):
  """m rows of 5 nonzeros, each 8-row window's rows drawing from `ncols` columns of its own
  (short rows whose windows share columns, as DD's in affinity order)."""
  cols_of_window = rng.integers(0, m, size=(m // 8, ncols))
  pick = rng.integers(0, ncols, size=(m, 5))
  rows = np.repeat(np.arange(m), 5)
  cols = cols_of_window[np.arange(m)[:, None] // 8, pick].ravel()
  return SparseMatrix.from_coo(rows, cols, shape=(m, m))


def test_large_short_row_graph_with_reuse():
  """Short rows (5 per row) whose windows share columns. The measured DD case (2^19 to 2^20
  nonzeros, reuse 2.3 in affinity order): the SpMM's row kernels at any reuse below 6, the
  SDDMM's tensor cores for 16-bit rows of 256 bytes and more from reuse 2. Past 2^20 nonzeros at
  reuse 3-3.5: the SpMM's tensor cores for 16-bit rows of 128 bytes and more, the SDDMM's for
  16-bit rows and float32 rows of up to 512 bytes."""
  rng = np.random.default_rng(5)
  for ncols, reuse_lo, reuse_hi, tc in ((28, 1.6, 1.8, "rows"), (20, 2.0, 2.5, "windows")):
    A = _window_shared(rng, 2**17, ncols)
    f = jst.kernel_plan(A, 128).features
    assert 2**19 <= f.nnz < 2**20 and f.mean_row_length <= 8, f
    assert reuse_lo <= f.nnz / f.condensed_cols < reuse_hi, f
    for d, dtype, want in (
      (128, jnp.float16, ("rows", tc)),
      (256, jnp.bfloat16, ("rows", tc)),
      (64, jnp.float16, ("rows", "rows")),
      (128, jnp.float32, ("rows", "rows")),
      (32, jnp.float16, ("rows", "rows")),
    ):
      plan = jst.kernel_plan(A, d, dtype)
      assert (plan.spmm, plan.sddmm) == want, (ncols, d, dtype)
  L = _window_shared(rng, 2**18, 10)
  f = jst.kernel_plan(L, 128).features
  assert f.nnz >= 2**20 and 3 <= f.nnz / f.condensed_cols < 3.5, f
  for d, dtype, want in (
    (64, jnp.float16, ("windows", "windows")),
    (128, jnp.bfloat16, ("windows", "windows")),
    (32, jnp.float16, ("rows", "windows")),
    (128, jnp.float32, ("rows", "windows")),
    (256, jnp.float32, ("rows", "rows")),
  ):
    plan = jst.kernel_plan(L, d, dtype)
    assert (plan.spmm, plan.sddmm) == want, (d, dtype)


def _communities(rng, m=2**16, size=64, degree=8):
  """COO of m nodes in communities of `size` consecutive ids, each node joined to `degree`
  random members of its own (benchmarks.common.communities without the far edges), symmetric."""
  src = np.repeat(np.arange(m), degree)
  dst = (src // size) * size + rng.integers(0, size, src.size)
  return np.concatenate([src, dst]), np.concatenate([dst, src]), (m, m)


def test_graphs_of_communities():
  """Communities of consecutive ids. At reuse ~2 (communities of 64, ~14 per row, under 2^20
  nonzeros) the SpMM's row kernels, the SDDMM's tensor cores for 16-bit rows and float32 rows of
  up to 128 bytes (long rows from reuse 1.8). At reuse ~5 (64 draws per row, 40 once merged): from
  2^18 nonzeros (the SpMM's kSpmmWindowNnz) tensor cores for both at any width and dtype; under it
  (the 200k-edge dense communities' case, imdb-multi) the SpMM's row kernels, the SDDMM's 16-bit
  tensor cores. The
  first graph with its node ids permuted (no reuse) keeps the SpMM row kernels."""
  rng = np.random.default_rng(7)
  rows, cols, (m, _) = _communities(rng)
  A = SparseMatrix.from_coo(rows, cols, shape=(m, m))
  f = jst.kernel_plan(A, 128).features
  assert f.nnz < 2**20 and f.mean_row_length >= 12 and 2 <= f.nnz / f.condensed_cols < 2.5, f
  for dtype in (jnp.float16, jnp.float32):
    for d in (32, 64, 128, 256):
      assert jst.kernel_plan(A, d, dtype).spmm == "rows", (dtype, d)
  assert jst.kernel_plan(A, 128, jnp.float16).sddmm == "windows"
  assert jst.kernel_plan(A, 32, jnp.float32).sddmm == "windows"
  assert jst.kernel_plan(A, 64, jnp.float32).sddmm == "rows"
  for m_d, spmm in ((2**14, "windows"), (2**12, "rows")):
    rows_d, cols_d, _ = _communities(rng, m=m_d, degree=32)
    D = SparseMatrix.from_coo(rows_d, cols_d, shape=(m_d, m_d))
    g = jst.kernel_plan(D, 128).features
    assert (g.nnz >= 2**18) == (spmm == "windows") and 4 <= g.nnz / g.condensed_cols < 6, g
    for dtype in (jnp.float16, jnp.float32):
      for d in (32, 128):
        plan = jst.kernel_plan(D, d, dtype)
        assert plan.spmm == spmm, (m_d, dtype, d)
    assert jst.kernel_plan(D, 128, jnp.float16).sddmm == "windows"
  perm = rng.permutation(m)
  B = SparseMatrix.from_coo(perm[rows], perm[cols], shape=(m, m))
  h = jst.kernel_plan(B, 128).features
  assert h.nnz == f.nnz and h.nnz / h.condensed_cols < 1.1, h
  for dtype in (jnp.float16, jnp.float32):
    assert jst.kernel_plan(B, 128, dtype).spmm == "rows", dtype


def test_exact_float32_takes_the_row_kernels(matrices):
  dense = matrices["block_dense"][0]
  for precision in ("highest", jax.lax.Precision.HIGHEST):
    plan = jst.kernel_plan(dense, 64, jnp.float32, precision=precision)
    assert (plan.spmm, plan.sddmm) == ("rows", "rows")
  plan = jst.kernel_plan(dense, 64, jnp.float32, precision="high")  # tf32
  assert (plan.spmm, plan.sddmm) == ("windows", "windows")


def test_sddmm_row_kernels_need_narrow_rows(matrices):
  """The SDDMM row kernels hold a row of X in registers: up to 1024 bytes."""
  rmat = matrices["rmat"][0]
  assert jst.kernel_plan(rmat, 512, jnp.float16).sddmm == "rows"
  assert jst.kernel_plan(rmat, 520, jnp.float16).sddmm == "windows"
  assert jst.kernel_plan(rmat, 520, jnp.float32, precision="highest").sddmm == "windows"
  with pytest.raises(ValueError, match="1024 bytes"):
    jst.kernel_plan(rmat, 520, jnp.float16, options=jst.KernelOptions(sddmm="rows"))


def test_spmm_row_workspace_cap():
  """A row cut into many CTA items needs a workspace slot per extra item and head; past the
  cap (256 MB) auto takes the window kernels and a forced rows fails."""
  n = 200_000
  A = SparseMatrix.from_coo(np.zeros(n, np.int64), np.arange(n), shape=(8, n))
  assert jst.kernel_plan(A, 64, jnp.float16).spmm == "rows"
  assert jst.kernel_plan(A, 64, jnp.float16, heads=64).spmm == "rows"
  assert jst.kernel_plan(A, 1024, jnp.float16, heads=512).spmm == "windows"
  with pytest.raises(ValueError, match="workspace"):
    jst.kernel_plan(A, 1024, jnp.float16, heads=512, options=jst.KernelOptions(spmm="rows"))


def test_attention_backward_rule(matrices):
  """Fused where its kernels take the operands (16-bit, d in {32, 64, 128}) and d <= 64, the
  graph is small or its blocks are full enough; composed otherwise."""
  rmat, dense = matrices["rmat"][0], matrices["block_dense"][0]
  assert rmat.nnz >= SMALL_GRAPH_NNZ > dense.nnz
  for dtype in (jnp.float16, jnp.bfloat16):
    assert jst.kernel_plan(rmat, 32, dtype).attention_backward == "fused"
    assert jst.kernel_plan(rmat, 64, dtype).attention_backward == "fused"
    assert jst.kernel_plan(rmat, 128, dtype).attention_backward == "composed"
    assert jst.kernel_plan(dense, 128, dtype).attention_backward == "fused"
    assert jst.kernel_plan(dense, 96, dtype).attention_backward == "composed"
  assert jst.kernel_plan(dense, 64, jnp.float32).attention_backward == "composed"
  # d = 128 past SMALL_GRAPH_NNZ: fused where blocks hold >= 14.5 of their 64 entries, at any
  # size (imdb's 200k nonzeros as the 8M-edge stand-in's)
  rows, cols = np.divmod(np.arange(2**18), 2**9)  # 2^9 x 2^9 dense: 2^18 nonzeros
  dense_big = SparseMatrix.from_coo(rows, cols, shape=(2**9, 2**9))
  assert jst.kernel_plan(dense_big, 128, jnp.float16).attention_backward == "fused"
  rows_c, cols_c, shape_c = _communities(np.random.default_rng(3), m=2**12, degree=32)
  comm = SparseMatrix.from_coo(rows_c, cols_c, shape=shape_c)
  f = jst.kernel_plan(comm, 128, jnp.float16).features
  assert SMALL_GRAPH_NNZ <= f.nnz < 2**18 and f.nnz_per_block >= 14.5, f
  assert jst.kernel_plan(comm, 128, jnp.float16).attention_backward == "fused"
  assert jst.kernel_plan(rmat, 128).features.nnz_per_block < 14.5


@pytest.mark.parametrize("kind", KINDS)
def test_forced_options_are_obeyed(matrices, kind):
  A, _ = matrices[kind]
  for family in ("rows", "windows"):
    opts = jst.KernelOptions(spmm=family, sddmm=family)
    for dtype, precision in ((jnp.float16, None), (jnp.float32, "highest")):
      plan = jst.kernel_plan(A, 64, dtype, precision=precision, options=opts)
      assert (plan.spmm, plan.sddmm) == (family, family)
  for backward in ("fused", "composed"):
    opts = jst.KernelOptions(attention_backward=backward)
    for d in (32, 64, 128):
      assert jst.kernel_plan(A, d, jnp.float16, options=opts).attention_backward == backward
    # Where the tensor-core kernels do not take the operands, the composed backward runs.
    assert jst.kernel_plan(A, 64, jnp.float32, options=opts).attention_backward == "composed"
    assert jst.kernel_plan(A, 48, jnp.float16, options=opts).attention_backward == "composed"
  auto = jst.kernel_plan(A, 64, options=jst.KernelOptions())
  assert auto == jst.kernel_plan(A, 64)


SPMM_KERNELS = {"rows": {"rows"}, "windows": {"windows_async", "windows_registers", "exact_f32"}}
SDDMM_KERNELS = {"rows": {"rows"}, "windows": {"windows", "exact_f32"}}


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_plan_names_the_launched_kernel(matrices, kind):
  """spmm_kernel / sddmm_kernel are kernels of the plan's family, chosen as spmm/plan.h and
  sddmm/plan.h choose: exact float32's window kernel, cp.async gathers on sm_90 for 16-byte rows
  of X, register gathers elsewhere."""
  A, _ = matrices[kind]
  for family in ("auto", "rows", "windows"):
    opts = jst.KernelOptions(spmm=family, sddmm=family)
    for dtype, precision in ((jnp.float16, None), (jnp.float32, None), (jnp.float32, "highest")):
      exact = precision == "highest"
      esize = jnp.dtype(dtype).itemsize
      for d in (4, 8, 12, 32, 64, 128):
        for arch in (80, 90):
          plan = jst.kernel_plan(A, d, dtype, precision=precision, options=opts, arch=arch)
          where = (kind, family, dtype, precision, d, arch)
          assert plan.spmm_kernel in SPMM_KERNELS[plan.spmm], where
          assert plan.sddmm_kernel in SDDMM_KERNELS[plan.sddmm], where
          if plan.spmm == "windows":
            async_ok = arch >= 90 and (d * esize) % 16 == 0
            want = "exact_f32" if exact else "windows_async" if async_ok else "windows_registers"
            assert plan.spmm_kernel == want, where
          if plan.sddmm == "windows":
            assert plan.sddmm_kernel == ("exact_f32" if exact else "windows"), where
          # The kernel, unlike the family, depends on the device only for the SpMM windows.
          assert plan[:4] == jst.kernel_plan(A, d, dtype, precision=precision, options=opts)[:4]


def test_old_kernel_family_names_say_what_they_became():
  for field in ("spmm", "sddmm"):
    for old, new in (("cuda_core", "rows"), ("tensor_core", "windows")):
      with pytest.raises(ValueError, match=f"'{old}' is now called '{new}'"):
        jst.KernelOptions(**{field: old})
  with pytest.raises(ValueError, match="must be one of"):
    jst.KernelOptions(attention_backward="tensor_core")
  with pytest.raises(ValueError, match="must be one of"):
    jst.KernelOptions(spmm="row")


def test_kernel_plan_errors(matrices):
  A = matrices["tiny"][0]
  with pytest.raises(TypeError, match="SparseMatrix"):
    jst.kernel_plan(np.eye(3), 8)
  with pytest.raises(ValueError, match="dtype"):
    jst.kernel_plan(A, 8, jnp.int32)
  with pytest.raises(ValueError, match="d must be"):
    jst.kernel_plan(A, -1)
  with pytest.raises(TypeError, match="KernelOptions"):
    jst.kernel_plan(A, 8, options="windows")
  for arch in (9.0, "sm_90", True, 0):
    with pytest.raises(ValueError, match="arch must be"):
      jst.kernel_plan(A, 8, arch=arch)


def test_kernel_plan_of_heads_and_reordered_matrices(rng):
  rows, cols, shape = _coo(rng, "hub")
  vals = rng.uniform(-1, 1, (3, rows.size)).astype(np.float32)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=shape)
  assert jst.kernel_plan(A, 64).features == jst.kernel_plan(A.with_values(A.values[0]), 64).features
  B = SparseMatrix.from_scipy(sp.random(200, 200, density=0.05, random_state=rng, format="csr"))
  R = jst.reorder(B, "degree").wrap(B)
  assert jst.kernel_plan(R, 32).features.nnz == B.nnz


# -- agreement with the CUDA lowering and the attention dispatch (CUDA extension, no GPU) --------
needs_cuda_build = pytest.mark.skipif(not cuda_built(), reason="CUDA extension not built")


def _spmm_workspace(A, x, precision, options):
  """The workspace result's type of the custom call jst.spmm lowers to on CUDA."""
  fn = lambda A, x: jst.spmm(A, x, precision=precision, options=options)
  text = jax.jit(fn).trace(A, x).lower(lowering_platforms=("cuda",)).as_text()
  (call,) = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
  return re.findall(r"tensor<([^>]*)>", call.rsplit("->", 1)[1])[1]


@needs_cuda_build
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,precision", [(jnp.float16, None), (jnp.float32, "highest")])
def test_spmm_lowering_plans_the_selected_family(matrices, kind, dtype, precision):
  """The handler's plan (through the workspace Python asks it for) is kernel_plan's family: the
  auto lowering's workspace is that of the forced family, and differs from the other's where
  the two families' workspaces differ."""
  A, _ = matrices[kind]
  A = A.with_values(A.values.astype(dtype))
  x = jnp.ones((A.shape[1], 64), dtype)
  family = jst.kernel_plan(A, 64, dtype, precision=precision).spmm
  other = ({"rows", "windows"} - {family}).pop()
  ws = lambda spmm: _spmm_workspace(A, x, precision, spmm and jst.KernelOptions(spmm=spmm))
  auto, chosen, rest = ws(None), ws(family), ws(other)
  assert auto == chosen
  if kind in ("block_dense", "rmat"):
    assert chosen != rest


def _has_attention_grads(A, d, dtype):
  from jaxsparse_tc._src.primitives import attention_grads_p

  m, n = A.shape
  q = jnp.zeros((m, d), dtype)
  kv = jnp.zeros((n, d), dtype)
  loss = lambda q: jnp.sum(jst.sparse_attention(A, q, kv, kv).astype(jnp.float32))
  jaxpr = jax.make_jaxpr(jax.grad(loss))(q)

  def eqns(j):
    for e in j.eqns:
      yield e
      for p in e.params.values():
        sub = getattr(p, "jaxpr", p)
        if hasattr(sub, "eqns"):
          yield from eqns(sub)

  return any(e.primitive is attention_grads_p for e in eqns(jaxpr.jaxpr))


@needs_cuda_build
@pytest.mark.parametrize("kind", ["tiny", "block_dense", "rmat"])
@pytest.mark.parametrize("d", [64, 128])
def test_attention_dispatch_follows_the_selector(matrices, kind, d):
  A, _ = matrices[kind]
  plan = jst.kernel_plan(A, d, jnp.float16)
  assert _has_attention_grads(A, d, jnp.float16) == (plan.attention_backward == "fused")
  if kind == "rmat":  # the test has teeth: both choices are made
    assert plan.attention_backward == ("fused" if d == 64 else "composed")


# -- the operators on a GPU, default options, against float64 -----------------------------------
def _has_gpu() -> bool:
  try:
    return any(dev.platform == "gpu" for dev in jax.devices())
  except RuntimeError:
    return False


gpu_only = pytest.mark.skipif(
  not (jst.has_cuda() and _has_gpu()), reason="needs a CUDA GPU and the CUDA extension"
)

# (dtype, precision, tolerance on ||out - ref|| / ||ref||), as in test_gpu_spmm_sddmm.py
DTYPES = {
  "f32": (jnp.float32, None, 1e-3),
  "f32-highest": (jnp.float32, "highest", 1e-5),
  "f16": (jnp.float16, None, 1e-2),
  "bf16": (jnp.bfloat16, None, 1e-2),
}


def _gpu(tree):
  return jax.device_put(tree, next(dev for dev in jax.devices() if dev.platform == "gpu"))


def _csr64(A, dtype):
  """A's values in `dtype` (the dtype the tests give both operands), as a float64 scipy
  matrix."""
  v = np.asarray(A.values.astype(dtype), np.float64)
  return sp.csr_matrix((v, (np.asarray(A.rows), np.asarray(A.cols))), shape=A.shape)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("d", [32, 128])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_spmm_and_sddmm_default_options(rng, kind, dt, d):
  dtype, precision, tol = DTYPES[dt]
  A = _matrix(rng, kind).astype(dtype)  # values in X's dtype: that dtype's kernels run
  m, n = A.shape
  x = jnp.asarray(rng.standard_normal((n, d)), dtype)
  out = jax.jit(lambda A, x: jst.spmm(A, x, precision=precision))(_gpu(A), _gpu(x))
  assert list(out.devices())[0].platform == "gpu"
  out = np.asarray(out, np.float64)
  assert np.all(np.isfinite(out))
  ref = _csr64(A, dtype) @ np.asarray(x, np.float64)
  assert rel_err(out, ref) < tol, f"spmm {kind} {dt} d={d}"

  xs = jnp.asarray(rng.standard_normal((m, d)), dtype)
  ys = jnp.asarray(rng.standard_normal((n, d)), dtype)
  f = jax.jit(lambda A, x, y: jst.sddmm(A, x, y, precision=precision).values)
  got = np.asarray(f(_gpu(A), _gpu(xs), _gpu(ys)), np.float64)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  x64, y64 = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
  ref = np.einsum("ed,ed->e", x64[r], y64[c])
  assert rel_err(got, ref) < tol, f"sddmm {kind} {dt} d={d}"


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_gpu_dense_communities_default_options(rng, dt):
  """A large graph of dense communities (reuse ~5, past 2^20 nonzeros), where auto takes both
  tensor-core kernels (checked), against float64."""
  dtype, precision, tol = DTYPES[dt]
  rows, cols, shape = _communities(rng, m=2**15, degree=32)
  vals = rng.uniform(-1, 1, rows.size).astype(np.float32)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=shape).astype(dtype)
  plan = jst.kernel_plan(A, 128, dtype, precision=precision)
  assert (plan.spmm, plan.sddmm) == ("windows", "windows")
  x = jnp.asarray(rng.standard_normal((shape[1], 128)), dtype)
  out = np.asarray(jax.jit(lambda A, x: jst.spmm(A, x, precision=precision))(_gpu(A), _gpu(x)))
  assert np.all(np.isfinite(out))
  assert rel_err(out, _csr64(A, dtype) @ np.asarray(x, np.float64)) < tol
  y = jnp.asarray(rng.standard_normal((shape[0], 128)), dtype)
  f = jax.jit(lambda A, y, x: jst.sddmm(A, y, x, precision=precision).values)
  got = np.asarray(f(_gpu(A), _gpu(y), _gpu(x)), np.float64)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.einsum("ed,ed->e", np.asarray(y, np.float64)[r], np.asarray(x, np.float64)[c])
  assert rel_err(got, ref) < tol


ATT_TOL = {jnp.float32: 1e-5, jnp.float16: 4e-3, jnp.bfloat16: 3e-2}  # test_gpu_attention.py
GRAD_TOL = {jnp.float32: 1e-4, jnp.float16: 1e-2, jnp.bfloat16: 2e-2}


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_attention_default_options(rng, kind, dtype, d):
  """Forward and gradients of sparse_attention, H=2, with whichever backward the selector
  picks (rmat at d=128: composed; the others fused for 16-bit)."""
  A = _matrix(rng, kind)
  m, n = A.shape
  H = 2
  mk = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
  q, k, v = mk(H, m, d), mk(H, n, d), mk(H, n, d)
  w = jnp.asarray(rng.standard_normal((H, m, d)), jnp.float32)
  Ag, wg = _gpu(A), _gpu(w)

  def loss(a, kk, vv):
    out = jst.sparse_attention(Ag, a, kk, vv)
    return jnp.sum(out.astype(jnp.float32) * wg), out

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  (_, out), grads = step(*_gpu((q, k, v)))
  ref_out, ref_grads = _edge_attention_ref(A, q, k, v, w)
  out = np.asarray(out, np.float64)
  assert np.all(np.isfinite(out))
  assert rel_err(out, ref_out) < 2 * ATT_TOL[dtype], "forward"
  for name, g, r in zip("qkv", grads, ref_grads):
    assert rel_err(g, r) < GRAD_TOL[dtype], name
