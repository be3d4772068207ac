"""sparse_attention: softmax_row(mask_A(scale * Q K^T + bias)) @ V, fused.

Three primitives, each with a CPU reference and a CUDA kernel:

* `attention_fwd_p(q, k, v, bias) -> (o, lse)`: the fused forward (on GPU: SDDMM -> online
  softmax in fp32 -> SpMM per 8-row window, never writing the nnz-sized score matrix). `lse`
  (float32 [H, m], row log-sum-exp) is saved for differentiation; it is internal (its tangent
  is declared zero: sparse_attention never returns it). lse_i is +inf for a row with no entries
  or only -inf logits (so that every backward's P_ij = exp(s_ij - lse_i) is exactly 0 there),
  nan for a row with a nan or +inf logit, else max_j s_ij + log(sum_j exp(s_ij - max_j s_ij)).
* `attention_jvp_p(q, k, v, bias, o, lse, dq, dk, dv, dbias) -> do`: the JVP, linear in the
  tangents (dq, dk, dv, dbias), computed by one fused kernel from the saved lse.
* `attention_grads_p(q, k, v, bias, o, lse, do) -> (dq, dk, dv, dbias)`: the backward on
  tensor cores (16-bit, d = dv in TENSOR_CORE_D): two CUDA kernels, FlashAttention-2 on the
  window format; on CPU (and on CUDA for other operands) the composed backward below.
* `attention_bwd_p(q, k, v, bias, o, lse, do) -> (p, ds)`: the composed backward's per-edge
  pass (one kernel on CUDA; on CPU composed from SDDMMs), followed by three SpMMs.

Operands at the primitive level: q, k, v (and their tangents, o, do) [H_i, rows, features] in
one dtype; bias float32 [Hb, nnz] whatever q's dtype (a 16-bit bias is widened exactly, a
float32 one keeps its range), or the float32 [1, 1] placeholder when has_bias is False; the
JVP's dbias tangent likewise float32. The per-edge outputs (p, ds, dbias) are in q's dtype;
the bias's cotangent is cast back to the bias's own dtype by jnp (the astype's transpose).

Rows (the logits s_ij = scale q_i.k_j + bias_ij over row i's entries), forward and every
derivative alike:
1. a nan or +inf logit: the whole output row is nan (as jax.nn.softmax);
2. no entries, or every logit -inf (fully masked): the output row is 0 and every gradient
   through the row (to q, k, v, bias) is exactly 0;
3. otherwise the max-subtracted softmax; a -inf logit gets weight exactly 0 and no gradient.

How the transformations compose: `attention_fwd_p`'s JVP rule runs the fused forward and emits
`attention_jvp_p` for the tangent; `jax.jvp` evaluates that kernel. `jax.grad`/`jax.vjp`
linearize the same JVP and transpose `attention_jvp_p`: its transpose rule is the
FlashAttention-2 backward (`_backward`) from the saved lse (attention_grads_p, or the per-edge
pass and three SpMMs), so reverse mode runs the fused forward plus that backward and never a
JVP kernel. vmap
folds the batch into the kernels' head axis (heads.py).
Second derivatives are not implemented and raise NotImplementedError (any route: the JVP
primitive has no JVP, and the backward refuses to be differentiated because it reads the saved
lse as a constant).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from jaxsparse_tc._src import checks, heads, rules, select, vma
from jaxsparse_tc._src import precision as precision_lib
from jaxsparse_tc._src.extensions import cpu_extension, cuda_extension, has_cuda_kernel
from jaxsparse_tc._src.lowering import param, register_ffi_lowering
from jaxsparse_tc._src.operator import operator
from jaxsparse_tc._src.options import kernel_options
from jaxsparse_tc._src.pattern import NUM_PATTERN_OPERANDS, PatternOperands
from jaxsparse_tc._src.primitives import (
  attention_bwd_p,
  attention_fwd_p,
  attention_grads_p,
  attention_jvp_p,
  sddmm_p,
  spmm_p,
)

__all__ = [
  "sparse_attention",
  "attention_fwd_p",
  "attention_jvp_p",
  "attention_bwd_p",
  "attention_grads_p",
]


@operator
def sparse_attention(A, Q, K, V, *, scale=None, bias=None, options=None):
  """softmax_row(mask_A(scale * Q K^T + bias)) @ V over the nonzeros of A.

  A: SparseMatrix [m, n] (its pattern is the mask; its values are not used).
  Q [m, d], K [n, d], V [n, dv], or with a head axis [H, ...] (1 or H heads each).
  bias: optional per-edge logits in A's format order, [nnz] or [H, nnz], any float dtype; the
  kernels add it in float32 (a float32 bias keeps its range and precision with 16-bit Q), and
  its gradient comes back in its own dtype. -inf masks an entry.
  scale: defaults to 1/sqrt(d). float32 softmax; output [m, dv] or [H, m, dv] in Q's dtype.
  Rows of A without nonzeros, and rows whose logits are all -inf, give zeros and zero
  gradients; a nan (or +inf) logit makes its whole row nan. `options`: a KernelOptions (the
  backward's kernels, split-window merging; None: the launch plans' choices).
  """
  pattern = A.pattern_operands()  # checks the pattern arrays' structure first
  q, k, v = (jnp.asarray(x) for x in (Q, K, V))
  m, n = A.shape
  checks.dense_operand("sparse_attention", "Q", q, A, expected_rows=m)
  checks.dense_operand("sparse_attention", "K", k, A, expected_rows=n)
  checks.dense_operand("sparse_attention", "V", v, A, expected_rows=n)
  checks.softmax_dtype("sparse_attention", "Q", q)
  checks.same_dense("sparse_attention", q, k, names=("Q", "K"))
  if q.shape[-1] == 0:
    raise checks.OperandError(
      f"sparse_attention: Q {q.shape} and K {k.shape} have no features (d = 0); the "
      "logits Q K^T need d >= 1"
    )
  if v.dtype != q.dtype:
    raise checks.OperandError(
      f"sparse_attention: Q ({q.shape}, {q.dtype}) and V ({v.shape}, "
      f"{v.dtype}) must have the same dtype"
    )
  hs = [x.shape[0] if x.ndim == 3 else 1 for x in (q, k, v)]
  has_bias = bias is not None
  if has_bias:
    b = jnp.asarray(bias)
    if b.ndim not in (1, 2) or b.shape[-1] != A.nnz:
      raise checks.OperandError(
        f"sparse_attention: A has {A.nnz} nonzeros, so bias must have "
        f"shape [{A.nnz}] or [H, {A.nnz}]; got {b.shape}"
      )
    if not jnp.issubdtype(b.dtype, jnp.floating):
      raise checks.OperandError(
        f"sparse_attention: bias (shape {b.shape}) has non-float dtype {b.dtype}"
      )
    b = b.astype(jnp.float32).reshape((b.shape[0] if b.ndim == 2 else 1, A.nnz))
  else:
    b = jnp.zeros((1, 1), jnp.float32)
  hs.append(b.shape[0])
  try:
    heads.num_heads(*hs)
  except ValueError:
    raise checks.OperandError(
      f"sparse_attention: head counts of Q {q.shape}, K {k.shape}, V {v.shape} and bias "
      f"{None if bias is None else jnp.shape(bias)} do not broadcast"
    ) from None
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
  o, _ = attention_fwd_p.bind(
    *vma.match(
      q.reshape((hs[0],) + q.shape[-2:]),
      k.reshape((hs[1],) + k.shape[-2:]),
      v.reshape((hs[2],) + v.shape[-2:]),
      b,
      *pattern,
    ),
    shape=A.shape,
    scale=scale,
    has_bias=has_bias,
    grouped=A.grouped[0],
    grouped_t=A.grouped[1],
    options=kernel_options(options),
  )
  no_heads = q.ndim == 2 and k.ndim == 2 and v.ndim == 2 and (bias is None or jnp.ndim(bias) == 1)
  return o[0] if no_heads else o


# FFI attributes of the kernels: both platforms, then the CUDA launch plans' (plan/attention.h).
_ATTRS = {"scale": param("scale", np.float32), "has_bias": param("has_bias")}
_MERGE = {"merge_split_windows": lambda p: np.int32(p["options"].merge_split_windows)}


# -- forward ----------------------------------------------------------------------------------
def _check_bias(prim, bias):
  if bias.dtype != jnp.float32:
    raise checks.OperandError(
      f"{prim.name}: the bias operand must be float32 (shape {bias.shape}), got {bias.dtype}"
    )


def _fwd_abstract(q, k, v, bias, *pattern, shape, scale, has_bias, grouped, grouped_t, options):
  _check_bias(attention_fwd_p, bias)
  h = heads.num_heads(q.shape[0], k.shape[0], v.shape[0], bias.shape[0])
  m = shape[0]
  return (
    q.update(shape=(h, m, v.shape[2]), dtype=q.dtype),
    q.update(shape=(h, m), dtype=jnp.float32),
  )


def _fwd_jvp(primals, tangents, **params):
  q, k, v, bias, *pattern = primals
  o, lse = attention_fwd_p.bind(*primals, **params)
  tans = tangents[:4]
  if all(type(t) is ad.Zero for t in tans):
    return (o, lse), (rules.zero_tangent(o), rules.zero_tangent(lse))
  tans = [ad.instantiate_zeros(t) for t in tans]
  do = attention_jvp_p.bind(
    q,
    k,
    v,
    bias,
    o,
    lse,
    *tans,
    *pattern,
    shape=params["shape"],
    scale=params["scale"],
    has_bias=params["has_bias"],
    grouped=params["grouped"],
    grouped_t=params["grouped_t"],
    options=params["options"],
  )
  return (o, lse), (do, rules.zero_tangent(lse))


def _fwd_batch(args, dims, **params):
  rules.check_pattern_unbatched(dims, 4)
  size = rules.batch_size(args, dims)
  ops, h = heads.merge_batch_into_heads(list(args[:4]), dims[:4], size)
  o, lse = attention_fwd_p.bind(*ops, *args[4:], **params)
  return (o.reshape((size, h) + o.shape[1:]), lse.reshape((size, h) + lse.shape[1:])), (0, 0)


def _fwd_cuda_workspace(dense, P, avals_out, params):
  """Bytes of the fused forward's split-window workspace (csrc/plan/attention.h)."""
  q, _, v, _ = dense
  h = avals_out[0].shape[0]
  return cuda_extension().attention_workspace_bytes(
    q.dtype.itemsize,
    q.shape[2],
    v.shape[2],
    h,
    P.a.schedule.shape[0],
    params["grouped"],
    params["options"].merge_split_windows,
  )


attention_fwd_p.def_abstract_eval(_fwd_abstract)
ad.primitive_jvps[attention_fwd_p] = _fwd_jvp
batching.primitive_batchers[attention_fwd_p] = _fwd_batch
register_ffi_lowering(
  attention_fwd_p,
  "attention_fwd",
  4,
  cpu_pattern=lambda P: P.a,
  attrs=_ATTRS,
  cuda_attrs={"grouped": param("grouped"), **_MERGE},
  cuda_workspace=_fwd_cuda_workspace,
)


# -- jvp (linear in operands 6..9) --------------------------------------------------------------
def _jvp_abstract(
  q,
  k,
  v,
  bias,
  o,
  lse,
  dq,
  dk,
  dv,
  dbias,
  *pattern,
  shape,
  scale,
  has_bias,
  grouped,
  grouped_t,
  options,
):
  _check_bias(attention_jvp_p, bias)
  _check_bias(attention_jvp_p, dbias)
  h = heads.num_heads(
    q.shape[0],
    k.shape[0],
    v.shape[0],
    bias.shape[0],
    dq.shape[0],
    dk.shape[0],
    dv.shape[0],
    dbias.shape[0],
    o.shape[0],
  )
  return q.update(shape=(h, shape[0], v.shape[2]), dtype=q.dtype)


def _jvp_transpose(ct, q, k, v, bias, o, lse, dq, dk, dv, dbias, *pattern, **params):
  for x in (q, k, v, bias, o, lse):
    if ad.is_undefined_primal(x):
      raise NotImplementedError("attention_jvp_p is linear in the tangents only")
  outs = [None] * (10 + NUM_PATTERN_OPERANDS)
  if type(ct) is ad.Zero:
    return outs
  gq, gk, gv, gb = _backward(
    q,
    k,
    v,
    bias,
    o,
    lse,
    ct,
    tuple(pattern),
    params["shape"],
    params["scale"],
    params["has_bias"],
    (params["grouped"], params["grouped_t"]),
    params["options"],
  )
  for pos, tangent, g in ((6, dq, gq), (7, dk, gk), (8, dv, gv), (9, dbias, gb)):
    if ad.is_undefined_primal(tangent):
      if pos == 9 and not params["has_bias"]:
        g = jnp.zeros(tangent.aval.shape, tangent.aval.dtype)
      # dbias comes in q's dtype, the float32 bias tangent's cotangent in float32
      outs[pos] = heads.sum_to_heads(g.astype(tangent.aval.dtype), tangent.aval.shape[0])
  return outs


def _jvp_batch(args, dims, **params):
  rules.check_pattern_unbatched(dims, 10)
  size = rules.batch_size(args, dims)
  ops, h = heads.merge_batch_into_heads(list(args[:10]), dims[:10], size)
  do = attention_jvp_p.bind(*ops, *args[10:], **params)
  return do.reshape((size, h) + do.shape[1:]), 0


_HIGHER_ORDER = "jaxsparse_tc.sparse_attention: derivatives of order > 1 are not implemented"


def _no_higher_order(*_, **__):
  raise NotImplementedError(_HIGHER_ORDER)


attention_jvp_p.def_abstract_eval(_jvp_abstract)
ad.primitive_jvps[attention_jvp_p] = _no_higher_order
ad.primitive_transposes[attention_jvp_p] = _jvp_transpose
batching.primitive_batchers[attention_jvp_p] = _jvp_batch
register_ffi_lowering(attention_jvp_p, "attention_jvp", 10, cpu_pattern=lambda P: P.a, attrs=_ATTRS)


# -- backward ---------------------------------------------------------------------------------
# attention_bwd_p(q, k, v, bias, o, lse, do) -> (p, ds): the backward's per-edge quantities
# P = exp(scale QK^T + bias - lse) and dS = P (dO V^T - rowsum(dO O)) on A's pattern, in A's
# format order. dS is dbias; dQ = scale dS K is an SpMM over A; permuted to A^T's order, P and
# dS are the values of the SpMMs that give dV and dK. On CUDA one kernel
# (attention/backward_composed.cu) gathers each K and V row once per nonzero; on CPU, and on CUDA
# for rows wider than that kernel takes (plan_attention_backward, csrc/plan/attention.h), the pair
# is composed from two SDDMMs (_edge_pass).


def _bwd_abstract(q, k, v, bias, o, lse, do, *pattern, shape, scale, has_bias):
  _check_bias(attention_bwd_p, bias)
  h = heads.num_heads(
    q.shape[0], k.shape[0], v.shape[0], bias.shape[0], o.shape[0], lse.shape[0], do.shape[0]
  )
  per_edge = q.update(shape=(h, PatternOperands.unflat(pattern).nnz), dtype=q.dtype)
  return per_edge, per_edge


def _edge_pass(q, k, v, bias, o, lse, do, *pattern, shape, scale, has_bias):
  """attention_bwd_p composed from the library's SDDMM. Rows with lse +inf (no entries or fully
  masked) get P = 0 and dS = 0; a nan lse (a nan row) makes them nan."""
  f32 = jnp.float32
  dtype = q.dtype
  # 16-bit operands: products are exact in the fp32 accumulator, which the SDDMM hands out as
  # float32 (no float32 copies of Q and K), so large logits lose nothing; float32 operands take
  # the exact path, as the forward does.
  prec = precision_lib.HIGHEST if dtype == f32 else precision_lib.DEFAULT
  rows = PatternOperands.unflat(pattern).rows_a
  f32_out = dtype in (jnp.float16, jnp.bfloat16)
  sddmm = functools.partial(
    sddmm_p.bind, shape=shape, precision=prec, float32_out=f32_out, options=kernel_options(None)
  )
  logits = scale * sddmm(q, k, *pattern).astype(f32)
  if has_bias:
    logits = logits + bias
  p = jnp.exp(logits - lse[:, rows])
  dp = sddmm(do, v, *pattern).astype(f32)
  delta = jnp.sum(do.astype(f32) * o.astype(f32), axis=-1)
  return p.astype(dtype), (p * (dp - delta[:, rows])).astype(dtype)


def _bwd_batch(args, dims, **params):
  rules.check_pattern_unbatched(dims, 7)
  size = rules.batch_size(args, dims)
  ops, h = heads.merge_batch_into_heads(list(args[:7]), dims[:7], size)
  outs = attention_bwd_p.bind(*ops, *args[7:], **params)
  return [x.reshape((size, h) + x.shape[1:]) for x in outs], [0] * len(outs)


attention_bwd_p.def_abstract_eval(_bwd_abstract)
batching.primitive_batchers[attention_bwd_p] = _bwd_batch
register_ffi_lowering(
  attention_bwd_p,
  "attention_bwd",
  7,
  cpu_pattern=lambda P: (),
  cuda_pattern=lambda P: P.row_view_a,
  attrs=_ATTRS,
  composed_rule=mlir.lower_fun(_edge_pass, multiple_results=True),
)


# -- backward on tensor cores ------------------------------------------------------------------
# attention_grads_p(q, k, v, bias, o, lse, do) -> (dq, dk, dv, dbias): the whole backward in
# two kernels (attention/backward_fused.cu, FlashAttention-2 on the window format: dQ over A's
# windows, dK and dV over A^T's), for 16-bit operands with d = dv in TENSOR_CORE_D. dbias is
# [H, nnz] in A's format order with a bias, else [H, 0]. On CPU, and on CUDA for other dtypes and
# widths, it lowers to the composed backward (_composed_grads).
# The kernels' head dims (csrc/plan/attention.h kAttentionTcD, exported by the extension).
TENSOR_CORE_D: tuple[int, ...] = tuple(cpu_extension().ATTENTION_TC_D)


def _grads_kernel_fits(q, v) -> bool:
  """Whether the tensor-core kernels take these operands: 16-bit, d = dv in TENSOR_CORE_D (the
  launch plans' own rule, attention_tc_shape, asked through the CPU extension)."""
  return jnp.issubdtype(q.dtype, jnp.floating) and cpu_extension().attention_tc_shape(
    q.dtype.itemsize, q.shape[-1], v.shape[-1]
  )


def _backward_plan(q, v, P: PatternOperands, m: int, options) -> dict:
  """Which backward runs (decided at trace time), from the launch plans' own function
  (csrc/plan/attention.h plan_attention_backward, through the CPU extension): "fused" under
  the selector's choice from A's pattern features where the tensor-core kernels take the
  operands, options.attention_backward forcing either where both can run; and whether the
  composed backward's edge pass is attention_bwd_p's kernel. Whether this platform has the
  kernels is the caller's check."""
  counts = select.feature_counts(P.a, rows=m, nnz=P.nnz)
  return select.attention_backward_plan(
    counts, q.dtype.itemsize, q.shape[2], v.shape[2], options=kernel_options(options)
  )


def _grads_abstract(
  q, k, v, bias, o, lse, do, *pattern, shape, scale, has_bias, grouped, grouped_t, options
):
  _check_bias(attention_grads_p, bias)
  h = heads.num_heads(
    q.shape[0], k.shape[0], v.shape[0], bias.shape[0], o.shape[0], lse.shape[0], do.shape[0]
  )
  m, n = shape
  nnz = PatternOperands.unflat(pattern).nnz if has_bias else 0
  return (
    q.update(shape=(h, m, q.shape[2])),
    q.update(shape=(h, n, q.shape[2])),
    q.update(shape=(h, n, v.shape[2])),
    q.update(shape=(h, nnz)),
  )


def _composed_grads(
  q, k, v, bias, o, lse, do, *pattern, shape, scale, has_bias, edge_pass=None, options=None, **_
):
  """The backward from the per-edge pass (attention_bwd_p, or the SDDMMs of _edge_pass) and
  three SpMMs (A^T's pattern for dK and dV)."""
  options = kernel_options(options)
  edge_pass = edge_pass or _edge_pass
  p, ds = edge_pass(
    q, k, v, bias, o, lse, do, *pattern, shape=shape, scale=scale, has_bias=has_bias
  )
  prec = precision_lib.HIGHEST if q.dtype == jnp.float32 else precision_lib.DEFAULT
  P = PatternOperands.unflat(pattern)
  pattern_t, perm_t = P.transpose().flat(), P.perm_t
  ds_scaled = (scale * ds.astype(jnp.float32)).astype(q.dtype)
  spmm = functools.partial(spmm_p.bind, precision=prec, options=options)
  gq = spmm(ds_scaled, k, *pattern, shape=shape)
  gv = spmm(p[:, perm_t], do, *pattern_t, shape=shape[::-1])
  gk = spmm(ds_scaled[:, perm_t], q, *pattern_t, shape=shape[::-1])
  return gq, gk, gv, ds if has_bias else ds[:, :0]


def _grads_cuda_workspace(dense, P, avals_out, params):
  """Bytes of the backward's workspace: the row stats and the split windows' slots
  (csrc/plan/attention.h)."""
  h, m, d = avals_out[0].shape
  return cuda_extension().attention_grads_workspace_bytes(
    d,
    h,
    m,
    P.a.schedule.shape[0],
    P.t.schedule.shape[0],
    params["grouped"],
    params["grouped_t"],
    params["options"].merge_split_windows,
  )


def _grads_batch(args, dims, **params):
  rules.check_pattern_unbatched(dims, 7)
  size = rules.batch_size(args, dims)
  ops, h = heads.merge_batch_into_heads(list(args[:7]), dims[:7], size)
  outs = attention_grads_p.bind(*ops, *args[7:], **params)
  return [x.reshape((size, h) + x.shape[1:]) for x in outs], [0] * len(outs)


attention_grads_p.def_abstract_eval(_grads_abstract)
batching.primitive_batchers[attention_grads_p] = _grads_batch
# Kernel operands: the 7 arrays, A's and A^T's window arrays, perm_t.
register_ffi_lowering(
  attention_grads_p,
  "attention_grads",
  7,
  cpu_pattern=lambda P: (*P.a, *P.t, P.perm_t),
  attrs=_ATTRS,
  cuda_attrs={"grouped": param("grouped"), "grouped_t": param("grouped_t"), **_MERGE},
  cuda_workspace=_grads_cuda_workspace,
  composed_rule=mlir.lower_fun(_composed_grads, multiple_results=True),
  cuda_supports=lambda avals, _: _grads_kernel_fits(avals[0], avals[2]),
)


# The backward reads the saved lse as a constant (its tangent is declared zero), so
# differentiating it (jax.hessian, grad of grad) would give wrong second derivatives: its JVP
# rule raises instead.
@functools.partial(jax.custom_jvp, nondiff_argnums=(8, 9, 10, 11, 12))
def _backward(q, k, v, bias, o, lse, do, pattern, shape, scale, has_bias, grouped, options):
  """FlashAttention-2 backward from the saved row log-sum-exp.

  P = exp(scale QK^T + bias - lse) on A's pattern, dP = dO V^T on the pattern,
  dS = P (dP - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO, dbias = dS.
  On CUDA with 16-bit operands and d = dv in TENSOR_CORE_D: two tensor-core kernels
  (attention_grads_p); otherwise the per-edge pass and three SpMMs (_composed_grads).
  `grouped`: whether A's and A^T's schedules are grouped.
  """
  params = dict(shape=shape, scale=scale, has_bias=has_bias)
  plan = _backward_plan(q, v, PatternOperands.unflat(pattern), shape[0], options)
  if plan["backward"] == "fused" and has_cuda_kernel("attention_grads"):
    return tuple(
      attention_grads_p.bind(
        q,
        k,
        v,
        bias,
        o,
        lse,
        do,
        *pattern,
        **params,
        grouped=grouped[0],
        grouped_t=grouped[1],
        options=options,
      )
    )
  fused = plan["edge_kernel"] and has_cuda_kernel("attention_bwd")
  return _composed_grads(
    q,
    k,
    v,
    bias,
    o,
    lse,
    do,
    *pattern,
    **params,
    edge_pass=attention_bwd_p.bind if fused else _edge_pass,
    options=options,
  )


@_backward.defjvp
def _backward_jvp(shape, scale, has_bias, grouped, options, primals, tangents):
  raise NotImplementedError(_HIGHER_ORDER)
