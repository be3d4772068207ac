"""The implementation of jaxsparse_tc.interop, whose docstring documents it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src.options import FormatOptions
from jaxsparse_tc._src.sparse_matrix import SparseMatrix


def from_bcoo(m, *, format_options: FormatOptions | None = None) -> SparseMatrix:
  """A SparseMatrix from a 2-D BCOO (no batch or dense dimensions; duplicates are summed).

  The BCOO's `nse` stored entries are the constructor's input order
  (`A.values_from_input(new_data)` maps data of the same layout).
  """
  from jax.experimental import sparse as jsparse

  if not isinstance(m, jsparse.BCOO):
    raise TypeError(f"from_bcoo takes a jax.experimental.sparse.BCOO; got {type(m).__name__}")
  if m.n_batch or m.n_dense or m.ndim != 2:
    raise ValueError(
      f"from_bcoo takes a 2-D BCOO without batch or dense dimensions; got shape "
      f"{m.shape} with n_batch={m.n_batch}, n_dense={m.n_dense}"
    )
  if isinstance(m.indices, jax.core.Tracer):
    raise TypeError(
      "from_bcoo: the BCOO's indices are traced; the pattern is built on the host "
      "from concrete indices: convert outside jax.jit (or close over the BCOO)"
    )
  idx = np.asarray(m.indices)
  data = m.data
  if not (jnp.issubdtype(data.dtype, jnp.floating) or jnp.issubdtype(data.dtype, jnp.integer)):
    raise ValueError(
      f"from_bcoo: the BCOO's data (shape {data.shape}) has dtype {data.dtype}; a SparseMatrix "
      "holds real values (float, or integers read as float32)"
    )
  if idx.size and idx.min() < 0:
    # BCOO's own todense wraps negative indices as numpy does; padding uses indices past the
    # shape. Rather than guess which was meant, refuse them.
    bad = np.nonzero(np.any(idx < 0, axis=1))[0]
    raise ValueError(
      f"from_bcoo: {bad.size} stored entries have negative indices (first: entry {int(bad[0])}, "
      f"index {idx[bad[0]].tolist()}); give indices in [0, {m.shape[0]}) x [0, {m.shape[1]})"
    )
  traced = isinstance(data, jax.core.Tracer)
  # BCOO marks padding entries with out-of-range indices (e.g. after sum_duplicates): drop them
  keep = np.all(idx < np.asarray(m.shape), axis=1)
  A = SparseMatrix.from_coo(
    idx[keep, 0],
    idx[keep, 1],
    None if traced else np.asarray(data)[keep],
    shape=m.shape,
    format_options=format_options,
  )
  if traced:
    A = A.with_values(A.values_from_input(jnp.asarray(data)[np.nonzero(keep)[0]]))
  return A


def to_bcoo(A: SparseMatrix):
  """A as a BCOO: [m, n] for values [nnz], [H, m, n] (n_batch=1) for values [H, nnz]; entries
  in A's format order, no duplicates (`indices_sorted` is False: format order is window-major)."""
  from jax.experimental import sparse as jsparse

  if not isinstance(A, SparseMatrix):
    raise TypeError(f"to_bcoo takes a SparseMatrix; got {type(A).__name__}")
  idx = jnp.stack([A.rows, A.cols], axis=-1)
  if A.values.ndim == 1:
    return jsparse.BCOO((A.values, idx), shape=A.shape, unique_indices=True)
  h = A.values.shape[0]
  idx = jnp.broadcast_to(idx, (h,) + idx.shape)
  return jsparse.BCOO((A.values, idx), shape=(h,) + A.shape, unique_indices=True)
