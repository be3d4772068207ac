"""Property tests: random patterns that reach the format's corner cases (empty rows and windows,
hub rows and columns longer than a CTA item, duplicates, no nonzeros, one row or column, sides
that are no multiple of 8 or zero, windows of many blocks, every FormatOptions variant), every
operator and its derivatives against float64 references written with numpy from the
definitions (dense matrices: the patterns are small).

Each test draws its pattern and operands from the `rng` fixture (the seed is printed on failure)
and runs every operator's forward, gradients and JVP in one compiled program: compiling is most
of the file's time."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import window_blocks_coo

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix
from jaxsparse_tc._src.pattern import (
  GROUPED_MAX_BLOCKS,
  SPLIT_BLOCKS,
  grouped_schedule_fits,
  row_cta_entries,
  row_piece,
)

# The CPU kernels (the specification); the GPU kernels are checked against them elsewhere.
pytestmark = pytest.mark.usefixtures("on_cpu")

# Entries of one CTA item of a small graph's row view: a hub row longer than this is walked by
# several CTAs whose sums meet in a workspace.
CTA_ENTRIES = row_cta_entries(row_piece(0))

# Pattern kinds; draw d of a kind is the variant d % 2 where a kind has two (sides, orientation)
# and has head axes on odd draws.
KINDS = (
  "random",  # even draws: sides of any size; odd draws: multiples of 8
  "empty_windows",
  "hub_row",
  "hub_col",
  "duplicates",  # even draws: every position of a small matrix, most repeated; odd: random
  "no_nonzeros",
  "one_line",  # 1 x n, m x 1
  "zero_side",  # 0 x n, m x 0
  "long_windows",
  "grouped_windows",
)
DRAWS = 2  # per kind: draw 0 without heads, draw 1 with heads (a random broadcast layout)

TOL = 2e-5  # float32 operands: fp32 accumulation against float64
# Attention's derivatives cancel (dS = P (dP - rowsum(dO O))) and sum over long columns: float32
# reaches some 1e-5 of the largest element on hub columns.
TOL_ATTENTION_GRAD = 1e-4
TOL_16 = {jnp.float16: 4e-3, jnp.bfloat16: 3e-2}


# -- patterns ---------------------------------------------------------------------------------
def _entries(rng, m, n, count):
  """`count` uniform random positions of an m x n matrix (repeats possible)."""
  if m == 0 or n == 0:
    count = 0
  return rng.integers(0, max(m, 1), count), rng.integers(0, max(n, 1), count)


def _hub(rng, long_side, short_side):
  """Entries (i, j), i < short_side, j < long_side: a sparse background, one hub line of more
  than CTA_ENTRIES entries (sometimes several CTA items) and one line past a lane group's
  piece but within one CTA item."""
  i, j = _entries(rng, short_side, long_side, int(0.02 * short_side * long_side))
  hub, mid = rng.choice(short_side, 2, replace=False)
  hub_j = rng.choice(long_side, int(rng.integers(CTA_ENTRIES + 1, long_side + 1)), replace=False)
  mid_j = rng.choice(long_side, int(rng.integers(row_piece(0) + 1, CTA_ENTRIES)), replace=False)
  i = np.concatenate([i, np.full(hub_j.size, hub), np.full(mid_j.size, mid)])
  return i, np.concatenate([j, hub_j, mid_j])


def draw_pattern(rng, kind, draw=0):
  """COO indices (unsorted, repeats allowed) and shape of a random pattern of `kind`."""
  odd = draw % 2 == 1
  if kind in ("random", "empty_windows"):
    m, n = rng.integers(1, 70, 2)
    if kind == "random" and odd:
      m, n = 8 * rng.integers(1, 9, 2)
    if kind == "empty_windows":
      m = 8 * int(rng.integers(4, 10)) + int(rng.integers(0, 8))
    rows, cols = _entries(rng, m, n, int(rng.uniform(0.05, 0.4) * m * n) + 1)
    if kind == "empty_windows":  # whole 8-row windows (the last, partial one too) and single rows
      windows = np.flatnonzero(rng.random(-(-m // 8)) < 0.5)
      single = rng.choice(m, 3, replace=False)
      keep = ~np.isin(rows // 8, windows) & ~np.isin(rows, single)
      rows, cols = rows[keep], cols[keep]
  elif kind == "hub_row":
    m, n = int(rng.integers(9, 60)), int(rng.integers(CTA_ENTRIES + 40, 3 * CTA_ENTRIES))
    rows, cols = _hub(rng, n, m)
  elif kind == "hub_col":
    m, n = int(rng.integers(CTA_ENTRIES + 40, 3 * CTA_ENTRIES)), int(rng.integers(9, 60))
    cols, rows = _hub(rng, m, n)
  elif kind == "mixed":  # empty windows, a hub row and a hub column in one matrix
    m, n = int(rng.integers(2 * CTA_ENTRIES, 3 * CTA_ENTRIES)), int(rng.integers(300, 500))
    rows, cols = _entries(rng, m, n, int(0.01 * m * n))
    empty = rng.random(-(-m // 8)) < 0.25
    live = np.flatnonzero(~empty[np.arange(m) // 8])
    hub_row, hub_col = rng.choice(live), rng.integers(n)
    hub_cols = rng.choice(n, int(rng.integers(CTA_ENTRIES + 1, n)), replace=False)
    count = int(rng.integers(min(CTA_ENTRIES + 1, live.size), live.size + 1))
    hub_rows = rng.choice(live, count, replace=False)
    keep = ~empty[rows // 8]
    rows = np.concatenate([rows[keep], np.full(hub_cols.size, hub_row), hub_rows])
    cols = np.concatenate([cols[keep], hub_cols, np.full(hub_rows.size, hub_col)])
  elif kind == "duplicates":  # more entries than positions: most repeat
    m, n = rng.integers(1, 25, 2)
    rows, cols = _entries(rng, m, n, int(rng.integers(1, 3 * m * n + 2)))
    if not odd:  # and every position at least once: full 8x8 bitmaps
      rows, cols = (
        np.concatenate([np.arange(m * n) // n, rows]),
        np.concatenate([np.arange(m * n) % n, cols]),
      )
  elif kind == "no_nonzeros":
    m, n = rng.integers(1, 40, 2)
    rows, cols = _entries(rng, m, n, 0)
  elif kind == "one_line":
    long_side = int(rng.integers(1, 3 * CTA_ENTRIES))
    m, n = (long_side, 1) if odd else (1, long_side)
    rows, cols = _entries(rng, m, n, int(rng.integers(1, 2 * long_side + 1)))
  elif kind == "zero_side":
    side = int(rng.integers(1, 40))
    m, n = (side, 0) if odd else (0, side)
    rows, cols = _entries(rng, m, n, 0)
  elif kind in ("long_windows", "grouped_windows"):
    # Windows of 0 .. most blocks: past SPLIT_BLOCKS and GROUPED_MAX_BLOCKS (split windows of
    # an ungrouped schedule) or up to GROUPED_MAX_BLOCKS (a grouped one); a few empty rows last.
    most = (
      int(rng.integers(SPLIT_BLOCKS + 1, SPLIT_BLOCKS + 9))
      if kind == "long_windows"
      else GROUPED_MAX_BLOCKS
    )
    rows, cols, (m, n) = window_blocks_coo(
      rng, most, n=8 * most + int(rng.integers(0, 100)), keep=float(rng.uniform(0.3, 0.7))
    )
    m += int(rng.integers(0, 8))
  else:
    raise ValueError(kind)
  if kind != "duplicates" and rows.size:  # exact repeats of some entries
    rep = rng.random(rows.size) < 0.1
    rows, cols = np.concatenate([rows, rows[rep]]), np.concatenate([cols, cols[rep]])
  return np.asarray(rows, np.int64), np.asarray(cols, np.int64), (int(m), int(n))


def format_variants(rows, cols, shape):
  """Every FormatOptions variant that applies to a pattern (grouped=True only where both
  orientations qualify for a grouped schedule)."""
  variants = [
    None,
    jst.FormatOptions(split_blocks=1),
    jst.FormatOptions(split_blocks=3),
    jst.FormatOptions(split_blocks=SPLIT_BLOCKS),
    jst.FormatOptions(grouped=False),
    jst.FormatOptions(row_order="length"),
    jst.FormatOptions(split_blocks=2, row_order="locality"),
  ]
  A = SparseMatrix.from_coo(rows, cols, shape=shape)
  if all(
    grouped_schedule_fits(np.asarray(p.window_block_ptr), A.nnz) for p in (A.pattern, A.pattern_t)
  ):
    variants.append(jst.FormatOptions(grouped=True, row_order="locality"))
  return variants


@dataclasses.dataclass
class Case:
  """A drawn pattern and its matrix (the input values summed into the format), with float64
  conversions between format-order values and dense matrices."""

  rows: np.ndarray  # input COO, repeats included
  cols: np.ndarray
  shape: tuple
  A: SparseMatrix
  heads: int | None  # H of the draw (None: no head axes anywhere)

  @functools.cached_property
  def mask(self) -> np.ndarray:
    """[m, n]: where A has an entry."""
    mask = np.zeros(self.shape, bool)
    mask[self.rows, self.cols] = True
    return mask

  def dense(self, values_in) -> np.ndarray:
    """Input-order values [..., nnz_in] as float64 [H', m, n], repeats summed."""
    v = np.asarray(values_in, np.float64)
    v = v[None] if v.ndim == 1 else v
    out = np.zeros((v.shape[0],) + self.shape)
    for h in range(v.shape[0]):
      np.add.at(out[h], (self.rows, self.cols), v[h])
    return out

  def scatter(self, values) -> np.ndarray:
    """Format-order values [..., nnz] as float64 [H', m, n] (positions from A.rows, A.cols)."""
    v = np.asarray(values, np.float64)
    v = v[None] if v.ndim == 1 else v
    out = np.zeros((v.shape[0],) + self.shape)
    out[:, np.asarray(self.A.rows), np.asarray(self.A.cols)] = v
    return out

  def gather(self, dense) -> np.ndarray:
    """[H', m, n] at A's nonzeros, format order: [H', nnz]."""
    return np.asarray(dense)[:, np.asarray(self.A.rows), np.asarray(self.A.cols)]


def draw_case(rng, kind, draw, dtype=np.float32, format_options="random") -> Case:
  """A pattern of `kind`, its values (input order, [nnz_in] or [H, nnz_in]) and a FormatOptions
  variant (random among those that apply, unless given)."""
  rows, cols, shape = draw_pattern(rng, kind, draw)
  if format_options == "random":
    variants = format_variants(rows, cols, shape)
    format_options = variants[rng.integers(len(variants))]
  heads = int(rng.integers(2, 4)) if draw % 2 else None
  values_shape = (rows.size,) if heads is None else (heads, rows.size)
  values = rng.standard_normal(values_shape).astype(dtype)
  A = SparseMatrix.from_coo(rows, cols, values, shape=shape, format_options=format_options)
  case = Case(rows, cols, shape, A, heads)
  check_format(case, values)
  return case


def check_format(case: Case, values_in) -> None:
  """A's nonzeros are the distinct input positions, and its values the repeats' sums (summed
  in float64, rounded once)."""
  A = case.A
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  assert A.nnz == int(case.mask.sum()) and np.all(case.mask[r, c])
  ref = case.gather(case.dense(values_in))
  tol = max(float(jnp.finfo(A.values.dtype).eps), 1e-6)
  assert_close(np.asarray(A.values, np.float64).reshape(ref.shape), ref, tol, "summed values")


# -- comparisons and head layouts ------------------------------------------------------------------
def assert_close(out, ref, tol, what):
  """Norm-wise relative error under tol, and every element within tol of its reference plus
  tol times the largest reference element or 1 (the operands are O(1)), which catches a wrong
  row in a large matrix."""
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
  assert np.all(np.isfinite(out)), f"{what}: non-finite output"
  scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1.0)
  err = np.abs(out - ref)
  bad = err > tol * (np.abs(ref) + scale)
  worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
  assert not np.any(bad), (
    f"{what}: {int(bad.sum())} of {out.size} elements off, worst at {worst}: got "
    f"{out[worst]!r}, expected {ref[worst]!r}"
  )
  scale = max(float(np.linalg.norm(ref)), np.sqrt(ref.size))
  assert np.linalg.norm(out - ref) <= tol * scale, (
    f"{what}: relative error {np.linalg.norm(out - ref) / scale:.3g} > {tol}"
  )


def head_layout(rng, heads, count):
  """Head sizes of `count` operands: None (no head axis) everywhere without heads, else a
  random layout of None, 1 and H with at least one H."""
  if heads is None:
    return [None] * count
  while True:
    layout = [(None, 1, heads)[i] for i in rng.integers(0, 3, count)]
    if heads in layout:
      return layout


def normal(rng, h, shape, dtype=np.float32, scale=1.0):
  """A random operand of `shape` with head axis h (None: none)."""
  full = shape if h is None else (h,) + shape
  return (scale * rng.standard_normal(full)).astype(dtype)


def pick(values, h):
  """A's drawn values ([nnz] or [H, nnz], numpy or jax) laid out for head axis h: None, 1 or
  H."""
  if values.ndim == 1:
    return values
  return values[0] if h is None else values[:h]


def out_heads(*layout):
  """The head axis of an operator's output from its operands' (None where none has one)."""
  if all(h is None for h in layout):
    return None
  return max(h or 1 for h in layout)


def lead(x, ndim, heads):
  """float64 [heads or 1, ...] of an operand of trailing rank ndim, with no head axis or one of
  1 or `heads`."""
  x = np.asarray(x, np.float64)
  if x.ndim == ndim:
    x = x[None]
  return np.broadcast_to(x, (heads or 1,) + x.shape[1:])


def shaped(ref, heads):
  """A reference [H, ...] as the operator returns it for output head axis `heads`."""
  return ref[0] if heads is None else ref[:heads]


def unbcast(g, like):
  """A float64 gradient [H, ...] summed to the shape of its operand `like`."""
  like = np.shape(like)
  if len(like) == g.ndim - 1:
    return g.sum(0)
  return g if like[0] == g.shape[0] else g.sum(0, keepdims=True)


def T(x):
  return np.swapaxes(x, -1, -2)


# -- references (float64, dense) ---------------------------------------------------------------
def softmax_ref(mask, logits):
  """Row softmax of [H, m, n] logits over the mask's entries; rows without entries give 0."""
  has = mask.any(-1)
  masked = np.where(mask, logits, -np.inf)
  top = np.where(has, masked.max(-1, initial=-np.inf), 0.0)
  e = np.where(mask, np.exp(masked - top[..., None]), 0.0)
  return e / np.where(has, e.sum(-1), 1.0)[..., None]


def softmax_tangent_ref(p, t):
  """The row softmax's derivative at P along logits t (dense): P (t - rowsum(P t)). It is
  self-adjoint, so also the gradient of <t, softmax> for a cotangent t."""
  return p * (t - (p * t).sum(-1, keepdims=True))


# -- one operator's check: inputs, program (jitted with the others'), verification ------------
@dataclasses.dataclass
class Check:
  inputs: dict
  program: Callable  # (A, inputs) -> outputs, traced inside one jit with the other checks'
  verify: Callable  # (host outputs) -> None


def run_checks(A, checks: dict) -> None:
  """One compiled program for all checks (compiling dominates the file's time), then each
  check's comparison."""

  @jax.jit
  def program(A, inputs):
    return {name: c.program(A, inputs[name]) for name, c in checks.items()}

  outputs = program(A, {name: c.inputs for name, c in checks.items()})
  for name, c in checks.items():
    c.verify(jax.tree.map(np.asarray, outputs[name]))


def assert_zero_rows(out, rows, what):
  """Exact zeros in rows `rows` (a boolean mask over the second-to-last axis)."""
  out = np.asarray(out)
  assert np.all(out[..., rows, :] == 0), f"{what}: nonzero in a row without entries"


# -- SpMM: A @ X, X @ A -----------------------------------------------------------------------
def spmm_check(case: Case, rng, dtype=np.float32, tol=TOL, rmatmul=True, vector=False) -> Check:
  """spmm and A @ X (forward, gradients, JVP), and with `rmatmul` X @ A (forward, gradients;
  A^T's value permutation costs most of this check's compile time), with `vector` also x @ A
  for a vector x."""
  (m, n), H = case.shape, case.heads
  hv, hx = head_layout(rng, H, 2)
  d, k = int(rng.integers(1, 20)), int(rng.integers(1, 5))
  ho = out_heads(hv, hx)
  ins = dict(
    x=normal(rng, hx, (n, d), dtype),
    w=normal(rng, ho, (m, d), dtype),
    tv=normal(rng, hv, (case.A.nnz,), dtype),
    tx=normal(rng, hx, (n, d), dtype),
    xl=normal(rng, None, (k, m), dtype),
    wl=normal(rng, hv, (k, n), dtype),
  )

  def program(A, i):
    v = pick(A.values, hv)
    spmm = lambda v, x: jst.spmm(A.with_values(v), x)
    out = dict(
      y=spmm(v, i["x"]),
      matmul=A.with_values(v) @ i["x"],
      grad=jax.grad(lambda v, x: jnp.sum(spmm(v, x) * i["w"]), (0, 1))(v, i["x"]),
      jvp=jax.jvp(spmm, (v, i["x"]), (i["tv"], i["tx"]))[1],
    )
    if rmatmul:
      left = lambda v, xl: xl @ A.with_values(v)
      out["rmatmul"] = left(v, i["xl"])
      if vector:
        out["rmatmul_vec"] = left(v, i["xl"][0])
      out["rgrad"] = jax.grad(lambda v, xl: jnp.sum(left(v, xl) * i["wl"]), (0, 1))(v, i["xl"])
    return out

  def verify(got):
    v = pick(np.asarray(case.A.values), hv)
    D, X, W = lead(case.scatter(v), 2, ho), lead(ins["x"], 2, ho), lead(ins["w"], 2, ho)
    assert got["y"].dtype == dtype, f"spmm: dtype {got['y'].dtype}"
    assert_close(got["y"], shaped(D @ X, ho), tol, "spmm")
    np.testing.assert_array_equal(got["matmul"], got["y"], "A @ X differs from spmm")
    gv, gx = got["grad"]
    assert_close(gv, unbcast(case.gather(W @ T(X)), v), tol, "spmm: d/dvalues")
    assert_close(gx, unbcast(T(D) @ W, ins["x"]), tol, "spmm: d/dX")
    TV, TX = lead(case.scatter(ins["tv"]), 2, ho), lead(ins["tx"], 2, ho)
    assert_close(got["jvp"], shaped(TV @ X + D @ TX, ho), tol, "spmm: jvp")
    assert_zero_rows(got["y"], ~case.mask.any(1), "spmm")
    if not rmatmul:
      return
    # X @ A (A^T's pattern): [k, m] @ [m, n], heads from A's values
    XL, Dv, WL = np.asarray(ins["xl"], np.float64), D[: hv or 1], lead(ins["wl"], 2, hv)
    assert_close(got["rmatmul"], shaped(XL @ Dv, hv), tol, "X @ A")
    if vector:
      assert_close(got["rmatmul_vec"], shaped((XL @ Dv)[:, 0], hv), tol, "x @ A (x a vector)")
    gv, gxl = got["rgrad"]
    assert_close(gv, unbcast(case.gather(T(XL) @ WL), v), tol, "X @ A: d/dvalues")
    assert_close(gxl, (WL @ T(Dv)).sum(0), tol, "X @ A: d/dX")

  return Check(ins, program, verify)


# -- SDDMM ------------------------------------------------------------------------------------
def sddmm_check(case: Case, rng, dtype=np.float32, tol=TOL) -> Check:
  (m, n), H, nnz = case.shape, case.heads, case.A.nnz
  hx, hy, hv = head_layout(rng, H, 3)
  d = int(rng.integers(1, 20))
  hs, ho = out_heads(hx, hy), out_heads(hx, hy, hv)  # plain and scaled by A's values
  ins = dict(
    x=normal(rng, hx, (m, d), dtype),
    y=normal(rng, hy, (n, d), dtype),
    w=normal(rng, ho, (nnz,), dtype),
    tx=normal(rng, hx, (m, d), dtype),
    ty=normal(rng, hy, (n, d), dtype),
    tv=normal(rng, hv, (nnz,), dtype),
  )
  wide = dtype not in (np.float32, np.float64)  # preferred_element_type=float32 applies
  if wide:
    ins["w32"] = normal(rng, hs, (nnz,), np.float32)

  def program(A, i):
    v = pick(A.values, hv)
    scaled = lambda x, y, v: jst.sddmm(A.with_values(v), x, y, scale_by_values=True).values
    out = dict(
      s=jst.sddmm(A.with_values(v), i["x"], i["y"]).values,
      scaled=scaled(i["x"], i["y"], v),
      grad=jax.grad(lambda *a: jnp.sum(scaled(*a) * i["w"]), (0, 1, 2))(i["x"], i["y"], v),
      jvp=jax.jvp(scaled, (i["x"], i["y"], v), (i["tx"], i["ty"], i["tv"]))[1],
    )
    if wide:
      f32 = lambda x, y: jst.sddmm(A, x, y, preferred_element_type=jnp.float32).values
      out["f32"] = f32(i["x"], i["y"])
      out["f32_grad"] = jax.grad(lambda x, y: jnp.sum(f32(x, y) * i["w32"]), (0, 1))(i["x"], i["y"])
    else:  # X's own dtype asked for
      out["same"] = jst.sddmm(A, i["x"], i["y"], preferred_element_type=dtype).values
    return out

  def verify(got):
    v = pick(np.asarray(case.A.values), hv)
    X, Y, V = lead(ins["x"], 2, ho), lead(ins["y"], 2, ho), lead(v, 1, ho)
    S = case.gather(X @ T(Y))  # [H, nnz]
    assert got["s"].dtype == dtype and got["scaled"].dtype == dtype
    assert_close(got["s"], shaped(S, hs), tol, "sddmm")
    assert_close(got["scaled"], shaped(S * V, ho), tol, "sddmm(scale_by_values)")
    Wv = lead(ins["w"], 1, ho)
    G = case.scatter(Wv * V)
    gx, gy, gv = got["grad"]
    assert_close(gx, unbcast(G @ Y, ins["x"]), tol, "sddmm: d/dX")
    assert_close(gy, unbcast(T(G) @ X, ins["y"]), tol, "sddmm: d/dY")
    assert_close(gv, unbcast(Wv * S, v), tol, "sddmm: d/dvalues")
    TX, TY, TV = lead(ins["tx"], 2, ho), lead(ins["ty"], 2, ho), lead(ins["tv"], 1, ho)
    dS = case.gather(TX @ T(Y) + X @ T(TY))
    assert_close(got["jvp"], shaped(dS * V + S * TV, ho), tol, "sddmm: jvp")
    if not wide:
      assert got["same"].dtype == dtype
      assert_close(got["same"], shaped(S, hs), tol, "sddmm(preferred_element_type=X's dtype)")
    if wide:  # float32 out of the fp32 accumulator: products of 16-bit numbers are exact
      assert got["f32"].dtype == np.float32
      assert_close(got["f32"], shaped(S, hs), 1e-5, "sddmm(preferred_element_type=float32)")
      G = case.scatter(lead(ins["w32"], 1, hs))
      gx, gy = got["f32_grad"]
      assert gx.dtype == dtype
      assert_close(gx, unbcast(G @ Y[: hs or 1], ins["x"]), tol, "sddmm(float32 out): d/dX")
      assert_close(gy, unbcast(T(G) @ X[: hs or 1], ins["y"]), tol, "sddmm(float32 out): d/dY")

  return Check(ins, program, verify)


# -- edge softmax -----------------------------------------------------------------------------
def softmax_check(case: Case, rng, dtype=np.float32, tol=TOL) -> Check:
  (hv,) = head_layout(rng, case.heads, 1)
  nnz = case.A.nnz
  ins = dict(
    v=normal(rng, hv, (nnz,), dtype, scale=3.0),
    w=normal(rng, hv, (nnz,), dtype),
    t=normal(rng, hv, (nnz,), dtype),
  )

  def program(A, i):
    f = lambda v: jst.edge_softmax(A, v).values
    Y = jst.edge_softmax(A.with_values(i["v"]))
    return dict(
      y=Y.values,
      dense=Y.todense(),
      y_arg=f(i["v"]),
      grad=jax.grad(lambda v: jnp.sum(f(v) * i["w"]))(i["v"]),
      jvp=jax.jvp(f, (i["v"],), (i["t"],))[1],
    )

  def verify(got):
    P = softmax_ref(case.mask, case.scatter(ins["v"]))  # [H, m, n]
    shape = ins["v"].shape
    assert got["y"].dtype == dtype
    assert_close(got["y"], case.gather(P).reshape(shape), tol, "edge_softmax")
    np.testing.assert_array_equal(got["y_arg"], got["y"], "edge_softmax(A, values) differs")
    assert_close(got["dense"], P.reshape(got["dense"].shape), tol, "edge_softmax: todense")
    assert_zero_rows(got["dense"], ~case.mask.any(1), "edge_softmax")
    ref = case.gather(softmax_tangent_ref(P, case.scatter(ins["w"])))
    assert_close(got["grad"], ref.reshape(shape), tol, "edge_softmax: d/dvalues")
    ref = case.gather(softmax_tangent_ref(P, case.scatter(ins["t"])))
    assert_close(got["jvp"], ref.reshape(shape), tol, "edge_softmax: jvp")

  return Check(ins, program, verify)


# -- sparse attention -------------------------------------------------------------------------
def attention_check(case: Case, rng, dtype=np.float32, tol=TOL, bias_derivatives=True) -> Check:
  """Two calls: with a bias and an explicit scale, and without a bias at the default scale
  1/sqrt(d); the forward of both, and gradients and JVP of the first (`bias_derivatives`) or of
  the second. A matrix without nonzeros takes no bias (test_attention_bias_without_nonzeros)."""
  (m, n), H, nnz = case.shape, case.heads, case.A.nnz
  hq, hk, hv, hb = head_layout(rng, H, 4)
  if not nnz:
    hb, bias_derivatives = None, False
  d, dv = int(rng.integers(1, 20)), int(rng.integers(1, 20))
  scale = float(rng.uniform(0.2, 1.0))
  # the two calls: (bias or None, scale or None (the default), output heads)
  calls = dict(
    bias=("b" if nnz else None, scale, out_heads(hq, hk, hv, hb)),
    plain=(None, None, out_heads(hq, hk, hv)),
  )
  full = "bias" if bias_derivatives else "plain"
  ins = dict(
    q=normal(rng, hq, (m, d), dtype),
    k=normal(rng, hk, (n, d), dtype),
    v=normal(rng, hv, (n, dv), dtype),
    b=normal(rng, hb, (nnz,), dtype),
    w=normal(rng, calls[full][2], (m, dv), dtype),
    tq=normal(rng, hq, (m, d), dtype),
    tk=normal(rng, hk, (n, d), dtype),
    tv=normal(rng, hv, (n, dv), dtype),
    tb=normal(rng, hb, (nnz,), dtype),
  )
  names = ("q", "k", "v", "b") if calls[full][0] else ("q", "k", "v")

  def program(A, i):
    def call(name):
      bias, s, _ = calls[name]
      if bias is None:
        return lambda q, k, v: jst.sparse_attention(A, q, k, v, scale=s)
      return lambda q, k, v, b: jst.sparse_attention(A, q, k, v, bias=b, scale=s)

    out = {
      name: call(name)(*(i[x] for x in "qkvb"[: 3 + (c[0] is not None)]))
      for name, c in calls.items()
    }
    f, args = call(full), [i[x] for x in names]
    out["grad"] = jax.grad(lambda *a: jnp.sum(f(*a) * i["w"]), tuple(range(len(args))))(*args)
    out["jvp"] = jax.jvp(f, args, [i["t" + x] for x in names])[1]
    return out

  def verify(got):
    empty_rows, empty_cols = ~case.mask.any(1), ~case.mask.any(0)
    for name, (bias, s, ho) in calls.items():
      what = f"sparse_attention ({'bias' if bias else 'no bias'}, scale={s or 'default'})"
      s = 1 / np.sqrt(d) if s is None else s
      Q, K, V = (lead(ins[x], 2, ho) for x in "qkv")
      B = 0.0 if bias is None else lead(case.scatter(ins["b"]), 2, ho)
      P = softmax_ref(case.mask, s * Q @ T(K) + B)
      assert got[name].dtype == dtype
      assert_close(got[name], shaped(P @ V, ho), tol, what)
      assert_zero_rows(got[name], empty_rows, what)  # rows without entries give zeros
      if name != full:
        continue
      W = lead(ins["w"], 2, ho)
      dS = softmax_tangent_ref(P, W @ T(V))
      grads = (s * dS @ K, s * T(dS) @ Q, T(P) @ W, case.gather(dS))
      gtol = TOL_ATTENTION_GRAD if dtype == np.float32 else tol
      for x, g, r in zip(names, got["grad"], grads):
        assert_close(g, unbcast(r, ins[x]), gtol, f"{what}: d/d{x}")
      TQ, TK, TV = (lead(ins[x], 2, ho) for x in ("tq", "tk", "tv"))
      TB = 0.0 if bias is None else lead(case.scatter(ins["tb"]), 2, ho)
      dL = s * (TQ @ T(K) + Q @ T(TK)) + TB
      ref = softmax_tangent_ref(P, dL) @ V + P @ TV
      assert_close(got["jvp"], shaped(ref, ho), tol, f"{what}: jvp")
      # and zero tangents and gradients there; K and V rows no row reads get zero gradients
      assert_zero_rows(got["jvp"], empty_rows, f"{what}: jvp")
      assert_zero_rows(got["grad"][0], empty_rows, f"{what}: dQ")
      assert_zero_rows(got["grad"][1], empty_cols, f"{what}: dK")
      assert_zero_rows(got["grad"][2], empty_cols, f"{what}: dV")

  return Check(ins, program, verify)


def all_checks(case: Case, rng, dtype=np.float32, tol=TOL, rmatmul=True) -> dict:
  checks = dict(
    spmm=spmm_check(case, rng, dtype, tol, rmatmul),
    sddmm=sddmm_check(case, rng, dtype, tol),
  )
  # Without nonzeros, edge softmax and a bias are refused (test_*_without_nonzeros).
  if case.A.nnz:
    checks["edge_softmax"] = softmax_check(case, rng, dtype, tol)
  # the bias's derivatives with heads, the default scale's without
  checks["attention"] = attention_check(case, rng, dtype, tol, case.heads is not None)
  return checks


def variant_check(case: Case, rng) -> Check:
  """Every operator's forward without heads: a FormatOptions variant's share of
  test_format_variants (the derivatives meet every variant in test_operators_match_float64)."""
  (m, n), nnz = case.shape, case.A.nnz
  d = int(rng.integers(1, 20))
  ins = dict(x=normal(rng, None, (n, d)), q=normal(rng, None, (m, d)), b=normal(rng, None, (nnz,)))

  def program(A, i):
    return dict(
      spmm=jst.spmm(A, i["x"]),
      sddmm=jst.sddmm(A, i["q"], i["x"]).values,
      softmax=jst.edge_softmax(A, i["b"]).values,
      attention=jst.sparse_attention(A, i["q"], i["x"], i["x"], bias=i["b"]),
    )

  def verify(got):
    X, Qm = (np.asarray(ins[k], np.float64)[None] for k in ("x", "q"))
    assert_close(got["spmm"], (case.scatter(case.A.values) @ X)[0], TOL, "spmm")
    assert_close(got["sddmm"], case.gather(Qm @ T(X))[0], TOL, "sddmm")
    B = case.scatter(ins["b"])
    assert_close(got["softmax"], case.gather(softmax_ref(case.mask, B))[0], TOL, "edge_softmax")
    P = softmax_ref(case.mask, Qm @ T(X) / np.sqrt(d) + B)
    assert_close(got["attention"], (P @ X)[0], TOL, "sparse_attention")

  return Check(ins, program, verify)


# -- the tests --------------------------------------------------------------------------------
@pytest.mark.parametrize("draw", range(DRAWS))
@pytest.mark.parametrize("kind", KINDS)
def test_operators_match_float64(rng, kind, draw):
  case = draw_case(rng, kind, draw)
  # X @ A on the draws without heads (the other half of the time budget goes to heads)
  run_checks(case.A, all_checks(case, rng, rmatmul=case.heads is None))


@pytest.mark.parametrize("kind", ["mixed", "grouped_windows"])
def test_format_variants(rng, kind):
  """Every FormatOptions variant that applies, on one pattern: all matrices in one program."""
  rows, cols, shape = draw_pattern(rng, kind)
  values = rng.standard_normal(rows.size).astype(np.float32)
  cases, checks = {}, {}
  for fo in format_variants(rows, cols, shape):
    A = SparseMatrix.from_coo(rows, cols, values, shape=shape, format_options=fo)
    cases[repr(fo)] = case = Case(rows, cols, shape, A, None)
    check_format(case, values)
    checks[repr(fo)] = variant_check(case, rng)

  @jax.jit
  def program(matrices, inputs):
    return {k: checks[k].program(matrices[k], inputs[k]) for k in checks}

  got = program({k: c.A for k, c in cases.items()}, {k: c.inputs for k, c in checks.items()})
  for k, c in checks.items():
    try:
      c.verify(jax.tree.map(np.asarray, got[k]))
    except AssertionError as e:
      raise AssertionError(f"{k}: {e}") from None


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_16bit_operands(rng, dtype):
  """16-bit operands against float64 of the same (rounded) numbers, with heads; SDDMM also
  with preferred_element_type=float32."""
  case = draw_case(rng, "mixed", 1, dtype=dtype)
  run_checks(case.A, all_checks(case, rng, dtype, TOL_16[dtype], rmatmul=False))


def test_float64_spmm_sddmm(rng, x64):
  """SpMM and SDDMM in float64 on CPU (x64): double accumulation."""
  case = draw_case(rng, "mixed", 1, dtype=np.float64)
  assert case.A.values.dtype == np.float64
  run_checks(
    case.A,
    dict(
      spmm=spmm_check(case, rng, np.float64, 1e-12, vector=True),
      sddmm=sddmm_check(case, rng, np.float64, 1e-12),
    ),
  )


# Matrices without nonzeros (0 x n and m x 0 included) and the head count of their values.
EMPTY = [((6, 9), None), ((0, 5), 2), ((4, 0), 3)]


@pytest.mark.parametrize("shape,heads", EMPTY)
def test_edge_softmax_without_nonzeros(rng, shape, heads):
  values = np.zeros((0,) if heads is None else (heads, 0), np.float32)
  A = SparseMatrix.from_coo([], [], values, shape=shape)
  Y = jst.edge_softmax(A)
  assert Y.values.shape == values.shape and Y.values.dtype == np.float32
  assert_close(Y.todense(), np.zeros(values.shape[:-1] + shape), 0, "edge_softmax todense")
  g = jax.grad(lambda v: jnp.sum(jst.edge_softmax(A, v).values))(A.values)
  assert g.shape == values.shape


@pytest.mark.parametrize("shape,heads", EMPTY)
def test_attention_bias_without_nonzeros(rng, shape, heads):
  (m, n), d = shape, 3
  A = SparseMatrix.from_coo([], [], shape=shape)
  q, k, v = normal(rng, None, (m, d)), normal(rng, None, (n, d)), normal(rng, None, (n, 4))
  bias = np.zeros((0,) if heads is None else (heads, 0), np.float32)
  f = lambda q, k, v, b: jst.sparse_attention(A, q, k, v, bias=b)
  o = f(q, k, v, bias)
  assert o.shape == ((m, 4) if heads is None else (heads, m, 4))
  assert not np.any(np.asarray(o))  # rows without entries give zeros
  grads = jax.grad(lambda *a: jnp.sum(f(*a)), (0, 1, 2, 3))(q, k, v, bias)
  for g, x in zip(grads, (q, k, v, bias)):
    assert g.shape == x.shape and not np.any(np.asarray(g))
