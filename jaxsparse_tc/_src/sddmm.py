"""sddmm_p: values[h, idx(i, j)] = <X_h[i], Y_h[j]> at A's nonzeros, in A's format order."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching

from jaxsparse_tc._src import checks, heads, rules, vma
from jaxsparse_tc._src import precision as precision_lib
from jaxsparse_tc._src.lowering import param, register_ffi_lowering
from jaxsparse_tc._src.operator import operator
from jaxsparse_tc._src.options import kernel_options
from jaxsparse_tc._src.pattern import NUM_PATTERN_OPERANDS, PatternOperands
from jaxsparse_tc._src.primitives import sddmm_p, spmm_p

__all__ = ["sddmm", "sddmm_p"]


@operator
def sddmm(
  A,
  x,
  y,
  *,
  scale_by_values: bool = False,
  precision=None,
  preferred_element_type=None,
  options=None,
):
  """(X @ Y.T) sampled at A's nonzeros, as a SparseMatrix on A's pattern.

  X [m, d] or [H, m, d], Y [n, d] or [H, n, d], one float dtype. Values come out in X's dtype
  (float32 accumulation), or unrounded as float32 with `preferred_element_type=jnp.float32`
  (16-bit X); A's values play no part.

  With `scale_by_values`, the result is multiplied by A's values ([nnz], or [H, nnz] with
  the same H as X and Y, or with 2-D X and Y) and, as in spmm, in the promotion of the two
  dtypes: `jnp.result_type(product dtype, A.dtype)`, the product dtype being X's or
  `preferred_element_type`. Where that is wider than the product's, the product is computed
  in it (16-bit X with float32 values: the kernel's unrounded float32 accumulator, as with
  `preferred_element_type=jnp.float32`; otherwise X and Y are cast to it), so nothing is
  rounded to the narrower dtype on the way; the result has the promoted dtype. Cast A
  (`A.astype(X.dtype)`) for a 16-bit result. Gradients come back in each operand's dtype.

  `precision` as in spmm (None follows `jax.default_matmul_precision`). `options`: a
  KernelOptions forcing the GPU kernel family (None: the launch plan's choice).
  """
  pattern = A.pattern_operands()  # checks the pattern arrays' structure first
  x, y = jnp.asarray(x), jnp.asarray(y)
  m, n = A.shape
  checks.dense_operand("sddmm", "X", x, A, expected_rows=m)
  checks.dense_operand("sddmm", "Y", y, A, expected_rows=n)
  checks.same_dense("sddmm", x, y)
  out_dtype = x.dtype if preferred_element_type is None else jnp.dtype(preferred_element_type)
  if out_dtype not in (x.dtype, jnp.float32) or (out_dtype != x.dtype and x.itemsize != 2):
    raise checks.OperandError(
      f"sddmm: preferred_element_type must be X's dtype ({x.dtype}) or float32 for 16-bit X, "
      f"got {out_dtype}"
    )
  hx = x.shape[0] if x.ndim == 3 else 1
  hy = y.shape[0] if y.ndim == 3 else 1
  checks.heads_match("sddmm", A, x, hx, hy, other=y)
  if scale_by_values:
    hv = A.values.shape[0] if A.values.ndim == 2 else 1
    h = max(hx, hy)
    if hv > 1 and h > 1 and hv != h:
      raise checks.OperandError(
        f"sddmm: scale_by_values=True multiplies the products of X (shape {x.shape}) and Y "
        f"(shape {y.shape}), {h} heads, by A's values of shape {A.values.shape}, {hv} heads: "
        "head counts must be equal (or one of them absent)"
      )
    scaled = checks.promoted_dtype("sddmm", A, x, out_dtype)
    if scaled != out_dtype:
      if x.dtype.itemsize == 2 and scaled == jnp.float32:
        out_dtype = scaled  # the kernel's float32 accumulator, unrounded
      else:
        x, y, out_dtype = x.astype(scaled), y.astype(scaled), scaled
  out = sddmm_p.bind(
    *vma.match(x.reshape((hx,) + x.shape[-2:]), y.reshape((hy,) + y.shape[-2:]), *pattern),
    shape=A.shape,
    precision=precision_lib.canonicalize(precision),
    float32_out=out_dtype != x.dtype,
    options=kernel_options(options),
  )
  if x.ndim == 2 and y.ndim == 2:
    out = out[0]
  if scale_by_values:
    out = out * A.values.astype(out.dtype)
  return A.with_values(out)


# float32_out: 16-bit operands, float32 values out (the fp32 accumulator unrounded, no float32
# copies of the operands): sddmm's preferred_element_type, and the attention backward's logits.
def _abstract_eval(x, y, *pattern, shape, precision, float32_out, options):
  del shape, precision, options
  h = heads.num_heads(x.shape[0], y.shape[0])
  nnz = PatternOperands.unflat(pattern).nnz
  return x.update(shape=(h, nnz), dtype=jnp.float32 if float32_out else x.dtype)


def _transpose(ct, x, y, *pattern, shape, precision, float32_out, options):
  del float32_out
  none = [None] * NUM_PATTERN_OPERANDS
  if type(ct) is ad.Zero:
    return [None, None] + none
  ct = ct.astype((x.aval if ad.is_undefined_primal(x) else x).dtype)  # the operands' dtype
  if ad.is_undefined_primal(x):
    dx = spmm_p.bind(ct, y, *pattern, shape=shape, precision=precision, options=options)
    return [heads.sum_to_heads(dx, x.aval.shape[0]), None] + none
  P = PatternOperands.unflat(pattern)
  ct_t = ct[:, P.perm_t]  # cotangent values in A^T's order
  dy = spmm_p.bind(
    ct_t, x, *P.transpose().flat(), shape=(shape[1], shape[0]), precision=precision, options=options
  )
  return [None, heads.sum_to_heads(dy, y.aval.shape[0])] + none


def _batch(args, dims, **params):
  x, y, *pattern = args
  rules.check_pattern_unbatched(dims, 2)
  size = x.shape[dims[0]] if dims[0] is not None else y.shape[dims[1]]
  (x, y), h = heads.merge_batch_into_heads([x, y], dims[:2], size)
  out = sddmm_p.bind(x, y, *pattern, **params)
  return out.reshape((size, h) + out.shape[1:]), 0


sddmm_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[sddmm_p] = rules.bilinear_jvp(sddmm_p)
ad.primitive_transposes[sddmm_p] = _transpose
batching.primitive_batchers[sddmm_p] = _batch
# On CUDA the kernels also read A's row view (the CUDA-core kernels for sparse blocks).
register_ffi_lowering(
  sddmm_p,
  "sddmm",
  2,
  cpu_pattern=lambda P: P.a,
  cuda_pattern=lambda P: (*P.a, *P.row_view_a),
  attrs={"precision": param("precision")},
  cuda_attrs={"kernel": lambda p: np.int32(p["options"].sddmm_code)},
)
