"""The op table (csrc/common/ops.h), the one definition of the Python/C++ contract: the FFI
targets (versioned names, which platforms register them), the codes of the attributes Python
passes as integers, and the attention tensor-core head dims, all read from the CPU extension."""

from __future__ import annotations

import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo

import jaxsparse_tc as jst
from jaxsparse_tc import _cpu, options
from jaxsparse_tc._src import extensions, select
from jaxsparse_tc._src import precision as precision_lib
from jaxsparse_tc._src.attention import TENSOR_CORE_D, _grads_kernel_fits
from jaxsparse_tc._src.lowering import register_ffi_lowering
from jaxsparse_tc._src.pattern import PatternOperands

pytestmark = pytest.mark.usefixtures("on_cpu")


def _platform_targets(platform: str) -> set[str]:
  return {t for op, t in _cpu.OPS.items() if platform in _cpu.OP_PLATFORMS[op]}


def test_targets_are_versioned_op_names():
  assert len(_cpu.OPS) >= 8 and set(_cpu.OPS) == set(_cpu.OP_PLATFORMS)
  for op, target in _cpu.OPS.items():
    assert re.fullmatch(rf"jaxsparse_tc_{op}_v[1-9][0-9]*", target), (op, target)
    assert _cpu.OP_PLATFORMS[op] and set(_cpu.OP_PLATFORMS[op]) <= {"cpu", "cuda"}, op
    assert extensions.target(op) == target
  assert len(set(_cpu.OPS.values())) == len(_cpu.OPS)
  with pytest.raises(ValueError, match="unknown operator 'spmv'.*'spmm'"):
    extensions.target("spmv")


def test_cpu_registrations_cover_the_table():
  """The CPU extension registers a handler for exactly the operators the table gives a CPU
  handler, under their versioned targets."""
  registered = _cpu.registrations()
  assert set(registered) == _platform_targets("cpu") and "jaxsparse_tc_spmm_v1" in registered
  assert all(type(c).__name__ == "PyCapsule" for c in registered.values())
  for op, platforms in _cpu.OP_PLATFORMS.items():
    assert extensions.has_cpu_kernel(op) == ("cpu" in platforms), op


@pytest.mark.skipif(not extensions.cuda_built(), reason="CUDA extension not built")
def test_cuda_registrations_cover_the_table():
  cuda = extensions.cuda_extension()
  assert dict(cuda.OPS) == _cpu.OPS and dict(cuda.OP_PLATFORMS) == _cpu.OP_PLATFORMS
  assert set(cuda.registrations()) == _platform_targets("cuda")
  for op, platforms in _cpu.OP_PLATFORMS.items():
    assert extensions.has_cuda_kernel(op) == ("cuda" in platforms), op


def test_has_cuda_means_usable_here(monkeypatch):
  """jst.has_cuda(): the CUDA extension loaded and jax sees a CUDA device; a built extension
  without a device (a CPU machine) is not enough."""
  try:
    cuda_devices = jax.devices("cuda")
  except RuntimeError:
    cuda_devices = []
  assert jst.has_cuda() == (extensions.cuda_built() and len(cuda_devices) > 0)
  monkeypatch.setattr(extensions, "_cuda", object())  # as if built
  assert extensions.cuda_built() and jst.has_cuda() == (len(cuda_devices) > 0)
  monkeypatch.setattr(extensions, "_cuda", None)
  assert not extensions.cuda_built() and not jst.has_cuda()


def _cpu_targets(fn, *args) -> list[str]:
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",)).as_text()
  return sorted(set(re.findall(r"custom_call @(jaxsparse_tc\w*)", text)))


def test_lowerings_call_the_tables_targets(rng):
  """Each operator lowers to its target from the table, and the registered handlers run (A @ X
  against a float64 reference)."""
  m, n, d = 40, 30, 8
  rows, cols, vals = random_coo(rng, m, n, 0.2)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(m, n))
  x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((m, d)), jnp.float32)
  OPS = _cpu.OPS

  assert _cpu_targets(jst.spmm, A, x) == [OPS["spmm"]]
  assert _cpu_targets(lambda a, b: jst.sddmm(A, a, b), y, x) == [OPS["sddmm"]]
  softmax_grad = jax.grad(lambda v: jnp.sum(jst.edge_softmax(A, v).values ** 2))
  assert _cpu_targets(softmax_grad, A.values) == sorted(
    [OPS["edge_softmax"], OPS["edge_softmax_bwd"]]
  )
  q, k, v = y, x, x
  attention_jvp = lambda q: jax.jvp(lambda q: jst.sparse_attention(A, q, k, v), (q,), (q,))
  assert _cpu_targets(attention_jvp, q) == sorted([OPS["attention_fwd"], OPS["attention_jvp"]])

  dense = np.zeros((m, n))
  np.add.at(dense, (rows, cols), vals.astype(np.float64))
  got = jax.jit(jst.spmm)(A, x)
  np.testing.assert_allclose(got, dense @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-5)


def test_a_lowering_without_a_cpu_handler_needs_a_composed_rule():
  prim = jax.extend.core.Primitive("jaxsparse_tc_test_only")
  with pytest.raises(ValueError, match="no CPU handler.*composed_rule"):
    register_ffi_lowering(prim, "attention_grads", 7, cpu_pattern=lambda P: P.a)
  with pytest.raises(ValueError, match="unknown operator"):
    register_ffi_lowering(prim, "attention", 4, cpu_pattern=lambda P: P.a)


def test_kernel_choice_literals_are_the_exported_codes():
  """options.py's Literal types name exactly the extension's codes, in code order from 0, and
  KernelOptions passes those codes on."""
  assert typing.get_args(options.KernelChoice) == tuple(_cpu.KERNEL_CODES)
  assert typing.get_args(options.BackwardChoice) == tuple(_cpu.ATTENTION_BACKWARD_CODES)
  for codes in (_cpu.KERNEL_CODES, _cpu.ATTENTION_BACKWARD_CODES, _cpu.PRECISION_CODES):
    assert list(codes.values()) == list(range(len(codes))), codes
  for name, code in _cpu.KERNEL_CODES.items():
    opts = jst.KernelOptions(spmm=name, sddmm=name)
    assert opts.spmm_code == opts.sddmm_code == code
  for name, code in _cpu.ATTENTION_BACKWARD_CODES.items():
    assert jst.KernelOptions(attention_backward=name).attention_backward_code == code
  with pytest.raises(ValueError, match="KernelOptions.spmm"):
    jst.KernelOptions(spmm="fused")


def test_launch_plans_answer_in_the_codes_names(rng):
  """kernel_choices takes the codes and answers with their names: a forced family comes back
  under its own name; a code past the list is refused."""
  rows, cols, _ = random_coo(rng, 64, 64, 0.1)
  A = jst.SparseMatrix.from_coo(rows, cols, shape=(64, 64))
  counts = select.feature_counts(A.pattern, 64, A.nnz)
  for name, code in _cpu.KERNEL_CODES.items():
    if code == _cpu.KERNEL_CODES["auto"]:
      continue
    c = _cpu.kernel_choices(
      **counts, d=32, esize=2, exact=False, spmm_kernel=code, sddmm_kernel=code
    )
    assert (c["spmm"], c["sddmm"]) == (name, name)
  for name, code in _cpu.ATTENTION_BACKWARD_CODES.items():
    c = _cpu.kernel_choices(**counts, d=64, esize=2, exact=False, attention_backward=code)
    assert c["attention_backward"] in _cpu.ATTENTION_BACKWARD_CODES
    assert name == "auto" or c["attention_backward"] == name
  with pytest.raises(ValueError, match="kernel"):
    _cpu.kernel_choices(**counts, d=32, esize=2, exact=False, spmm_kernel=len(_cpu.KERNEL_CODES))
  with pytest.raises(ValueError, match="attention_backward"):
    _cpu.kernel_choices(
      **counts, d=32, esize=2, exact=False, attention_backward=len(_cpu.ATTENTION_BACKWARD_CODES)
    )


def test_precision_codes_are_the_exported_ones():
  codes = _cpu.PRECISION_CODES
  assert (precision_lib.DEFAULT, precision_lib.HIGHEST) == (codes["default"], codes["highest"])
  assert precision_lib.canonicalize("highest") == codes["highest"] != codes["default"]
  assert precision_lib.canonicalize(jax.lax.Precision.DEFAULT) == codes["default"]


def test_attention_tensor_core_dims_are_the_plans():
  """The backward's dispatch (Python) and the launch plans (C++) take the same operands to the
  tensor-core kernels: 16-bit, d = dv in ATTENTION_TC_D."""
  assert TENSOR_CORE_D == _cpu.ATTENTION_TC_D and len(TENSOR_CORE_D) >= 1
  counts = dict(rows=64, nnz=512, windows=8, blocks=64, condensed_cols=400)
  fused = _cpu.ATTENTION_BACKWARD_CODES["fused"]
  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    for d in sorted({8, 16, 48, 96, 256, *TENSOR_CORE_D}):
      want = jnp.dtype(dtype).itemsize == 2 and d in TENSOR_CORE_D
      q = jax.ShapeDtypeStruct((1, 64, d), dtype)
      assert _grads_kernel_fits(q, q) == want, (dtype, d)
      assert not _grads_kernel_fits(q, jax.ShapeDtypeStruct((1, 64, 2 * d), dtype))
      esize = jnp.dtype(dtype).itemsize
      c = _cpu.kernel_choices(**counts, d=d, esize=esize, exact=False, attention_backward=fused)
      assert (c["attention_backward"] == "fused") == want, (dtype, d)


def test_attention_backward_plan_is_the_one_rule():
  """attention_backward_plan (plan_attention_backward, which the CUDA backward handlers check
  too) answers as kernel_choices does at dv = d; "fused" only where the tensor-core kernels take
  the operands, "composed" always where asked; the composed backward's edge kernel only for rows
  of at most 512 bytes (32 lanes x 16 bytes); a code past the list is refused."""
  counts = dict(rows=64, nnz=512, windows=8, blocks=64, condensed_cols=400)
  for esize in (2, 4):
    for d in sorted({8, 48, 96, 200, 256, *TENSOR_CORE_D}):
      for dv in (d, 2 * d):
        tc = esize == 2 and d == dv and d in TENSOR_CORE_D
        for name, code in _cpu.ATTENTION_BACKWARD_CODES.items():
          p = _cpu.attention_backward_plan(
            **counts, esize=esize, d=d, dv=dv, attention_backward=code
          )
          if name == "fused" or not tc:
            assert (p["backward"] == "fused") == tc, (esize, d, dv, name)
          if name == "composed":
            assert p["backward"] == "composed"
          composed = p["backward"] == "composed"
          assert p["edge_kernel"] == (composed and max(d, dv) * esize <= 512), (esize, d, dv)
          if dv == d:
            c = _cpu.kernel_choices(
              **counts, d=d, esize=esize, exact=False, attention_backward=code
            )
            assert c["attention_backward"] == p["backward"], (esize, d, name)
  with pytest.raises(ValueError, match="attention_backward"):
    _cpu.attention_backward_plan(
      **counts, esize=2, d=64, dv=64, attention_backward=len(_cpu.ATTENTION_BACKWARD_CODES)
    )


def test_cpu_attention_jvp_checks_the_dbias_dtype(rng):
  """The JVP's binding takes dbias as any buffer (the CUDA kernel reads float32 or q's dtype); the
  CPU handler runs on float32, as the primitive's JVP does, and refuses another dtype where it
  reads dbias. Its FFI target is called directly, past the primitive's trace-time checks."""
  m, n, d = 24, 20, 8
  rows, cols, _ = random_coo(rng, m, n, 0.3)
  A = jst.SparseMatrix.from_coo(rows, cols, shape=(m, n))
  window_arrays = PatternOperands.unflat(A.pattern_operands()).a
  f32 = jnp.float32
  q, k, v, dq, dk, dv = (
    jnp.asarray(rng.standard_normal((1, r, d)), f32) for r in (m, n, n, m, n, n)
  )
  bias, dbias = (jnp.asarray(rng.standard_normal((1, A.nnz)), f32) for _ in range(2))
  attrs = dict(scale=np.float32(0.5), has_bias=np.int32(1))
  o, lse = jax.ffi.ffi_call(
    extensions.target("attention_fwd"),
    (jax.ShapeDtypeStruct((1, m, d), f32), jax.ShapeDtypeStruct((1, m), f32)),
  )(q, k, v, bias, *window_arrays, **attrs)

  def jvp(dbias):
    call = jax.ffi.ffi_call(
      extensions.target("attention_jvp"), jax.ShapeDtypeStruct((1, m, d), f32)
    )
    return call(q, k, v, bias, o, lse, dq, dk, dv, dbias, *window_arrays, **attrs)

  attention = lambda q, k, v, b: jst.sparse_attention(A, q[0], k[0], v[0], bias=b[0], scale=0.5)
  _, want = jax.jvp(attention, (q, k, v, bias), (dq, dk, dv, dbias))
  np.testing.assert_allclose(jvp(dbias)[0], want, rtol=1e-4, atol=1e-5)
  with pytest.raises(Exception, match="dbias"):
    jax.block_until_ready(jvp(dbias.astype(jnp.float16)))
