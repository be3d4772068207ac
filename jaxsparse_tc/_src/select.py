"""Which kernel family each operator runs for a matrix and a feature width, asked on any machine.

The choice is made by the CUDA launch plans (docs/DESIGN.md, "Which kernel runs"), whose
preferences come from one selector function per operator of a pattern's features
(csrc/plan/select.h). The plans are host code, so the CPU extension (always built) runs them
too: `kernel_plan` asks it, and so does the attention backward's dispatch (_src/attention.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from jaxsparse_tc._src import precision as precision_lib
from jaxsparse_tc._src.extensions import _cpu
from jaxsparse_tc._src.options import DEFAULT_KERNEL_OPTIONS, kernel_options

__all__ = ["PatternFeatures", "KernelPlan", "kernel_plan"]


class PatternFeatures(NamedTuple):
  """What the selector reads of a pattern (one orientation), from its arrays' lengths."""

  rows: int  # m
  nnz: int  # nonzeros
  windows: int  # 8-row windows
  blocks: int  # 8x8 blocks of the window format
  condensed_cols: int  # distinct columns summed over the windows
  nnz_per_block: float  # nnz / blocks (64 x block fill); 0 without blocks
  cols_per_window: float  # condensed_cols / windows; 0 without windows
  mean_row_length: float  # nnz / rows; 0 without rows


class KernelPlan(NamedTuple):
  """The kernel families the CUDA launch plans pick (KernelOptions' names), and the kernel each
  launches."""

  spmm: str  # "rows" (row kernels) or "windows" (window kernels)
  sddmm: str  # the same
  attention_backward: str  # "fused" (tensor-core kernels) or "composed"
  features: PatternFeatures
  # The SpMM kernel: "rows"; of the windows, "windows_async" (tensor cores, a cp.async gather
  # ring: sm_90, 16-byte rows of X), "windows_registers" (tensor cores, register gathers) or
  # "exact_f32" (exact float32 on CUDA cores).
  spmm_kernel: str
  # The SDDMM kernel: "rows"; of the windows, "windows" (tensor cores) or "exact_f32".
  sddmm_kernel: str


def feature_counts(arrays, rows: int, nnz: int) -> dict[str, int]:
  """The selector's counts of one orientation's window arrays (anything with the fields of
  pattern.KernelArrays, concrete or abstract), keyed as the extensions' arguments."""
  return dict(
    rows=int(rows),
    nnz=int(nnz),
    windows=int(arrays.window_col_ptr.shape[0]) - 1,
    blocks=int(arrays.block_bitmap.shape[0]),
    condensed_cols=int(arrays.window_cols.shape[0]),
  )


def choices(
  counts: dict[str, int],
  d: int,
  esize: int,
  exact: bool = False,
  *,
  row_items: int = 0,
  heads: int = 1,
  options=DEFAULT_KERNEL_OPTIONS,
  sm90: bool = True,
) -> dict:
  """The CPU extension's kernel_choices: the plans' families under `options` (a KernelOptions)
  and the derived features. row_items and heads size the SpMM row kernels' workspace (0: no
  row needs one); sm90: the kernels are those of an sm_90 (or later) device."""
  return _cpu.kernel_choices(
    **counts,
    d=int(d),
    esize=int(esize),
    exact=bool(exact),
    row_items=int(row_items),
    heads=int(heads),
    spmm_kernel=options.spmm_code,
    sddmm_kernel=options.sddmm_code,
    attention_backward=options.attention_backward_code,
    sm90=bool(sm90),
  )


def attention_backward_plan(
  counts: dict[str, int], esize: int, d: int, dv: int, *, options=DEFAULT_KERNEL_OPTIONS
) -> dict:
  """The CPU extension's attention_backward_plan (csrc/plan/attention.h plan_attention_backward):
  {"backward": "fused" or "composed", "edge_kernel": whether the composed backward's per-edge
  pass is the attention_bwd kernel}, from A's feature counts, the operands' element size and
  head dims, under `options` (a KernelOptions)."""
  return _cpu.attention_backward_plan(
    **counts,
    esize=int(esize),
    d=int(d),
    dv=int(dv),
    attention_backward=options.attention_backward_code,
  )


_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)


def kernel_plan(
  A, d: int, dtype=jnp.float16, *, precision=None, options=None, heads=None, arch: int = 90
):
  """The kernel families a GPU runs for `A` (a SparseMatrix) with dense operands of `d` features
  in `dtype` (float32, float16 or bfloat16): `jst.spmm(A, X)` with X [n, d], `jst.sddmm(A, X, Y)`
  with X [m, d], and the backward of `jst.sparse_attention(A, Q, K, V)` with d = dv.

  Answered on any machine (no GPU needed) by the CUDA launch plans themselves, run on the host:
  under `options=None` (or "auto" fields) their selector's choice from `A`'s pattern features,
  exact float32 (`precision="highest"`) taking the CUDA-core row kernels; a forced
  `jst.KernelOptions` field returns the forced family, and raises ValueError where the kernel
  would refuse it (SpMM "rows" past the row workspace cap, SDDMM "rows" past 1024 bytes
  per row). The attention backward is "fused" only where its tensor-core kernels take the
  operands (16-bit, d in {32, 64, 128}). `heads`: the product's heads (None: A's value sets),
  which scale the SpMM row kernels' workspace. Where nothing is to compute (no rows, d = 0) the
  handlers launch nothing, whatever the plan says.

  `spmm_kernel` and `sddmm_kernel` name the kernel each plan launches, on a GPU of compute
  capability `arch` (major * 10 + minor: 90 for H100 and H200, 80 for A100) with the 16-byte
  aligned operands XLA allocates: the window family's SpMM kernel depends on both.

  Returns a KernelPlan(spmm, sddmm, attention_backward, features, spmm_kernel, sddmm_kernel).
  """
  from jaxsparse_tc._src.sparse_matrix import SparseMatrix

  if not isinstance(A, SparseMatrix):
    raise TypeError(f"kernel_plan: A must be a jaxsparse_tc.SparseMatrix; got {type(A).__name__}")
  if isinstance(d, bool) or not isinstance(d, int) or d < 0:
    raise ValueError(f"kernel_plan: d must be a non-negative integer; got {d!r}")
  dt = jnp.dtype(dtype)
  if dt not in [jnp.dtype(t) for t in _DTYPES]:
    raise ValueError(f"kernel_plan: dtype must be float32, float16 or bfloat16; got {dt}")
  if heads is None:
    heads = A.num_heads or 1
  if isinstance(arch, bool) or not isinstance(arch, int) or arch < 10:
    raise ValueError(
      f"kernel_plan: arch must be a compute capability as an integer (90 for sm_90); got {arch!r}"
    )
  exact = dt == jnp.float32 and precision_lib.canonicalize(precision) == precision_lib.HIGHEST
  counts = feature_counts(A.pattern, A.shape[0], A.pattern.rows.shape[0])
  c = choices(
    counts,
    d,
    dt.itemsize,
    exact,
    row_items=A.pattern.row_schedule.shape[0],
    heads=heads,
    options=kernel_options(options),
    sm90=arch >= 90,
  )
  features = PatternFeatures(
    **counts,
    nnz_per_block=c["nnz_per_block"],
    cols_per_window=c["cols_per_window"],
    mean_row_length=c["mean_row_length"],
  )
  return KernelPlan(
    c["spmm"], c["sddmm"], c["attention_backward"], features, c["spmm_kernel"], c["sddmm_kernel"]
  )
