"""The CUDA kernels on corrupted patterns. Inside jax.jit a SparseMatrix's integer arrays are
tracers, so nothing checks their values, and user code can change them (jax.tree.map(lambda a,
b: a + b, A, A) adds them too): every kernel must stay in bounds whatever they hold (the results
are undefined) and leave the CUDA context usable. The cases are scripts/sanitize_case.py's
(`corrupt`), which compute-sanitizer runs too. The GPU tests are skipped without a GPU; the
cases themselves are checked on any machine."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, rel_err

import jaxsparse_tc as jst

sys.path.insert(0, str(ROOT))  # scripts/ is not part of the package
from scripts import sanitize_case as sc  # noqa: E402


def _has_gpu() -> bool:
  try:
    return any(d.platform == "gpu" for d in jax.devices())
  except RuntimeError:
    return False


needs_gpu = pytest.mark.skipif(
  not (jst.has_cuda() and _has_gpu()), reason="needs a CUDA GPU and the CUDA extension"
)


def _spmm_still_right(rng):
  """A valid SpMM after the corrupt ones matches float64: the CUDA context survived them."""
  A = jst.SparseMatrix.from_coo(
    rng.integers(0, 300, 4000),
    rng.integers(0, 200, 4000),
    rng.standard_normal(4000),
    shape=(300, 200),
  )
  x = jnp.asarray(rng.standard_normal((200, 32)), jnp.float32)
  for opts in (jst.KernelOptions(spmm="rows"), jst.KernelOptions(spmm="windows")):
    y = jax.jit(lambda A, x, o=opts: jst.spmm(A, x, precision="highest", options=o))(A, x)
    ref = A.to_scipy().astype(np.float64) @ np.asarray(x, np.float64)
    assert rel_err(y, ref) < 1e-5


@pytest.fixture(scope="module")
def graphs():
  return dict(sc.corrupt_graphs(np.random.default_rng(0)))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype,d", sc.CORRUPT_DTYPES, ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("graph", ["small", "grouped", "large"])
def test_gpu_corrupt_patterns_run(rng, graphs, graph, dtype, d):
  """Every corruption of A's and A^T's arrays (one column of one array at a time: off by one,
  garbage bits, int32 extremes, negative, reversed, pieces that disagree, slots past the
  workspace; and A + A) through every operator and kernel family of the dtype, forward,
  gradients and jvp: each runs to completion, and a valid SpMM is still right afterwards."""
  A = graphs[graph]
  ops = sc.corrupt_operands(rng, A, dtype, d)
  assert sc.run_corrupt_cases(A, dtype, ops, sc.corruptions()) == len(sc.corruptions())
  _spmm_still_right(rng)


def test_corruptions_keep_dtypes_and_shapes(rng):
  """Each case changes the array it names, keeping every leaf's dtype and shape (any machine:
  only the corrupted arrays are computed, no kernel runs)."""
  A = jst.SparseMatrix.from_coo(rng.integers(0, 40, 300), rng.integers(0, 30, 300), shape=(40, 30))
  cases = sc.corruptions()
  assert len({c.name for c in cases}) == len(cases)
  leaves = jax.tree_util.tree_leaves(A)
  corrupt = jax.jit(lambda A, i: sc.corrupted(A, i, cases))
  for i, c in enumerate(cases):
    B = corrupt(A, jnp.int32(i))
    got = jax.tree_util.tree_leaves(B)
    assert [(x.shape, x.dtype) for x in got] == [(x.shape, x.dtype) for x in leaves], c.name
    changed = [j for j, (x, y) in enumerate(zip(leaves, got)) if not np.array_equal(x, y)]
    assert changed, f"case {c.name!r} changed nothing"
    if c.side != "all":
      assert len(changed) == 1, c.name


def test_sanitize_case_arguments():
  assert sc.parse_args([]).parts == ["main", "corrupt"]
  args = sc.parse_args(["corrupt", "--compile-only"])
  assert args.parts == ["corrupt"] and args.compile_only
  assert sc.parse_args(["streams", "grads"]).parts == ["streams", "grads"]
  assert sc.parse_args(["corrupt", "--shard", "3/7"]).shard == (3, 7)
  assert sc.parse_args(["corrupt"]).shard == (0, 1)
  assert sc.parse_args(["corrupt"]).compilation_cache is None
  assert sc.parse_args(["main", "--compilation-cache", "c"]).compilation_cache == "c"
  for bad in (
    ["nonsense"],
    ["corrupt", "--shard", "7/7"],
    ["corrupt", "--shard", "1/0"],
    ["corrupt", "--shard", "x"],
    ["corrupt", "--shard", "-1/2"],
  ):
    with pytest.raises(SystemExit):
      sc.parse_args(bad)


def _packed(leaves, gap: int):
  """Leaves of one dtype laid in one buffer, each `gap` elements after the previous one's end
  (so at offsets that are not multiples of 16 bytes), and a function cutting them back out."""
  parts, at, offsets = [], 0, []
  for x in leaves:
    parts += [jnp.zeros((gap,), x.dtype), x.reshape(-1)]
    offsets.append(at + gap)
    at += gap + x.size
  buf = jnp.concatenate(parts)
  shapes = [x.shape for x in leaves]
  return buf, lambda b: [
    b[o : o + np.prod(s, dtype=int)].reshape(s) for o, s in zip(offsets, shapes)
  ]


@pytest.mark.gpu
@needs_gpu
def test_gpu_operands_sliced_in_place(rng):
  """XLA hands a custom call a slice of a larger buffer in place: operands that start off the
  kernels' 16-byte alignment give the right result or a clear error, never a crash."""
  m, n, nnz, d = 300, 200, 4000, 64
  A32 = jst.SparseMatrix.from_coo(
    rng.integers(0, m, nnz), rng.integers(0, n, nnz), rng.standard_normal(nnz), shape=(m, n)
  )
  A = A32.astype(jnp.float16)
  x = jnp.asarray(rng.standard_normal((n, d)), jnp.float16)
  q = jnp.asarray(rng.standard_normal((2, m, d)), jnp.float16)
  kv = jnp.asarray(rng.standard_normal((2, n, d)), jnp.float16)
  leaves, treedef = jax.tree_util.tree_flatten(A)
  dtypes = sorted({str(a.dtype) for a in leaves})
  groups = {t: [i for i, a in enumerate(leaves) if str(a.dtype) == t] for t in dtypes}
  packs = {t: _packed([leaves[i] for i in groups[t]], gap=1) for t in dtypes}
  buffers = {t: packs[t][0] for t in dtypes}

  def matrix(bufs):
    out = [None] * len(leaves)
    for t in dtypes:
      for i, a in zip(groups[t], packs[t][1](bufs[t])):
        out[i] = a
    return jax.tree_util.tree_unflatten(treedef, out)

  dense = A32.astype(jnp.float16).astype(jnp.float32).to_scipy().toarray().astype(np.float64)
  ops = {
    "spmm rows": (
      lambda b: jst.spmm(matrix(b), x, options=jst.KernelOptions(spmm="rows")),
      dense @ np.asarray(x, np.float64),
    ),
    "spmm windows": (
      lambda b: jst.spmm(matrix(b), x, options=jst.KernelOptions(spmm="windows")),
      dense @ np.asarray(x, np.float64),
    ),
    "sddmm": (
      lambda b: jst.sddmm(matrix(b), q[0], kv[0]).values,
      np.einsum(
        "ed,ed->e",
        np.asarray(q[0], np.float64)[np.asarray(A.rows)],
        np.asarray(kv[0], np.float64)[np.asarray(A.cols)],
      ),
    ),
  }
  for name, (f, ref) in ops.items():
    try:
      y = np.asarray(jax.jit(f)(buffers), np.float64)
    except Exception as e:  # noqa: BLE001 (the runtime's error type varies by jax version)
      assert "does not start at a multiple of 16 bytes" in str(e), (name, str(e)[:300])
    else:
      assert rel_err(y, ref) < 2e-2, name
  attn = lambda b: jst.sparse_attention(matrix(b), q, kv, kv)  # noqa: E731
  for f in (attn, jax.grad(lambda b, q: attn(b).astype(jnp.float32).sum(), argnums=1)):
    try:
      jax.block_until_ready(jax.jit(f)(buffers) if f is attn else jax.jit(f)(buffers, q))
    except Exception as e:  # noqa: BLE001
      assert "does not start at a multiple of 16 bytes" in str(e), str(e)[:300]
  _spmm_still_right(rng)
