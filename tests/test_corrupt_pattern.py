"""Corrupt patterns: the validator (_cpu.check_pattern, _cpu.check_transpose) accepts every
pattern the builder makes and names the first broken invariant of a corrupt one; the CPU kernels
refuse a corrupt pattern with an exception naming it instead of reading or writing out of bounds.

A SparseMatrix's integer arrays are pytree leaves, so a corruption can happen inside jit (a
jax.tree.map over a matrix, an edit of one leaf), where no Python check sees it: these tests
corrupt leaves inside jitted functions. They run in this process, so a kernel that crashes fails
the run."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo, window_blocks_coo

import jaxsparse_tc as jst
from jaxsparse_tc import _cpu
from jaxsparse_tc._src.attention import attention_fwd_p, attention_jvp_p
from jaxsparse_tc._src.edge_softmax import edge_softmax_bwd_p
from jaxsparse_tc._src.pattern import Pattern
from jaxsparse_tc._src.spmm import spmm_p

pytestmark = pytest.mark.usefixtures("on_cpu")


def host(A):
  """A's and A^T's patterns and permutations as numpy arrays."""
  return (
    jax.tree.map(np.asarray, A.pattern),
    jax.tree.map(np.asarray, A.pattern_t),
    np.asarray(A.perm_t),
    np.asarray(A.perm_t_inv),
  )


def validate(A) -> tuple[str, str, str]:
  p, pt, perm, perm_inv = host(A)
  m, n = A.shape
  return (
    _cpu.check_pattern(*p, m, n),
    _cpu.check_pattern(*pt, n, m),
    _cpu.check_transpose(p.rows, p.cols, pt.rows, pt.cols, perm, perm_inv),
  )


# -- every built pattern passes ---------------------------------------------------------------
SHAPES = [(0, 0), (0, 7), (9, 0), (1, 1), (8, 8), (13, 29), (61, 47), (200, 150)]
OPTIONS = [
  None,
  jst.FormatOptions(split_blocks=1),
  jst.FormatOptions(split_blocks=3),
  jst.FormatOptions(split_blocks=32),
  jst.FormatOptions(grouped=False),
  jst.FormatOptions(row_order="length"),
  jst.FormatOptions(row_order="locality"),
]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_built_patterns_pass(rng, shape, options):
  rows, cols, vals = random_coo(rng, *shape, 0.2)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=shape, format_options=options)
  assert validate(A) == ("", "", "")


@pytest.mark.parametrize("grouped", [None, True, False])
def test_grouped_schedules_pass(rng, grouped):
  """Windows of 0 .. 32 blocks: every piece count of a grouped schedule."""
  rows, cols, shape = window_blocks_coo(rng)
  A = jst.SparseMatrix.from_coo(
    rows, cols, shape=shape, format_options=jst.FormatOptions(grouped=grouped)
  )
  assert A.grouped[0] == (grouped is not False)
  assert validate(A) == ("", "", "")


def test_large_pattern_passes(rng):
  """Past the small-graph rules (>= 2^16 nonzeros): windows split into pieces (of 8 blocks by
  the rule, six long windows being a few; of 32 forced), rows cut into several CTA items
  (slotted), longest CTA items first."""
  from jaxsparse_tc._src.pattern import FINE_SPLIT_MIN, SPLIT_BLOCKS

  m, n = 3000, 2500
  rows, cols, _ = random_coo(rng, m, n, 0.012)
  long_rows = rng.choice(m, 6, replace=False)
  lengths = rng.integers(600, 2400, 6)
  rows = np.concatenate([rows] + [np.full(k, r) for r, k in zip(long_rows, lengths)])
  cols = np.concatenate([cols] + [rng.choice(n, k, replace=False) for k in lengths])
  forced = jst.FormatOptions(split_blocks=32)
  for options, piece in ((None, FINE_SPLIT_MIN), (forced, SPLIT_BLOCKS)):
    A = jst.SparseMatrix.from_coo(rows, cols, shape=(m, n), format_options=options)
    p = A.pattern
    assert A.nnz >= 2**16
    assert np.asarray(p.row_schedule)[:, 3].max() >= 1  # slotted rows
    assert np.asarray(p.schedule)[:, 3].max() == piece  # split windows
    assert validate(A) == ("", "", "")


def test_reordered_pattern_passes(rng):
  rows, cols, vals = random_coo(rng, 300, 300, 0.03)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(300, 300))
  assert validate(jst.reorder(A).permute_matrix(A)) == ("", "", "")


# -- the validator names each kind of corruption -----------------------------------------------
def _matrix(rng, shape=(61, 47), density=0.25, options=None):
  rows, cols, vals = random_coo(rng, *shape, density)
  return jst.SparseMatrix.from_coo(rows, cols, vals, shape=shape, format_options=options)


def _set(a, index, value):
  a = np.array(a)
  a[index] = value
  return a


def _partial_last_block(p):
  """(window, its last block, the block's column count) of a window whose last block has fewer
  than 8 condensed columns."""
  wcp, wbp = p.window_col_ptr, p.window_block_ptr
  for w in range(len(wcp) - 1):
    ncols = int(wcp[w + 1] - wcp[w])
    if ncols % 8:
      return w, int(wbp[w + 1]) - 1, ncols % 8
  raise AssertionError("no partial block")


def _bits(p, b):
  return int(p.block_bitmap[b, 0]) | (int(p.block_bitmap[b, 1]) << 32)


def _with_bit(p, b, bit):
  bits = _bits(p, b) | (1 << bit)
  return _set(p.block_bitmap, b, [bits & 0xFFFFFFFF, bits >> 32])


def _row_past_m(p, m):
  """block_bitmap with a bit for a row past m in the last (partial) window."""
  W = len(p.window_col_ptr) - 1
  assert m % 8 and p.window_block_ptr[W] > p.window_block_ptr[W - 1]
  b = int(p.window_block_ptr[W - 1])
  return _with_bit(p, b, m % 8)  # column 0, first row past m


def _column_past_width(p):
  _, b, ncols = _partial_last_block(p)
  return _with_bit(p, b, 8 * ncols)  # row 0 of the first column past the block's


def _swap(a, i, j):
  a = np.array(a)
  a[[i, j]] = a[[j, i]]
  return a


# name -> (corrupt(p, m, n) -> Pattern, the array the message names)
PATTERN_CORRUPTIONS = {
  "column past n": (
    lambda p, m, n: p._replace(window_cols=_set(p.window_cols, 5, n)),
    "window_cols",
  ),
  "negative column": (
    lambda p, m, n: p._replace(window_cols=_set(p.window_cols, 3, -2)),
    "window_cols",
  ),
  "col pointer decreasing": (
    lambda p, m, n: p._replace(window_col_ptr=_set(p.window_col_ptr, 2, p.window_col_ptr[1] - 1)),
    "window_col_ptr",
  ),
  "col pointer past the end": (
    lambda p, m, n: p._replace(window_col_ptr=_set(p.window_col_ptr, -1, len(p.window_cols) + 9)),
    "window_col_ptr",
  ),
  "block pointer negative": (
    lambda p, m, n: p._replace(window_block_ptr=_set(p.window_block_ptr, 1, -1)),
    "window_block_ptr",
  ),
  "block pointer past the end": (
    lambda p, m, n: p._replace(
      window_block_ptr=_set(p.window_block_ptr, -1, len(p.block_bitmap) + 2)
    ),
    "window_block_ptr",
  ),
  "bitmap row past m": (lambda p, m, n: p._replace(block_bitmap=_row_past_m(p, m)), "block_bitmap"),
  "bitmap column past the block": (
    lambda p, m, n: p._replace(block_bitmap=_column_past_width(p)),
    "block_bitmap",
  ),
  "value pointer shifted": (
    lambda p, m, n: p._replace(
      block_value_ptr=_set(p.block_value_ptr, 4, p.block_value_ptr[4] + 1)
    ),
    "block_value_ptr",
  ),
  "value pointers all shifted": (
    lambda p, m, n: p._replace(block_value_ptr=p.block_value_ptr + 1),
    "block_value_ptr",
  ),
  "value pointer past the end": (
    lambda p, m, n: p._replace(block_value_ptr=_set(p.block_value_ptr, -1, len(p.rows) + 50)),
    "block_value_ptr",
  ),
  **{
    f"schedule field {f}": (
      functools.partial(
        lambda p, m, n, f: p._replace(schedule=_set(p.schedule, (2, f), 10**6)), f=f
      ),
      "schedule",
    )
    for f in range(8)
  },
  "schedule negative window": (
    lambda p, m, n: p._replace(schedule=_set(p.schedule, (0, 0), -1)),
    "schedule",
  ),
}

VALIDATOR_ONLY = {
  "col pointer short of the end": (
    lambda p, m, n: p._replace(window_col_ptr=_set(p.window_col_ptr, -1, len(p.window_cols) - 1)),
    "window_col_ptr",
  ),
  "columns unsorted": (
    lambda p, m, n: p._replace(window_cols=_swap(p.window_cols, 0, 1)),
    "window_cols",
  ),
  "window scheduled twice": (
    lambda p, m, n: p._replace(schedule=_set(p.schedule, 1, p.schedule[0])),
    "schedule",
  ),
  "row wrong": (lambda p, m, n: p._replace(rows=_set(p.rows, 7, (p.rows[7] + 1) % m)), "rows["),
  "col wrong": (lambda p, m, n: p._replace(cols=_set(p.cols, 7, (p.cols[7] + 1) % n)), "cols["),
  "row entry position": (
    lambda p, m, n: p._replace(row_entries=_set(p.row_entries, (4, 1), len(p.rows))),
    "row_entries",
  ),
  "row entries out of order": (
    lambda p, m, n: p._replace(row_entries=_swap(p.row_entries, 0, len(p.rows) - 1)),
    "row_entries",
  ),
  "row item past m": (
    lambda p, m, n: p._replace(row_schedule=_set(p.row_schedule, (0, 0), m)),
    "row_schedule",
  ),
  "row item end": (
    lambda p, m, n: p._replace(row_schedule=_set(p.row_schedule, (0, 2), p.row_schedule[0, 2] + 1)),
    "row_schedule",
  ),
  "row scheduled twice": (
    lambda p, m, n: p._replace(row_schedule=_set(p.row_schedule, 1, p.row_schedule[0])),
    "row_schedule",
  ),
  "row slot": (
    lambda p, m, n: p._replace(row_schedule=_set(p.row_schedule, (0, 3), 5)),
    "row_schedule",
  ),
}


@pytest.mark.parametrize("name", sorted({**PATTERN_CORRUPTIONS, **VALIDATOR_ONLY}))
def test_validator_names_corruption(rng, name):
  A = _matrix(rng)
  corrupt, array = {**PATTERN_CORRUPTIONS, **VALIDATOR_ONLY}[name]
  p = jax.tree.map(np.asarray, A.pattern)
  assert _cpu.check_pattern(*p, *A.shape) == ""
  bad = corrupt(p, *A.shape)
  assert sum(not np.array_equal(a, b) for a, b in zip(p, bad)) == 1
  msg = _cpu.check_pattern(*bad, *A.shape)
  assert array in msg, msg


def test_validator_checks_shape_and_sizes(rng):
  A = _matrix(rng)
  p = jax.tree.map(np.asarray, A.pattern)
  m, n = A.shape
  assert "window_col_ptr" in _cpu.check_pattern(*p, m + 8, n)  # one window more than the arrays
  assert "window_cols" in _cpu.check_pattern(*p, m, int(p.window_cols.max()))  # a column past n
  assert "block_bitmap" in _cpu.check_pattern(*p, m - m % 8 + 1, n)  # rows past m
  assert "cols" in _cpu.check_pattern(*p._replace(cols=p.cols[:-1]), m, n)
  assert "block_value_ptr" in _cpu.check_pattern(
    *p._replace(block_value_ptr=p.block_value_ptr[:-1]), m, n
  )
  with pytest.raises(TypeError, match="window_cols"):
    _cpu.check_pattern(*p._replace(window_cols=p.window_cols.astype(np.int64)), m, n)
  with pytest.raises(TypeError, match="schedule"):
    _cpu.check_pattern(*p._replace(schedule=p.schedule.ravel()), m, n)
  # any layout of the right dtype is read
  strided = np.zeros((p.window_cols.size, 2), np.int32)
  strided[:, 0] = p.window_cols
  assert not strided[:, 0].flags.c_contiguous
  assert _cpu.check_pattern(*p._replace(window_cols=strided[:, 0]), m, n) == ""
  assert _cpu.check_pattern(*p._replace(schedule=np.asfortranarray(p.schedule)), m, n) == ""
  assert _cpu.check_pattern(*jax.tree.map(jnp.asarray, A.pattern), m, n) == ""


@pytest.mark.parametrize("which", ["perm_t", "perm_t_inv", "rows_t", "cols_t"])
def test_check_transpose_names_corruption(rng, which):
  A = _matrix(rng)
  p, pt, perm, perm_inv = host(A)
  args = dict(
    rows=p.rows, cols=p.cols, rows_t=pt.rows, cols_t=pt.cols, perm_t=perm, perm_t_inv=perm_inv
  )
  assert _cpu.check_transpose(**args) == ""
  a = args[which]
  args[which] = _swap(a, 0, int(np.flatnonzero(a != a[0])[0]))
  msg = _cpu.check_transpose(**args)
  assert which + "[" in msg, msg
  args[which] = _set(a, 3, len(a))
  assert which + "[" in _cpu.check_transpose(**args)


# -- the CPU kernels refuse corrupt patterns inside jit -----------------------------------------
M, N, D = 61, 47, 16  # a partial last window (61 = 7 * 8 + 5)


def _operands(rng, A):
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return dict(x=f(N, D), y=f(M, D), q=f(M, D), k=f(N, D), v=f(N, D), bias=f(A.nnz), t=f(A.nnz))


def _attention_pieces(A, o):
  """A valid forward's (o, lse), for calling the JVP kernel alone."""
  return attention_fwd_p.bind(
    o["q"][None],
    o["k"][None],
    o["v"][None],
    o["bias"][None],
    *A.pattern_operands(),
    shape=A.shape,
    scale=0.25,
    has_bias=True,
    grouped=A.grouped[0],
    grouped_t=A.grouped[1],
    options=jst.KernelOptions(),
  )


def _sum(x):
  return jnp.sum(jnp.asarray(x, jnp.float32))


# Each runs CPU targets on the matrix it is given (every target in _cpu.registrations(), and
# through gradients and JVPs the targets they call on A's and A^T's patterns).
def _runners(o, soft, att):
  q, k, v, bias = o["q"], o["k"], o["v"], o["bias"]
  attn = lambda A, q, k, v, b: jst.sparse_attention(A, q, k, v, bias=b)
  return {
    "spmm": lambda A: A @ o["x"],
    "spmm_extremum": lambda A: jst.spmm(A, o["x"], reduce="max"),
    "spmm grad": lambda A: jax.grad(lambda vals, x: _sum(A.with_values(vals) @ x), (0, 1))(
      A.values, o["x"]
    ),
    "sddmm": lambda A: jst.sddmm(A, o["y"], o["x"]).values,
    "sddmm jvp": lambda A: jax.jvp(lambda y: jst.sddmm(A, y, o["x"]).values, (o["y"],), (o["y"],)),
    "sddmm grad": lambda A: jax.grad(lambda y, x: _sum(jst.sddmm(A, y, x).values), (0, 1))(
      o["y"], o["x"]
    ),
    "edge_softmax": lambda A: jst.edge_softmax(A, o["t"]).values,
    "edge_softmax grad": lambda A: jax.grad(lambda t: _sum(jst.edge_softmax(A, t).values ** 2))(
      o["t"]
    ),
    "edge_softmax_bwd": lambda A: edge_softmax_bwd_p.bind(
      soft[None], o["t"][None], *A.pattern_operands()
    ),
    "sparse_attention": lambda A: attn(A, q, k, v, bias),
    "sparse_attention grad": lambda A: jax.grad(
      lambda q, k, v, b: _sum(attn(A, q, k, v, b)), (0, 1, 2, 3)
    )(q, k, v, bias),
    "sparse_attention jvp": lambda A: jax.jvp(
      lambda q, k, v, b: attn(A, q, k, v, b), (q, k, v, bias), (q, k, v, bias)
    ),
    "attention_jvp": lambda A: attention_jvp_p.bind(
      q[None],
      k[None],
      v[None],
      bias[None],
      att[0],
      att[1],
      q[None],
      k[None],
      v[None],
      bias[None],
      *A.pattern_operands(),
      shape=A.shape,
      scale=0.25,
      has_bias=True,
      grouped=A.grouped[0],
      grouped_t=A.grouped[1],
      options=jst.KernelOptions(),
    ),
  }


# Runners whose kernels never read window_cols (the edge softmax: values and their rows only):
# a corrupt column leaves their results right.
READ_NO_COLUMNS = {"edge_softmax", "edge_softmax grad", "edge_softmax_bwd"}


def _corrupt_leaf(A, orientation: str, field: str, corrupt):
  """A function that rebuilds A inside a traced function with one pattern leaf replaced by
  corrupt(leaf) (same dtype and shape)."""
  leaves, treedef = jax.tree_util.tree_flatten(A)
  target = getattr(getattr(A, orientation), field)
  index = next(i for i, leaf in enumerate(leaves) if leaf is target)

  def rebuild(A):
    leaves = jax.tree_util.tree_leaves(A)
    bad = corrupt(leaves[index])
    assert bad.shape == leaves[index].shape and bad.dtype == leaves[index].dtype
    leaves[index] = bad
    return jax.tree_util.tree_unflatten(treedef, leaves)

  return rebuild


def _in_jit(p, m, n):
  """PATTERN_CORRUPTIONS as functions of traced leaves: (field, corrupt(leaf), array)."""
  out = {}
  for name, (corrupt, array) in PATTERN_CORRUPTIONS.items():
    bad = corrupt(p, m, n)
    (field,) = [f for f in Pattern._fields if not np.array_equal(getattr(p, f), getattr(bad, f))]
    diff = np.asarray(getattr(bad, field))
    where = np.nonzero(diff != getattr(p, field))
    # the same change, made with jnp on the traced leaf
    out[name] = (field, lambda leaf, where=where, diff=diff: leaf.at[where].set(diff[where]), array)
  return out


def _check_raises(fn, *args, array: str):
  with pytest.raises(Exception) as info:
    jax.block_until_ready(fn(*args))
  msg = str(info.value)
  assert "invalid sparsity pattern" in msg and array in msg, msg
  return msg


@pytest.fixture
def corrupt_case(rng):
  rows, cols, vals = random_coo(rng, M, N, 0.25)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(M, N))
  o = _operands(rng, A)
  soft = jst.edge_softmax(A, o["t"]).values
  att = _attention_pieces(A, o)
  return A, o, soft, att


# Every CPU target called directly, then the operators' gradients and JVPs (which run the same
# targets, and A^T's, after the forward's).
TARGETS = [
  "spmm",
  "spmm_extremum",
  "sddmm",
  "edge_softmax",
  "edge_softmax_bwd",
  "sparse_attention",
  "attention_jvp",
]
DERIVATIVES = [
  "spmm grad",
  "sddmm jvp",
  "sddmm grad",
  "edge_softmax grad",
  "sparse_attention grad",
  "sparse_attention jvp",
]
SOME_CORRUPTIONS = [
  "column past n",
  "col pointer past the end",
  "bitmap row past m",
  "bitmap column past the block",
  "value pointer shifted",
  "schedule field 0",
]


@pytest.mark.parametrize(
  "op, corruption",
  [(op, c) for op in TARGETS for c in sorted(PATTERN_CORRUPTIONS)]
  + [(op, c) for op in DERIVATIVES for c in SOME_CORRUPTIONS],
)
def test_kernels_refuse_corrupt_leaf(corrupt_case, op, corruption):
  A, o, soft, att = corrupt_case
  run = _runners(o, soft, att)[op]
  p = jax.tree.map(np.asarray, A.pattern)
  field, corrupt, array = _in_jit(p, *A.shape)[corruption]
  rebuild = _corrupt_leaf(A, "pattern", field, corrupt)
  fn = jax.jit(lambda A: run(rebuild(A)))
  if field == "window_cols" and op in READ_NO_COLUMNS:
    got, want = jax.jit(run)(A), fn(A)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    return
  _check_raises(fn, A, array=array)


@pytest.mark.parametrize(
  "corruption", ["column past n", "value pointer shifted", "schedule field 1"]
)
@pytest.mark.parametrize("op", ["spmm grad", "sddmm grad", "sparse_attention grad"])
def test_gradients_refuse_corrupt_transpose(corrupt_case, op, corruption):
  """A^T's pattern is read only by the backward SpMMs (dX, dY, dK, dV)."""
  A, o, soft, att = corrupt_case
  run = _runners(o, soft, att)[op]
  pt = jax.tree.map(np.asarray, A.pattern_t)
  field, corrupt, array = _in_jit(pt, *A.shape[::-1])[corruption]
  rebuild = _corrupt_leaf(A, "pattern_t", field, corrupt)
  _check_raises(jax.jit(lambda A: run(rebuild(A))), A, array=array)


def test_tree_map_sum_of_matrices(corrupt_case):
  """jax.tree.map(a + b) adds the pattern arrays too."""
  A, o, _, _ = corrupt_case
  msg = _check_raises(
    jax.jit(lambda A, x: jax.tree.map(lambda a, b: a + b, A, A) @ x), A, o["x"], array="window_"
  )
  assert "jaxsparse_tc_spmm" in msg


def test_kernels_check_operands_against_pattern(corrupt_case):
  """Dense operands of other shapes than the pattern's (primitives bound directly): X with fewer
  rows than A has columns."""
  A, o, _, _ = corrupt_case
  short = o["x"][: N - 10]
  bind = lambda A, x: spmm_p.bind(
    A.values[None],
    x[None],
    *A.pattern_operands(),
    shape=A.shape,
    precision=0,
    options=jst.KernelOptions(),
  )
  np.testing.assert_allclose(bind(A, o["x"])[0], A @ o["x"], rtol=1e-6)
  if int(np.asarray(A.pattern.window_cols).max()) >= N - 10:
    _check_raises(jax.jit(bind), A, short, array="window_cols")


def test_valid_results_unchanged(rng):
  """The checks pass on valid patterns and the kernels' results stand (against float64)."""
  rows, cols, vals = random_coo(rng, M, N, 0.3)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(M, N))
  x = rng.standard_normal((N, D))
  dense = np.asarray(A.todense(), np.float64)
  np.testing.assert_allclose(
    np.asarray(A @ jnp.asarray(x, jnp.float32)), dense @ x, rtol=1e-4, atol=1e-4
  )
