"""spmm_p: dense = A @ X for a SparseMatrix A (values [Hv, nnz]) and X [Hx, n, d]."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching

from jaxsparse_tc._src import checks, heads, rules, select, vma
from jaxsparse_tc._src import precision as precision_lib
from jaxsparse_tc._src.extensions import cuda_extension
from jaxsparse_tc._src.lowering import param, register_ffi_lowering
from jaxsparse_tc._src.operator import operator
from jaxsparse_tc._src.options import kernel_options
from jaxsparse_tc._src.pattern import NUM_PATTERN_OPERANDS, PatternOperands
from jaxsparse_tc._src.primitives import sddmm_p, spmm_p
from jaxsparse_tc._src.spmm_extremum import REDUCTIONS, spmm_extremum

__all__ = ["spmm", "spmm_p"]


@operator
def spmm(A, x, *, reduce="sum", precision=None, options=None):
  """A @ X: A a SparseMatrix [m, n] (values [nnz] or [H, nnz]), X [n, d] or [H, n, d].

  reduce: "sum" (the matrix product), or "max" / "min": out[i, k] is the largest (smallest)
  A[i, j] X[j, k] over row i's entries, 0 in a row without entries, NaN where a product is NaN;
  its gradient flows through the entry that gave each output (the first in the format's order
  on a tie). Max aggregation over neighbours (GraphSAGE's, PyG's `aggr="max"`) is this with A's
  values set to 1. `precision` and `options` concern "sum" (max and min are exact).

  Returns [m, d], or [H, m, d] when A or X has a head axis. Dtypes promote as in jnp.matmul:
  the product is computed in `jnp.result_type(A.dtype, X.dtype)`, both operands are cast to it
  and the result has it (float16 X with float32 values computes in float32; float16 with
  bfloat16 in float32). For the 16-bit kernels give both operands the 16-bit dtype, e.g.
  `spmm(A.astype(jnp.float16), X)` (`SparseMatrix.astype` refuses values past the target's
  range). Gradients come back in each operand's own dtype. Accumulation is float32 (float64
  for float64 on CPU). On GPU, float32 inputs are exact where the CUDA-core kernels run
  (sparse blocks: docs/FORMAT.md) and use tf32 tensor cores otherwise, unless
  `precision="highest"` (or jax.lax.Precision.HIGHEST) asks for exact float32 everywhere.
  precision=None follows `jax.default_matmul_precision` (read at trace time, as jnp.matmul).
  `options`: a KernelOptions forcing the GPU kernel family (None: the launch plan's choice).
  """
  if reduce not in REDUCTIONS:
    raise ValueError(f"spmm: reduce must be one of {REDUCTIONS}; got {reduce!r}")
  if reduce != "sum":
    return spmm_extremum_positions(A, x, reduce)[0]
  operands, heads_out = _operands(A, x)
  out = spmm_p.bind(
    *operands,
    shape=A.shape,
    precision=precision_lib.canonicalize(precision),
    options=kernel_options(options),
  )
  return out if heads_out else out[0]


def spmm_extremum_positions(A, x, reduce: str):
  """spmm(A, X, reduce="max" | "min") and, per output, the format position of the entry it came
  from (int32, -1 where the row has no entries): a ShardedMatrix combines its parts by them."""
  operands, heads_out = _operands(A, x)
  out, arg = spmm_extremum(*operands[:2], operands[2:], shape=A.shape, reduce=reduce)
  return (out, arg) if heads_out else (out[0], arg[0])


def _operands(A, x):
  """spmm's checked operands (values [Hv, nnz], X [Hx, n, d] in the promoted dtype, the
  pattern) and whether the result keeps a head axis."""
  pattern = A.pattern_operands()  # checks the pattern arrays' structure first
  x = jnp.asarray(x)
  checks.dense_operand("spmm", "X", x, A, expected_rows=A.shape[1])
  dtype = checks.promoted_dtype("spmm", A, x)
  values, x = A.values.astype(dtype), x.astype(dtype)
  hv = values.shape[0] if values.ndim == 2 else 1
  hx = x.shape[0] if x.ndim == 3 else 1
  checks.heads_match("spmm", A, x, hv, hx)
  operands = vma.match(values.reshape(hv, A.nnz), x.reshape((hx,) + x.shape[-2:]), *pattern)
  return operands, values.ndim == 2 or x.ndim == 3


def _abstract_eval(values, x, *pattern, shape, precision, options):
  del pattern, precision, options
  h = heads.num_heads(values.shape[0], x.shape[0])
  return x.update(shape=(h, shape[0], x.shape[2]), dtype=x.dtype)


def _transpose(ct, values, x, *pattern, shape, precision, options):
  none = [None] * NUM_PATTERN_OPERANDS
  if type(ct) is ad.Zero:
    return [None, None] + none
  P = PatternOperands.unflat(pattern)
  if ad.is_undefined_primal(x):
    values_t = values[:, P.perm_t]  # A's values in A^T's order
    dx = spmm_p.bind(
      values_t,
      ct,
      *P.transpose().flat(),
      shape=(shape[1], shape[0]),
      precision=precision,
      options=options,
    )
    return [None, heads.sum_to_heads(dx, x.aval.shape[0])] + none
  dvalues = sddmm_p.bind(
    ct, x, *pattern, shape=shape, precision=precision, float32_out=False, options=options
  )
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


def _cuda_workspace(dense, P, avals_out, params):
  """Bytes of the CUDA launch's workspace (the plan the handler launches by, spmm/plan.h)."""
  values, x = dense
  h, m, d = avals_out[0].shape
  exact = x.dtype == jnp.float32 and params["precision"] == precision_lib.HIGHEST
  return cuda_extension().spmm_workspace_bytes(
    esize=x.dtype.itemsize,
    exact=exact,
    kernel=params["options"].spmm_code,
    **select.feature_counts(P.a, rows=m, nnz=values.shape[1]),
    num_items=P.a.schedule.shape[0],
    row_items=P.row_view_a.schedule.shape[0],
    d=d,
    heads=h,
  )


spmm_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[spmm_p] = rules.bilinear_jvp(spmm_p)
ad.primitive_transposes[spmm_p] = _transpose
batching.primitive_batchers[spmm_p] = _batch
# On CUDA the kernels also read A's row view (the CUDA-core kernels for sparse blocks).
register_ffi_lowering(
  spmm_p,
  "spmm",
  2,
  cpu_pattern=lambda P: P.a,
  cuda_pattern=lambda P: (*P.a, *P.row_view_a),
  attrs={"precision": param("precision")},
  cuda_attrs={"kernel": lambda p: np.int32(p["options"].spmm_code)},
  cuda_workspace=_cuda_workspace,
  features=(1,),  # X's columns split across devices with the result's
)
