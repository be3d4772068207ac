"""A small SpMM/SDDMM/edge-softmax/attention case for `compute-sanitizer --tool memcheck`
(scripts/gpu_check.sh --sanitize): every dtype and precision, a split window, a partial last
window, d not a multiple of 8, rows that lane groups, CTAs and several CTAs walk, and a graph
past 2^18 nonzeros whose row kernels run streams; then every operator and kernel family on
patterns whose integer arrays were corrupted inside jax.jit (`corrupt`: the kernels must stay in
bounds whatever those arrays hold; the results are ignored). `python3 -m scripts.sanitize_case
PART ...` runs those parts alone (main, streams, grads: the attention backward's grouped and
large-graph parts, corrupt); `--compile-only` lowers and compiles the corrupt part's programs
without running them (any machine). Buffers come from plain cudaMalloc (platform allocator) so
out-of-bounds accesses are seen.
"""

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable

if __name__ == "__main__":  # before jax starts its backends: plain cudaMalloc per buffer
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
  rows = jst.KernelOptions(spmm="rows", sddmm="rows")
  for dtype, d in ((jnp.float16, 64), (jnp.bfloat16, 5), (jnp.float32, 40)):
    q = jnp.asarray(rng.standard_normal((2, big_m, d)), dtype)
    x = jnp.asarray(rng.standard_normal((big_n, d)), dtype)
    s = jax.jit(lambda B, q, x: jst.sddmm(B, q, x, precision="highest", options=rows).values)(
      B, q, x
    )
    serr = sddmm_err(B, q, x, s)
    y = jax.jit(lambda B, x: jst.spmm(B, x, options=rows))(B.astype(dtype), x)
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


def main_case(rng) -> None:
  """Every dtype and precision on a small graph, then streams(), grouped(), grads_large() and
  edge softmax and attention finite in every dtype."""
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
      out = jax.jit(lambda A, x: jst.spmm(A, x, precision=precision))(A.astype(dtype), x)
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
  tc = jst.KernelOptions(spmm="windows")
  for dtype, d in ((jnp.float16, 128), (jnp.float32, 64), (jnp.bfloat16, 64)):
    x = jnp.asarray(rng.standard_normal((n, d)), dtype)
    out = jax.jit(lambda A, x: jst.spmm(A, x, options=tc))(A.astype(dtype), x)
    err = spmm_err(A, x, out, dtype)
    print(f"{np.dtype(dtype).name:9s} d={d:3d} spmm tensor cores {err:.2e}")
    assert err < 2e-2, err
  # the max / min SpMM and its gradients, every dtype; d = 40: a partial feature chunk
  for dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
    x = jnp.asarray(rng.standard_normal((n, 40)), dtype)
    for reduce in ("max", "min"):
      ext = lambda w, x, reduce=reduce: jst.spmm(A.with_values(w), x, reduce=reduce)  # noqa: E731
      w = A.values.astype(dtype)
      out, grads = jax.jit(
        lambda w, x, ext=ext: (
          ext(w, x),
          jax.grad(lambda w, x: jnp.sum(ext(w, x).astype(jnp.float32)), (0, 1))(w, x),
        )
      )(w, x)
      ok = all(bool(jnp.all(jnp.isfinite(a.astype(jnp.float32)))) for a in (out, *grads))
      print(f"{np.dtype(dtype).name:9s} spmm reduce={reduce} finite: {ok}")
      assert ok
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


# -- corrupt patterns ---------------------------------------------------------------------------
# Inside a traced function a SparseMatrix's integer arrays are tracers, so nothing checks their
# values, and user code can change them (jax.tree.map(lambda a, b: a + b, A, A) adds them too).
# Every kernel must stay in bounds whatever they hold (cuda/common/bounds.cuh); what it
# computes from them is undefined. Each case below changes one array (or one column of one) of A
# or A^T inside jax.jit, keeping its dtype and shape; one program per graph and dtype runs every
# operator and kernel family on the corrupted matrix, the case picked by a traced index.

I32_MAX, I32_MIN = int(np.iinfo(np.int32).max), int(np.iinfo(np.int32).min)


def _few(n: int) -> np.ndarray:
  """A few positions of an axis of n: its ends and its middle."""
  return np.unique(np.clip([0, 1, n // 2, n - 2, n - 1], 0, max(n - 1, 0)))


def _extremes(x):
  """A few elements set to int32's extremes and to -1, the rest kept. (Setting a few rather than
  all keeps a corrupt range end from making every item walk the whole array.)"""
  f = _few(x.shape[0])
  return x.at[f[0::3]].set(I32_MAX).at[f[1::3]].set(I32_MIN).at[f[2::3]].set(-1)


@dataclasses.dataclass(frozen=True)
class Corruption:
  """`fn` rewrites leaf `field` of orientation `side` ("a": A's pattern, "t": A^T's, "top": the
  matrix's own arrays such as perm_t); column `col` only where given."""

  name: str
  side: str
  field: str
  fn: Callable
  col: int | None = None


# Per-element rewrites of any int32 column: off by one (pointers one past the end, columns = n,
# positions = nnz), garbage bits (values past every bound, or negative), a few extremes.
_INT_KINDS = {
  "plus1": lambda x: x + 1,
  "xor": lambda x: x ^ np.int32(0x2D2D2D2D),
  "extremes": _extremes,
}
# Whole-array rewrites where the element kinds leave cases out: all past the end, all negative,
# decreasing pointers, items in reverse order.
_BIG = 1 << 24


def _column_cases(side: str, field: str, cols: int | None, kinds: dict) -> list[Corruption]:
  if cols is None:
    return [Corruption(f"{side}.{field} {k}", side, field, f) for k, f in kinds.items()]
  return [
    Corruption(f"{side}.{field}[:, {c}] {k}", side, field, f, c)
    for c in range(cols)
    for k, f in kinds.items()
  ]


def _side_cases(side: str) -> list[Corruption]:
  """The corruptions of one orientation's arrays."""
  cases = []
  for field in ("window_col_ptr", "window_block_ptr", "block_value_ptr"):
    cases += _column_cases(side, field, None, {**_INT_KINDS, "reversed": lambda x: x[::-1]})
  cases += _column_cases(
    side,
    "window_cols",
    None,
    {**_INT_KINDS, "past_n": lambda x: x + _BIG, "negative": lambda x: -x - 1},
  )
  cases += _column_cases(
    side,
    "block_bitmap",
    None,
    {
      "all_bits": lambda x: jnp.full_like(x, 0xFFFFFFFF),
      "xor": lambda x: x ^ np.uint32(0x5A5A5A5A),
      "shifted": lambda x: (x << 1) | np.uint32(1),
    },
  )
  # schedule items (window, block_begin, block_end, split, col_begin, col_end, first, pieces)
  cases += _column_cases(side, "schedule", 8, _INT_KINDS)
  idx = lambda x: jnp.arange(x.shape[0], dtype=jnp.int32)  # noqa: E731
  cases += [
    Corruption(f"{side}.schedule reversed", side, "schedule", lambda x: x[::-1]),
    # pieces that disagree (a CTA merge must not wait for a warp that does not come)
    Corruption(f"{side}.schedule pieces+odd", side, "schedule", lambda x: x + idx(x) % 2, 7),
    Corruption(f"{side}.schedule split^odd", side, "schedule", lambda x: x ^ idx(x) % 2, 3),
    Corruption(f"{side}.schedule first=group", side, "schedule", lambda x: x // 4 * 4, 6),
    Corruption(f"{side}.schedule first=item-1", side, "schedule", lambda x: idx(x) - 1, 6),
    Corruption(
      f"{side}.schedule all split, 4 pieces",
      side,
      "schedule",
      lambda x: x.at[:, 3].set(1).at[:, 6].set(idx(x) // 4 * 4).at[:, 7].set(4),
    ),
  ]
  cases += [
    Corruption(f"{side}.rows plus9", side, "rows", lambda x: x + 9),
    Corruption(f"{side}.rows negative", side, "rows", lambda x: -x - 1),
  ]
  # the row view: entries (column, position); items (row, begin, end, slot)
  cases += _column_cases(
    side,
    "row_entries",
    2,
    {**_INT_KINDS, "past_end": lambda x: x + _BIG, "negative": lambda x: -x - 1},
  )

  # row_schedule items (row, begin, end, slot). Garbage in a range end makes the item walk to the
  # array's end: a few items only, else the large graph would take quadratic time.
  def few_xor(x):
    f = _few(x.shape[0])
    return x.at[f].set(x[f] ^ np.int32(0x2D2D2D2D))

  for c in _column_cases(side, "row_schedule", 4, _INT_KINDS):
    ends = c.col in (1, 2) and c.name.endswith("xor")
    cases.append(dataclasses.replace(c, fn=few_xor) if ends else c)
  cases += [
    Corruption(f"{side}.row_schedule reversed", side, "row_schedule", lambda x: x[::-1]),
    Corruption(
      f"{side}.row_schedule begin<->end",
      side,
      "row_schedule",
      lambda x: x.at[:, 1].set(x[:, 2]).at[:, 2].set(x[:, 1]),
    ),
    Corruption(f"{side}.row_schedule row past m", side, "row_schedule", lambda x: x + _BIG, 0),
    Corruption(f"{side}.row_schedule slot 0", side, "row_schedule", jnp.zeros_like, 3),
    Corruption(f"{side}.row_schedule slot big", side, "row_schedule", lambda x: x + _BIG, 3),
    Corruption(f"{side}.row_schedule slot -5", side, "row_schedule", lambda x: x * 0 - 5, 3),
  ]
  return cases


def corruptions() -> list[Corruption]:
  """Every case: A's arrays, A^T's (the gradients read them), perm_t, and the whole matrix added
  to itself (jax.tree.map(lambda a, b: a + b, A, A), side "all")."""
  top = [
    Corruption(f"perm_t {k}", "top", "perm_t", f)
    for k, f in {**_INT_KINDS, "past_end": lambda x: x + _BIG, "negative": lambda x: -x - 1}.items()
  ]
  return [*_side_cases("a"), *_side_cases("t"), *top, Corruption("A + A", "all", "", None)]


def corrupted(A, case, cases: list[Corruption]):
  """A with cases[case] applied (case: a traced int32 index), rebuilt from its leaves with
  tree_unflatten: the same dtypes and shapes, any values."""

  def leaf(x, side, field):
    for k, c in enumerate(cases):
      if c.side == side and c.field == field:
        y = c.fn(x) if c.col is None else x.at[:, c.col].set(c.fn(x[:, c.col]))
        x = jnp.where(case == k, y.astype(x.dtype), x)
    return x

  def pattern(P, side):
    return type(P)(*(leaf(x, side, f) for f, x in zip(P._fields, P)))

  leaves = jax.tree_util.tree_leaves(
    (
      A.values,
      pattern(A.pattern, "a"),
      pattern(A.pattern_t, "t"),
      leaf(A.perm_t, "top", "perm_t"),
      A.perm_t_inv,
      A.input_to_format,
    )
  )
  assert [(x.shape, x.dtype) for x in leaves] == [
    (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(A)
  ], "SparseMatrix's leaves are not in the order corrupted() assumes"
  B = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(A), leaves)
  doubled = jax.tree.map(lambda a, b: a + b, A, A)
  k = next(i for i, c in enumerate(cases) if c.side == "all")
  return jax.tree.map(lambda b, d: jnp.where(case == k, d, b), B, doubled)


def corrupt_program(dtype, cases: list[Corruption]):
  """One program: every operator and kernel family of `dtype` on the corrupted matrix (case: a
  traced index into `cases`), with gradients (A^T's kernels, the backward kernels) and a jvp."""
  f32 = jnp.float32
  half = dtype != jnp.float32
  # The row kernels, the composed backward and split windows done whole by their first piece;
  # the window kernels, the fused backward and split windows merged.
  rows_k = jst.KernelOptions(
    spmm="rows", sddmm="rows", attention_backward="composed", merge_split_windows=False
  )
  tc_k = jst.KernelOptions(spmm="windows", sddmm="windows", attention_backward="fused")

  def sum32(y):
    return jnp.sum(y.astype(f32))

  def program(A, case, x, x_odd, q, k, v, bias):
    B = corrupted(A, case, cases)
    w = B.values.astype(dtype)
    out = []
    for opts in (rows_k, tc_k):
      for prec in (None,) if half else (None, "highest"):

        def mm(w, x, opts=opts, prec=prec):
          return jst.spmm(B.with_values(w), x, precision=prec, options=opts)

        out += [mm(w, x), *jax.grad(lambda w, x, mm=mm: sum32(mm(w, x)), argnums=(0, 1))(w, x)]
        out.append(jst.sddmm(B, q[0], x, precision=prec, options=opts).values)
    # rows that are not 16-byte multiples: the tensor-core SpMM's register gathers
    out.append(jst.spmm(B.with_values(w), x_odd, options=tc_k))
    # the max / min SpMM and its gradients (gathers through the winning positions)
    for reduce in ("max", "min"):

      def ext(w, x, reduce=reduce):
        return jst.spmm(B.with_values(w), x, reduce=reduce)

      out += [ext(w, x_odd), *jax.grad(lambda w, x, ext=ext: sum32(ext(w, x)), (0, 1))(w, x)]

    def soft(w):
      return jst.edge_softmax(B.with_values(w)).values

    out += [soft(w), jax.grad(lambda w: sum32(soft(w) * w))(w)]
    # 16-bit: the tensor-core forward, the fused and the composed backward; float32: the scalar
    # forward and the composed backward
    for opts in (rows_k, tc_k) if half else (rows_k,):

      def att(q, k, v, b, opts=opts):
        return jst.sparse_attention(B, q, k, v, bias=b, options=opts)

      out.append(att(q, k, v, bias))
      out += jax.grad(lambda *a, att=att: sum32(att(*a)), argnums=(0, 1, 2, 3))(q, k, v, bias)
    out.append(jax.jvp(lambda q: jst.sparse_attention(B, q, k, v, bias=bias), (q,), (q,))[1])
    return out

  return program


def corrupt_graphs(rng):
  """(name, SparseMatrix): split windows merged through workspaces and rows cut into several CTA
  items (small), windows merged inside CTAs (grouped), and row streams past 2^18 nonzeros."""
  m, n = 21, 3001
  rows = np.concatenate([np.repeat(np.arange(8), 400), np.full(1300, 9), rng.integers(8, m, 60)])
  small = jst.SparseMatrix.from_coo(rows, rng.integers(0, n, rows.size), shape=(m, n))
  r, c, shape = window_blocks_coo(rng, 32, n=2000, keep=0.5)
  grouped = jst.SparseMatrix.from_coo(r, c, shape=shape)
  assert grouped.grouped[0], "window_blocks_coo should give a grouped schedule"
  big_m, big_n = 17011, 2003
  deg = rng.integers(0, 33, big_m)
  deg[3], deg[[7, 8, 9]] = 1500, (40, 64, 65)
  br = np.repeat(np.arange(big_m), deg)
  large = jst.SparseMatrix.from_coo(br, rng.integers(0, big_n, br.size), shape=(big_m, big_n))
  assert (1 << 18) <= large.nnz, large.nnz
  return [("small", small), ("grouped", grouped), ("large", large)]


# (dtype, d): fp16 d = 64 and bf16 d = 128 take the tensor-core attention, float32 the scalar one
CORRUPT_DTYPES = ((jnp.float16, 64), (jnp.bfloat16, 128), (jnp.float32, 40))


def corrupt_operands(rng, A, dtype, d: int) -> tuple:
  """corrupt_program's dense operands for A: x [n, d], x_odd [n, 17], q [2, m, d], k and v
  [2, n, d], a float32 bias [2, nnz]."""
  m, n = A.shape
  x = jnp.asarray(rng.standard_normal((n, d)), dtype)
  x_odd = jnp.asarray(rng.standard_normal((n, 17)), dtype)
  q = jnp.asarray(rng.standard_normal((2, m, d)), dtype)
  k, v = (jnp.asarray(rng.standard_normal((2, n, d)), dtype) for _ in range(2))
  return x, x_odd, q, k, v, jnp.asarray(rng.standard_normal((2, A.nnz)), jnp.float32)


def run_corrupt_cases(
  A, dtype, operands, cases, compile_only: bool = False, picked: range | None = None
) -> int:
  """The cases of `cases` (those at the indices `picked`, default all) through one program on A
  (results waited for, then dropped); with compile_only the program is only lowered and
  compiled. Returns the number of cases run or compiled."""
  program = jax.jit(corrupt_program(dtype, cases))
  if compile_only:
    program.lower(A, jnp.int32(0), *operands).compile()
    return len(cases)
  picked = range(len(cases)) if picked is None else picked
  for i in picked:
    c = cases[i]
    try:
      jax.block_until_ready(program(A, jnp.int32(i), *operands))
    except Exception:
      print(f"sanitize_case: corrupt case {c.name!r} failed ({np.dtype(dtype).name})")
      raise
  return len(picked)


def corrupt(rng, compile_only: bool = False, shard: tuple[int, int] = (0, 1)) -> int:
  """Every case on every graph and dtype (the large graph: fp16 and float32), or with shard
  (i, k) the cases whose index is i mod k, so that k processes with i = 0..k-1 run them all
  side by side (one process under the memory checker takes longer than one device call);
  returns how many ran (or, with compile_only, were compiled without running)."""
  cases = corruptions()
  i, k = shard
  count = 0
  for name, A in corrupt_graphs(rng):
    for dtype, d in CORRUPT_DTYPES:
      if A.nnz >= 1 << 18 and dtype == jnp.bfloat16:
        continue  # the large graph's own paths are fp16's
      ops = corrupt_operands(rng, A, dtype, d)
      ran = run_corrupt_cases(A, dtype, ops, cases, compile_only, range(i, len(cases), k))
      count += ran
      print(f"corrupt: {name:8s} {np.dtype(dtype).name:9s} {ran} cases", flush=True)
  return count


PARTS = {
  "main": main_case,
  "streams": streams,
  "grads": lambda rng: (grouped(rng), grads_large(np.random.default_rng(1))),
  "corrupt": corrupt,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    prog="python3 -m scripts.sanitize_case", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument(
    "parts",
    nargs="*",
    metavar="PART",
    help=f"parts to run, of {', '.join(PARTS)} (default: main corrupt)",
  )
  parser.add_argument(
    "--compile-only",
    action="store_true",
    help="corrupt: lower and compile its programs without running them (any machine)",
  )
  parser.add_argument(
    "--shard",
    default="0/1",
    metavar="I/K",
    help="corrupt: run the cases whose index is I mod K (K processes cover them all)",
  )
  parser.add_argument(
    "--compilation-cache",
    metavar="DIR",
    help="jax's persistent compilation cache, every program kept (compile once without the "
    "memory checker, then load under it)",
  )
  args = parser.parse_args(argv)
  try:
    i, k = (int(x) for x in args.shard.split("/"))
  except ValueError:
    parser.error(f"--shard must be I/K with integers, got {args.shard!r}")
  if not 0 <= i < k:
    parser.error(f"--shard I/K needs 0 <= I < K, got {args.shard}")
  args.shard = (i, k)
  unknown = [p for p in args.parts if p not in PARTS]
  if unknown:
    parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
  args.parts = args.parts or ["main", "corrupt"]
  return args


def main(argv: list[str]) -> None:
  args = parse_args(argv)
  if args.compilation_cache:
    jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  last = "sanitize case ok"
  for part in args.parts:
    rng = np.random.default_rng(0)
    if part == "corrupt":
      n = corrupt(rng, args.compile_only, args.shard)
      last = f"sanitize_case: {n} corrupt cases {'compiled' if args.compile_only else 'ran'}"
    else:
      PARTS[part](rng)
  print(last)


if __name__ == "__main__":
  main(sys.argv[1:])
