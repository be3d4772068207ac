"""The integrity of a SparseMatrix's pattern arrays.

Two levels, checked where a pattern can go wrong:

- **Structure** (`check_structure`): every pattern array's dtype and shape against the matrix's
  shape and nonzero count (docs/FORMAT.md). Needs no values, so it also runs on tracers: in the
  public constructor, when a matrix is rebuilt from a pytree, and when an operator binds.
- **Contents** (`check_contents`): the format's invariants over the arrays' values (columns in
  range, pointers monotone, bitmaps against value pointers, schedules covering every window
  once, ...), in C++ (`_cpu.check_pattern`). Runs on concrete arrays: in the public constructor
  and when a matrix is rebuilt from a pytree whose pattern leaves were replaced (tree
  arithmetic over a params tree that holds a matrix, say).

Inside a traced function contents cannot be read; there the kernels stay in bounds whatever the
arrays hold (the CPU handlers check what their kernels index and return an error, the CUDA
kernels clamp every index they load).
"""

from __future__ import annotations

import numpy as np

from jaxsparse_tc._src.checks import OperandError

# Rows, columns and entries are int32 in the format and the kernels, which step past a row's or a
# window's end by up to a few thousand positions: keep 2^16 of headroom below 2^31.
MAX_DIM = 2**31 - 2**16
MAX_ENTRIES = 2**31 - 2**16

WINDOW_ROWS = 8

# (field, dtype, trailing dims) of one orientation's arrays; the leading dim is checked apart.
_PATTERN_FIELDS = (
  ("window_col_ptr", np.int32, ()),
  ("window_cols", np.int32, ()),
  ("window_block_ptr", np.int32, ()),
  ("block_bitmap", np.uint32, (2,)),
  ("block_value_ptr", np.int32, ()),
  ("schedule", np.int32, (8,)),
  ("rows", np.int32, ()),
  ("cols", np.int32, ()),
  ("row_entries", np.int32, (2,)),
  ("row_schedule", np.int32, (4,)),
)


class PatternError(OperandError):
  """A SparseMatrix's pattern arrays do not form a valid pattern of its shape."""


def array_like(x) -> bool:
  """An array, a tracer or a ShapeDtypeStruct (pytrees also carry None, axis specs, masks...)."""
  return hasattr(x, "shape") and hasattr(x, "dtype")


def is_concrete(x) -> bool:
  """A numpy or jax array holding values (not a tracer, a ShapeDtypeStruct or the argument
  descriptions ahead-of-time lowering rebuilds pytrees with)."""
  import jax

  return isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)


def index_array(name: str, a) -> np.ndarray:
  """A one-dimensional array of integer ids as contiguous int64 (what the C++ builders read);
  ValueError naming `name` for another rank or a non-integer dtype."""
  a = np.asarray(a)
  if a.ndim != 1:
    raise ValueError(f"{name} must be one-dimensional; got shape {a.shape}")
  if a.size and not np.issubdtype(a.dtype, np.integer):
    raise ValueError(f"{name} must hold integers; got dtype {a.dtype}")
  return np.ascontiguousarray(a, dtype=np.int64)


def edge_index_array(where: str, edge_index, num_nodes: int) -> np.ndarray:
  """edge_index [2, E] as an integer numpy array whose ids lie in [0, num_nodes); ValueError
  prefixed by `where` for another shape, a non-integer dtype (an empty float array passes: it
  has no ids to misread) or an id out of range."""
  ei = np.asarray(edge_index)
  if ei.ndim != 2 or ei.shape[0] != 2:
    raise ValueError(f"{where}: edge_index must have shape [2, E]; got shape {ei.shape}")
  if ei.size == 0 and ei.dtype.kind in "biuf":
    ei = ei.astype(np.int64)  # np.zeros((2, 0)) is float
  if ei.dtype.kind not in "iu":
    raise ValueError(
      f"{where}: edge_index must have an integer dtype (node ids); got dtype {ei.dtype} "
      "(cast integral ids explicitly, e.g. edge_index.astype(np.int64))"
    )
  if ei.size:
    lo, hi = int(ei.min()), int(ei.max())
    if lo < 0 or hi >= num_nodes:
      raise ValueError(
        f"{where}: edge_index holds node ids in [{lo}, {hi}], outside [0, num_nodes={num_nodes})"
      )
  return ei


def check_dims(m: int, n: int, what: str = "shape") -> None:
  for name, size in (("rows", m), ("columns", n)):
    if size > MAX_DIM:
      raise ValueError(
        f"{what} {(m, n)}: at most {MAX_DIM} {name} are supported (the format's int32 "
        f"indices); got {size}"
      )


def _fail(shape, message: str):
  raise PatternError(
    f"SparseMatrix of shape {tuple(shape)}: {message}; the pattern arrays do not belong to "
    "this matrix (were they changed, e.g. by a tree map over the matrix? map over A.values, "
    "or rebuild the matrix with SparseMatrix.from_coo)"
  )


def _check_orientation(name: str, p, m: int, n: int, nnz: int, shape) -> None:
  if len(p) != len(_PATTERN_FIELDS):
    _fail(shape, f"{name} has {len(p)} arrays, expected {len(_PATTERN_FIELDS)}")
  for (field, dtype, trailing), a in zip(_PATTERN_FIELDS, p):
    if not array_like(a):
      _fail(shape, f"{name}.{field} is a {type(a).__name__}, not an array")
    if np.dtype(a.dtype) != np.dtype(dtype):
      _fail(shape, f"{name}.{field} has dtype {a.dtype}, expected {np.dtype(dtype).name}")
    if len(a.shape) != 1 + len(trailing) or tuple(a.shape[1:]) != trailing:
      want = "[k" + "".join(f", {t}" for t in trailing) + "]"
      _fail(shape, f"{name}.{field} has shape {tuple(a.shape)}, expected {want}")
  windows = -(-m // WINDOW_ROWS)
  fields = dict(zip((f for f, _, _ in _PATTERN_FIELDS), p))
  for field in ("window_col_ptr", "window_block_ptr"):
    if fields[field].shape[0] != windows + 1:
      _fail(
        shape,
        f"{name}.{field} has {fields[field].shape[0]} entries, expected ceil({m} / "
        f"{WINDOW_ROWS}) + 1 = {windows + 1}",
      )
  blocks = fields["block_bitmap"].shape[0]
  if fields["block_value_ptr"].shape[0] != blocks + 1:
    _fail(
      shape,
      f"{name}.block_value_ptr has {fields['block_value_ptr'].shape[0]} entries, expected "
      f"{blocks + 1} (one per block of block_bitmap, plus one)",
    )
  for field in ("rows", "cols", "row_entries"):
    if fields[field].shape[0] != nnz:
      _fail(shape, f"{name}.{field} has {fields[field].shape[0]} entries, expected nnz = {nnz}")


def check_structure(values, pattern, pattern_t, perm_t, perm_t_inv, input_to_format, shape):
  """Dtypes and shapes of a matrix's arrays against its shape (works on tracers). Raises
  PatternError (an OperandError: a TypeError and a ValueError)."""
  m, n = shape
  check_dims(m, n)
  nnz = pattern[6].shape[0] if len(pattern) > 6 and array_like(pattern[6]) else None
  if nnz is None:
    _fail(shape, "pattern.rows is not an array")
  if nnz > MAX_ENTRIES:
    _fail(shape, f"{nnz} nonzeros, more than the format's {MAX_ENTRIES}")
  _check_orientation("pattern", pattern, m, n, nnz, shape)
  _check_orientation("pattern_t", pattern_t, n, m, nnz, shape)
  for field, a in (("perm_t", perm_t), ("perm_t_inv", perm_t_inv)):
    if not array_like(a) or np.dtype(a.dtype) != np.int32 or tuple(a.shape) != (nnz,):
      got = f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}"
      _fail(shape, f"{field} is {got}, expected int32 [{nnz}]")
  a = input_to_format
  if not array_like(a) or np.dtype(a.dtype) != np.int32 or len(a.shape) != 1:
    got = f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}"
    _fail(shape, f"input_to_format is {got}, expected int32 [k]")
  if array_like(values):
    if len(values.shape) not in (1, 2) or values.shape[-1] != nnz:
      _fail(shape, f"values have shape {tuple(values.shape)}, expected [{nnz}] or [H, {nnz}]")


def check_contents(pattern, pattern_t, perm_t, perm_t_inv, input_to_format, shape) -> None:
  """The format's invariants over concrete arrays (after check_structure). Raises
  PatternError naming the first broken one."""
  from jaxsparse_tc._src.extensions import cpu_extension

  cpu = cpu_extension()
  m, n = shape
  host = [np.asarray(a) for a in (*pattern, *pattern_t, perm_t, perm_t_inv, input_to_format)]
  p, pt = host[:10], host[10:20]
  perm, perm_inv, to_format = host[20:]
  for name, arrays, rows, cols in (("pattern", p, m, n), ("pattern_t", pt, n, m)):
    message = cpu.check_pattern(*arrays, rows, cols)
    if message:
      _fail(shape, f"{name}: {message}")
  message = cpu.check_transpose(p[6], p[7], pt[6], pt[7], perm, perm_inv)
  if message:
    _fail(shape, message)
  nnz = p[6].shape[0]
  if to_format.size and (int(to_format.min()) < 0 or int(to_format.max()) >= nnz):
    bad = int(np.flatnonzero((to_format < 0) | (to_format >= nnz))[0])
    _fail(shape, f"input_to_format[{bad}] = {int(to_format[bad])} is not a position < {nnz}")
