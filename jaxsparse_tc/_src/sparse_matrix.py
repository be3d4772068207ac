"""The implementation of jaxsparse_tc.sparse_matrix, whose docstring documents it."""

from __future__ import annotations

import concurrent.futures
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src import integrity
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src.options import FormatOptions
from jaxsparse_tc._src.pattern import KernelArrays, Pattern, PatternOperands, RowView
from jaxsparse_tc._src.spmm import spmm

_MAX_ENTRIES = integrity.MAX_ENTRIES


def _check_shape(shape, rows: np.ndarray, cols: np.ndarray) -> tuple[int, int]:
  if shape is None:
    m = int(rows.max()) + 1 if rows.size else 0
    n = int(cols.max()) + 1 if cols.size else 0
    integrity.check_dims(m, n, "the shape inferred from the indices,")
    return m, n
  try:
    m, n = (int(s) for s in shape)
  except (TypeError, ValueError):
    raise ValueError(f"shape must be a pair of non-negative integers; got {shape!r}") from None
  if m < 0 or n < 0 or tuple(shape) != (m, n):
    raise ValueError(f"shape must be a pair of non-negative integers; got {shape!r}")
  integrity.check_dims(m, n)
  return m, n


def _check_indices(
  rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], *, limit_entries: bool = True
) -> None:
  """Index ranges, and (limit_entries) at most _MAX_ENTRIES entries: a sharded graph's builder
  checks each shard's entries instead."""
  if rows.size != cols.size:
    raise ValueError(f"rows and cols differ in length: {rows.size} and {cols.size}")
  if limit_entries and rows.size > _MAX_ENTRIES:
    raise ValueError(f"at most {_MAX_ENTRIES} entries are supported; got {rows.size}")
  for name, idx, bound in (("row", rows, shape[0]), ("column", cols, shape[1])):
    if idx.size == 0:
      continue
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0:
      raise ValueError(f"negative {name} index {lo}")
    if hi >= bound:
      raise ValueError(f"{name} index {hi} is out of range for shape {shape}")


def _input_values(values, count: int) -> np.ndarray:
  if values is None:
    return np.ones((count,), np.float32)
  v = np.asarray(values)
  if v.ndim not in (1, 2) or v.shape[-1] != count:
    raise ValueError(f"values must have shape [{count}] or [H, {count}]; got {v.shape}")
  if np.issubdtype(v.dtype, np.complexfloating):
    raise ValueError(f"values must be real; got dtype {v.dtype} (complex values are not supported)")
  if v.dtype != jnp.bfloat16 and not (
    np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_
  ):
    raise ValueError(f"values must be real numbers; got dtype {v.dtype}")
  if not np.issubdtype(v.dtype, np.floating) and v.dtype != jnp.bfloat16:
    v = v.astype(np.float32)
  if v.dtype == np.float64 and not jax.config.jax_enable_x64:
    if np.any(np.abs(v[np.isfinite(v)]) > np.finfo(np.float32).max):
      raise ValueError(
        "values exceed float32's range (JAX runs without x64, so float64 values become "
        "float32): scale them, or enable jax_enable_x64"
      )
    v = v.astype(np.float32)  # float64 values are kept only when JAX runs with x64
  if not np.all(np.isfinite(v.astype(np.float32))):
    raise ValueError("values must be finite (found NaN or infinity)")
  return v


def _sum_into(v: np.ndarray, index: np.ndarray, size: int) -> np.ndarray:
  """Sums input-order values into format positions (duplicate entries add up, in float64; a sum
  past the values' dtype's range is refused rather than rounded to infinity)."""
  heads = v.shape[:-1]
  flat = v.reshape((int(np.prod(heads)), v.shape[-1])).astype(np.float64)
  out = np.zeros((flat.shape[0], size))
  for h, f in enumerate(flat):
    out[h] = np.bincount(index, weights=f, minlength=size)
  limit = float(jnp.finfo(v.dtype).max)
  if out.size and np.max(np.abs(out)) > limit:
    h, k = np.unravel_index(int(np.argmax(np.abs(out))), out.shape)
    raise ValueError(
      f"duplicate entries sum to {out[h, k]:.6g} at format position {k}, past {v.dtype}'s "
      f"largest finite value {limit:.6g}: pass wider values (e.g. float32)"
    )
  return out.reshape(heads + (size,)).astype(v.dtype)


class BuiltOrientations(NamedTuple):
  """Both orientations of a pattern, on the host (build_orientations)."""

  pattern: Pattern
  pattern_t: Pattern
  perm_t: np.ndarray  # int32: A^T's position of each of A's values
  perm_t_inv: np.ndarray  # int32: A's position of each of A^T's values
  to_format: np.ndarray  # int64: the format position of each input entry (A)
  grouped: tuple  # (A's schedule grouped, A^T's)


def build_orientations(rows, cols, m: int, n: int, format_options=None) -> BuiltOrientations:
  """A's and A^T's patterns (numpy) and the permutations between their value orders. The
  builder releases the GIL: both orientations are built on two cores at once."""
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    job_t = pool.submit(pattern_lib.build, cols, rows, n, m, format_options)
    pattern, to_format, grouped = pattern_lib.build(rows, cols, m, n, format_options)
    pattern_t, to_format_t, grouped_t = job_t.result()
  nnz = pattern.rows.shape[0]
  perm_t = np.empty(nnz, np.int32)
  perm_t[to_format_t] = to_format
  perm_t_inv = np.empty(nnz, np.int32)
  perm_t_inv[to_format] = to_format_t
  return BuiltOrientations(
    pattern, pattern_t, perm_t, perm_t_inv, np.asarray(to_format, np.int64), (grouped, grouped_t)
  )


@jax.tree_util.register_pytree_node_class
class SparseMatrix:
  """A sparse m x n matrix in the 8-row-window, 8x8-bitmap-block format.

  Build once per sparsity pattern (on the host) with `from_coo`, `from_scipy` or
  `from_edge_index`; change values freely with `with_values` (inside jit too). `values` are in
  the format's own order ([nnz], or [H, nnz] for H value sets on one pattern); `rows` and
  `cols` give each value's position. The transposed pattern is built with it, for gradients.
  """

  def __init__(
    self,
    values,
    pattern: Pattern,
    pattern_t: Pattern,
    perm_t,
    perm_t_inv,
    input_to_format,
    shape: tuple[int, int],
    grouped: tuple[bool, bool] = (False, False),
    padded: bool = False,
  ):
    """A matrix from its arrays (docs/FORMAT.md). Their dtypes and shapes are checked against
    `shape`, and concrete pattern arrays' contents against the format's invariants
    (PatternError); the builders (`from_coo`, ...) are the usual way in. `padded`: the arrays
    are padded to common lengths (_src/padding.py: batches of graphs, shards), whose tails and
    repeated empty items the format's exact-cover invariants do not describe: only their dtypes
    and shapes are checked (the kernels stay in bounds whatever they hold)."""
    self._assign(
      values, pattern, pattern_t, perm_t, perm_t_inv, input_to_format, shape, grouped, padded
    )
    self._check(contents=True)

  def _assign(
    self,
    values,
    pattern,
    pattern_t,
    perm_t,
    perm_t_inv,
    input_to_format,
    shape,
    grouped,
    padded=False,
  ):
    self.values = values
    self.pattern = Pattern(*pattern) if isinstance(pattern, (tuple, list)) else pattern
    self.pattern_t = Pattern(*pattern_t) if isinstance(pattern_t, (tuple, list)) else pattern_t
    self.perm_t = perm_t
    self.perm_t_inv = perm_t_inv
    self.input_to_format = input_to_format
    self.shape = tuple(int(s) for s in shape)
    # Whether A's and A^T's schedules are grouped (pattern.window_schedule): static, so that a
    # kernel can be told at trace time that no split window needs a cross-CTA merge.
    self.grouped = tuple(bool(g) for g in grouped)
    self.padded = bool(padded)  # static too: padded patterns are checked by structure only

  @classmethod
  def _unchecked(cls, *args, **kwargs) -> "SparseMatrix":
    """A matrix from arrays known to be valid (the builders' own, or a valid matrix's)."""
    self = cls.__new__(cls)
    self._assign(*args, **kwargs)
    return self

  def _pattern_leaves(self) -> tuple:
    return (*self.pattern, *self.pattern_t, self.perm_t, self.perm_t_inv, self.input_to_format)

  def _check(self, contents: bool) -> None:
    """check_structure where every array is array-like and none is a float0 (pytrees are also
    rebuilt with None or axis specs as leaves, and (co)tangent trees with float0 for integer
    leaves: no matrix to check) and the arrays are not stacked, and check_contents where asked
    and every array is concrete. Operators check the structure again when they bind."""
    leaves = self._pattern_leaves()
    if not all(integrity.array_like(a) for a in leaves):
      return
    if any(a.dtype == jax.dtypes.float0 for a in leaves):
      return
    if len(self.pattern.rows.shape) != 1:
      return  # matrices stacked along leading axes (for scan, say): checked when one is used
    self._check_structure()
    if contents and not self.padded and all(integrity.is_concrete(a) for a in leaves):
      integrity.check_contents(*self._pattern_parts(), self.shape)

  def _pattern_parts(self) -> tuple:
    return (self.pattern, self.pattern_t, self.perm_t, self.perm_t_inv, self.input_to_format)

  def _check_structure(self) -> None:
    integrity.check_structure(self.values, *self._pattern_parts(), self.shape)

  # -- pytree ---------------------------------------------------------------------------------
  def tree_flatten(self):
    children = (
      self.values,
      self.pattern,
      self.pattern_t,
      self.perm_t,
      self.perm_t_inv,
      self.input_to_format,
    )
    return children, (self.shape, self.grouped, self.padded, _Origin.of(self))

  @classmethod
  def tree_unflatten(cls, aux, children):
    shape, grouped, padded, origin = aux
    A = cls._unchecked(*children, shape=shape, grouped=grouped, padded=padded)
    A._check(contents=not origin.same_pattern(A))
    return A

  # -- construction ---------------------------------------------------------------------------
  @classmethod
  def from_coo(
    cls, rows, cols, values=None, *, shape=None, format_options: FormatOptions | None = None
  ) -> "SparseMatrix":
    """From COO indices (any order, duplicates summed). `values=None` means all ones.

    `values` may be [nnz_in] or [H, nnz_in]; `shape` defaults to (max row + 1, max col + 1).
    `format_options`: how the window schedule is cut (None: the builder's rule).
    """
    if format_options is not None and not isinstance(format_options, FormatOptions):
      raise TypeError(
        f"format_options must be a jaxsparse_tc.FormatOptions or None; got "
        f"{type(format_options).__name__}"
      )
    rows, cols = integrity.index_array("rows", rows), integrity.index_array("cols", cols)
    shape = _check_shape(shape, rows, cols)
    _check_indices(rows, cols, shape)
    v = _input_values(values, rows.size)
    b = build_orientations(rows, cols, *shape, format_options)
    values_f = _sum_into(v, b.to_format, b.pattern.rows.shape[0])
    put = jax.device_put
    return cls._unchecked(
      put(values_f),
      Pattern(*map(put, b.pattern)),
      Pattern(*map(put, b.pattern_t)),
      put(b.perm_t),
      put(b.perm_t_inv),
      put(b.to_format.astype(np.int32)),
      shape,
      b.grouped,
    )

  @classmethod
  def from_scipy(cls, m, *, format_options: FormatOptions | None = None) -> "SparseMatrix":
    """From any scipy.sparse matrix or array (explicit zeros are kept as entries)."""
    coo = m.tocoo()
    return cls.from_coo(coo.row, coo.col, coo.data, shape=coo.shape, format_options=format_options)

  @classmethod
  def from_edge_index(
    cls, edge_index, num_nodes: int | None = None, values=None, *, flow: str = "source_to_target"
  ) -> "SparseMatrix":
    """From a [2, E] edge list in PyG's direction: a message flows from `edge_index[0, e]`
    (source) to `edge_index[1, e]` (target).

    flow="source_to_target" (default, PyG's): rows = targets, A[edge_index[1, e],
    edge_index[0, e]] = 1 (or values[e]), so `A @ x` sums each node's in-neighbours, as
    `jaxsparse_tc.nn.graph.message_passing_matrix` does. flow="target_to_source": rows =
    sources, A[edge_index[0, e], edge_index[1, e]] (`torch.sparse_coo_tensor(edge_index)`'s
    layout, PyG's `to_scipy_sparse_matrix`).
    """
    if flow not in ("source_to_target", "target_to_source"):
      raise ValueError(
        f"flow must be 'source_to_target' (rows = targets) or "
        f"'target_to_source' (rows = sources); got {flow!r}"
      )
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2:
      raise ValueError(f"edge_index must have shape [2, E]; got {ei.shape}")
    shape = None if num_nodes is None else (num_nodes, num_nodes)
    if shape is None:
      k = int(ei.max()) + 1 if ei.size else 0
      shape = (k, k)
    rows, cols = (ei[1], ei[0]) if flow == "source_to_target" else (ei[0], ei[1])
    return cls.from_coo(rows, cols, values, shape=shape)

  @classmethod
  def from_bcoo(cls, m, *, format_options: FormatOptions | None = None) -> "SparseMatrix":
    """From a `jax.experimental.sparse.BCOO` [m, n] (concrete; duplicates summed)."""
    from jaxsparse_tc._src.interop import from_bcoo

    return from_bcoo(m, format_options=format_options)

  def to_bcoo(self):
    """This matrix as a `jax.experimental.sparse.BCOO` ([m, n], or [H, m, n] for H value
    sets), format order; traceable in the values."""
    from jaxsparse_tc._src.interop import to_bcoo

    return to_bcoo(self)

  # -- accessors ------------------------------------------------------------------------------
  @property
  def nnz(self) -> int:
    return self.pattern.rows.shape[0]

  @property
  def dtype(self):
    return self.values.dtype

  @property
  def rows(self):
    """Row of each value, format order."""
    return self.pattern.rows

  @property
  def cols(self):
    """Column of each value, format order."""
    return self.pattern.cols

  @property
  def num_heads(self) -> int | None:
    return self.values.shape[0] if jnp.ndim(self.values) == 2 else None

  def with_values(self, values) -> "SparseMatrix":
    """The same pattern with new values in format order ([nnz] or [H, nnz])."""
    values = jnp.asarray(values)
    if values.ndim not in (1, 2) or values.shape[-1] != self.nnz:
      raise ValueError(
        f"values must have shape [{self.nnz}] or [H, {self.nnz}] for a "
        f"matrix of shape {self.shape}; got {values.shape}"
      )
    return SparseMatrix._unchecked(
      values,
      self.pattern,
      self.pattern_t,
      self.perm_t,
      self.perm_t_inv,
      self.input_to_format,
      self.shape,
      self.grouped,
      self.padded,
    )

  def astype(self, dtype) -> "SparseMatrix":
    """The same pattern with values cast to `dtype` (a float type). Concrete values that do not
    fit the target's finite range raise ValueError; traced ones cast as `jnp.astype` does."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f"SparseMatrix.astype: dtype must be a float type; got {dtype}")
    if dtype == self.values.dtype:
      return self
    if integrity.is_concrete(self.values) and self.nnz:
      # numpy: inside a trace (a matrix closed over by a jitted function) jnp would stage it
      peak = float(np.max(np.abs(np.asarray(self.values, np.float32))))
      if peak > float(jnp.finfo(dtype).max):
        raise ValueError(
          f"SparseMatrix.astype({dtype}): values up to {peak:.6g} exceed {dtype}'s largest "
          f"finite value {float(jnp.finfo(dtype).max):.6g}"
        )
    return self.with_values(self.values.astype(dtype))

  def values_from_input(self, values) -> jax.Array:
    """Input-order values (as given to the constructor) to format order; duplicates add up."""
    values = jnp.asarray(values)
    out = jnp.zeros(values.shape[:-1] + (self.nnz,), values.dtype)
    return out.at[..., self.input_to_format].add(values)

  def values_to_input(self, values=None) -> jax.Array:
    """Format-order values (default: this matrix's) to the constructor's input order."""
    values = self.values if values is None else jnp.asarray(values)
    return values[..., self.input_to_format]

  @property
  def T(self) -> "SparseMatrix":
    """The transpose (its pattern was built with this one; values are permuted)."""
    return SparseMatrix._unchecked(
      self.values[..., self.perm_t],
      self.pattern_t,
      self.pattern,
      self.perm_t_inv,
      self.perm_t,
      self.perm_t_inv[self.input_to_format],
      self.shape[::-1],
      self.grouped[::-1],
      self.padded,
    )

  def operands(self) -> PatternOperands:
    """What primitives take besides values: both orientations' structure (named). Their dtypes
    and shapes are checked here, when an operator binds them (tracers included)."""
    self._check_structure()
    return PatternOperands(
      a=KernelArrays(*self.pattern.kernel_arrays()),
      t=KernelArrays(*self.pattern_t.kernel_arrays()),
      perm_t=self.perm_t,
      perm_t_inv=self.perm_t_inv,
      rows_a=self.pattern.rows,
      rows_t=self.pattern_t.rows,
      row_view_a=RowView(*self.pattern.row_arrays()),
      row_view_t=RowView(*self.pattern_t.row_arrays()),
    )

  def pattern_operands(self) -> tuple:
    """operands(), flattened as the primitives bind it."""
    return self.operands().flat()

  def todense(self) -> jax.Array:
    """Dense [m, n] (or [H, m, n]) array. Values that share a position add up: a padded
    layout's zero entries (batches, shards) point at positions real entries may hold."""
    dense = jnp.zeros(self.values.shape[:-1] + self.shape, self.values.dtype)
    return dense.at[..., self.rows, self.cols].add(self.values)

  def to_scipy(self):
    """scipy.sparse.csr_matrix (values as float32 when they are bfloat16)."""
    import scipy.sparse as sp

    v = np.asarray(self.values)
    if v.ndim != 1:
      raise ValueError(f"to_scipy needs one value set; values have shape {v.shape}")
    if v.dtype == jnp.bfloat16:
      v = v.astype(np.float32)
    return sp.csr_matrix((v, (np.asarray(self.rows), np.asarray(self.cols))), shape=self.shape)

  # numpy operands on the left defer to our reflected operators (x @ A, 2 * A).
  __array_ufunc__ = None

  def __matmul__(self, x):
    return spmm(self, x)

  def __rmatmul__(self, x):
    """x @ A for dense x [k, m] (or [m]): (A^T @ x^T)^T, one SpMM over A^T's pattern."""
    x = jnp.asarray(x)
    if x.ndim not in (1, 2):
      raise ValueError(
        f"x @ A takes x of shape [k, {self.shape[0]}] or [{self.shape[0]}]; got {x.shape}"
      )
    if x.ndim == 1:
      return spmm(self.T, x[:, None])[..., 0]
    return jnp.swapaxes(spmm(self.T, x.T), -1, -2)

  # Elementwise arithmetic on values: scaling, and sums of matrices that share one pattern.
  def __mul__(self, s):
    if isinstance(s, SparseMatrix) or jnp.ndim(s) != 0:
      return NotImplemented  # only scalars: an elementwise product needs a shared pattern
    return self.with_values(self.values * s)

  __rmul__ = __mul__

  def __truediv__(self, s):
    if isinstance(s, SparseMatrix) or jnp.ndim(s) != 0:
      return NotImplemented
    return self.with_values(self.values / s)

  def __neg__(self):
    return self.with_values(-self.values)

  def _check_same_pattern(self, other, op: str) -> None:
    if not isinstance(other, SparseMatrix):
      raise TypeError(
        f"SparseMatrix {op} {type(other).__name__}: both operands must be "
        "SparseMatrix objects on one pattern (for a dense result use todense())"
      )
    if self.shape != other.shape or self.nnz != other.nnz:
      raise ValueError(
        f"SparseMatrix {op}: shapes {self.shape} / {other.shape} with {self.nnz}"
        f" / {other.nnz} nonzeros: both operands must share one pattern"
      )
    mine = jax.tree_util.tree_leaves((self.pattern, self.pattern_t, self.perm_t))
    theirs = jax.tree_util.tree_leaves((other.pattern, other.pattern_t, other.perm_t))
    for a, b in zip(mine, theirs):
      if a is b:
        continue
      if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
        raise ValueError(
          f"SparseMatrix {op}: inside a traced function the operands' patterns "
          "cannot be compared; derive one from the other "
          "(B = A.with_values(...)) so they share their pattern arrays"
        )
      if a.shape != b.shape or not np.array_equal(np.asarray(a), np.asarray(b)):
        raise ValueError(
          f"SparseMatrix {op}: the operands have different patterns (sums of "
          "different patterns are not supported: build the union pattern)"
        )

  def __add__(self, other):
    self._check_same_pattern(other, "+")
    return self.with_values(self.values + other.values)

  def __sub__(self, other):
    self._check_same_pattern(other, "-")
    return self.with_values(self.values - other.values)

  def __repr__(self) -> str:
    return (
      f"SparseMatrix(shape={self.shape}, nnz={self.nnz}, dtype={self.values.dtype}, "
      f"blocks={self.pattern.num_blocks})"
    )


class _Origin:
  """The matrix a pytree node was flattened from, held weakly, so that unflattening can tell
  whether its pattern arrays are still the (checked) originals. Rebuilding is checked only
  against a live origin of concrete arrays: a matrix of tracers has none, and JAX's dispatch
  re-flattens a compiled function's outputs into a short-lived matrix, so what a jitted
  function returns is not read back from the device on every call. Equal to every other
  _Origin, so that treedefs, and jit's cache keys, do not depend on it."""

  __slots__ = ("ref",)

  def __init__(self, ref):
    self.ref = ref

  @classmethod
  def of(cls, A: SparseMatrix) -> "_Origin":
    if any(isinstance(a, jax.core.Tracer) for a in A._pattern_leaves()):
      return cls(None)
    return cls(weakref.ref(A))

  def same_pattern(self, A: SparseMatrix) -> bool:
    """Whether A's pattern arrays are the live origin's own (True where there is none)."""
    origin = None if self.ref is None else self.ref()
    if origin is None:
      return True
    return all(a is b for a, b in zip(A._pattern_leaves(), origin._pattern_leaves()))

  def __eq__(self, other):
    return isinstance(other, _Origin)

  def __hash__(self):
    return 0

  def __repr__(self):
    return "_Origin()"


# Pickles and reprs name the class by its public module, which stays put while internals move
# (jaxsparse_tc.sparse_matrix re-exports it, so pickle finds the same class there).
SparseMatrix.__module__ = "jaxsparse_tc.sparse_matrix"
