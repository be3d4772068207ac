"""spmm_p: dense = A @ X for a SparseMatrix A (values [Hv, nnz]) and X [Hx, n, d]."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jaxsparse_tc._src import checks, heads, precision as precision_lib, rules
from jaxsparse_tc._src.extensions import cuda_extension
from jaxsparse_tc._src.lowering import register_ffi_lowering
from jaxsparse_tc._src.pattern import NUM_PATTERN_OPERANDS, PERM_T, ROW_VIEW, transpose_operands

spmm_p = Primitive("jaxsparse_tc_spmm")


def spmm(A, x, *, precision=None):
  """A @ X: A a SparseMatrix [m, n] (values [nnz] or [H, nnz]), X [n, d] or [H, n, d].

  Returns [m, d], or [H, m, d] when A or X has a head axis, in X's dtype (A's values are cast
  to it); accumulation is float32. On GPU, float32 inputs are exact where the CUDA-core
  kernels run (sparse blocks: docs/FORMAT.md) and use tf32 tensor cores otherwise, unless
  `precision="highest"` (or jax.lax.Precision.HIGHEST) asks for exact float32 everywhere.
  """
  x = jnp.asarray(x)
  m, n = A.shape
  checks.dense_operand("spmm", "X", x, A, expected_rows=n)
  values = A.values.astype(x.dtype)
  hv = values.shape[0] if values.ndim == 2 else 1
  hx = x.shape[0] if x.ndim == 3 else 1
  checks.heads_match("spmm", A, x, hv, hx)
  out = spmm_p.bind(values.reshape(hv, A.nnz), x.reshape((hx,) + x.shape[-2:]),
                    *A.pattern_operands(), shape=A.shape,
                    precision=precision_lib.canonicalize(precision))
  return out if values.ndim == 2 or x.ndim == 3 else out[0]


def _abstract_eval(values, x, *pattern, shape, precision):
  del pattern, precision
  h = heads.num_heads(values.shape[0], x.shape[0])
  return x.update(shape=(h, shape[0], x.shape[2]), dtype=x.dtype)


def _transpose(ct, values, x, *pattern, shape, precision):
  from jaxsparse_tc._src.sddmm import sddmm_p  # the two primitives are each other's transposes

  none = [None] * NUM_PATTERN_OPERANDS
  if type(ct) is ad.Zero:
    return [None, None] + none
  if ad.is_undefined_primal(x):
    values_t = values[:, pattern[PERM_T]]  # A's values in A^T's order
    dx = spmm_p.bind(values_t, ct, *transpose_operands(tuple(pattern)),
                     shape=(shape[1], shape[0]), precision=precision)
    return [None, heads.sum_to_heads(dx, x.aval.shape[0])] + none
  dvalues = sddmm_p.bind(ct, x, *pattern, shape=shape, precision=precision, float32_out=False)
  return [heads.sum_to_heads(dvalues, values.aval.shape[0]), None] + none


def _batch(args, dims, **params):
  values, x, *pattern = args
  rules.check_pattern_unbatched(dims, 2)
  size = values.shape[dims[0]] if dims[0] is not None else x.shape[dims[1]]
  if dims[0] is None and values.shape[0] == 1:
    # One value set: fold the batch into the feature axis and read A once.
    xb = jnp.moveaxis(x, dims[1], 1)  # [Hx, B, n, d]
    hx, b, n, d = xb.shape
    xb = jnp.swapaxes(xb, 1, 2).reshape(hx, n, b * d)
    out = spmm_p.bind(values, xb, *pattern, **params)
    return out.reshape(out.shape[0], out.shape[1], b, d), 2
  (values, x), h = heads.merge_batch_into_heads([values, x], dims[:2], size)
  out = spmm_p.bind(values, x, *pattern, **params)
  return out.reshape((size, h) + out.shape[1:]), 0


def _cuda_workspace(avals_in, avals_out, params):
  """Bytes of the CUDA launch's workspace (the plan the handler launches by, cuda/spmm.cu)."""
  values, x, wcp, _, _, bitmap, _, schedule, _, row_schedule = avals_in
  h, m, d = avals_out[0].shape
  exact = x.dtype == jnp.float32 and params["precision"] == precision_lib.HIGHEST
  return cuda_extension().spmm_workspace_bytes(
      x.dtype.itemsize, exact, values.shape[1], bitmap.size // 2, schedule.shape[0],
      wcp.shape[0] - 1, row_schedule.shape[0], m, d, h)


spmm_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[spmm_p] = rules.bilinear_jvp(spmm_p)
ad.primitive_transposes[spmm_p] = _transpose
batching.primitive_batchers[spmm_p] = _batch
# On CUDA the kernels also read A's row view (the CUDA-core kernels for sparse blocks).
register_ffi_lowering(spmm_p, "jaxsparse_tc_spmm", 8, precision="precision",
                      cuda_extra_operands=(2 + ROW_VIEW, 3 + ROW_VIEW),
                      cuda_workspace=_cuda_workspace)
