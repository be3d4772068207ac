"""The implementation of jaxsparse_tc.options, whose docstring documents it."""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxsparse_tc._src import extensions

__all__ = ["KernelOptions", "FormatOptions"]

# The names for type checkers; the codes (and the names the checks below accept) are the
# extension's (csrc/common/ops.h), and a test keeps these literals equal to their names.
KernelChoice = Literal["auto", "rows", "windows"]
BackwardChoice = Literal["auto", "fused", "composed"]

# FFI attribute `kernel` of the CUDA SpMM and SDDMM handlers, from `KernelOptions.spmm` / `.sddmm`.
_KERNEL_CODES = extensions.KERNEL_CODES
# `KernelOptions.attention_backward` as the CPU extension's kernel_choices takes it.
_BACKWARD_CODES = extensions.ATTENTION_BACKWARD_CODES


# Kernel family names KernelOptions once took, and the names they go by now.
_RENAMED_KERNELS = {"cuda_core": "rows", "tensor_core": "windows"}


def _check_choice(name: str, value, allowed) -> None:
  if isinstance(value, str) and _RENAMED_KERNELS.get(value) in allowed:
    raise ValueError(
      f"{name}: the kernel family {value!r} is now called {_RENAMED_KERNELS[value]!r}; "
      f"use one of {', '.join(map(repr, allowed))}"
    )
  if value not in allowed:
    raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class KernelOptions:
  """Forces a kernel family per operator (GPU only); the defaults are the launch plans' choices
  (`jst.kernel_plan` tells which they are for a matrix, on any machine).

  Attributes:
    spmm: "auto" (the plan: the row kernels, on CUDA cores, where blocks are sparse or float32
      must be exact; the window kernels, on tensor cores, elsewhere), "rows" (the row kernels;
      fails for rows too long for their workspace) or "windows" (the window kernels, whose
      exact float32 kernel runs on CUDA cores). The names "cuda_core" and "tensor_core" these
      families once had are a ValueError saying so.
    sddmm: the same three, for the SDDMM ("rows" needs d * itemsize <= 1024 bytes).
    attention_backward: "auto" (the fused tensor-core backward where it applies and measured
      faster), "fused" (the tensor-core backward wherever its kernels take the operands: 16-bit,
      d = dv in {32, 64, 128}) or "composed" (a per-edge pass and three SpMMs).
    merge_split_windows: True (default) merges the pieces of a long window of the attention
      forward and backward across CTAs through a workspace; False makes each such window one
      CTA's work (the path the kernels take for windows past the workspace's capacity). Only
      worth changing to test that path.
  """

  spmm: KernelChoice = "auto"
  sddmm: KernelChoice = "auto"
  attention_backward: BackwardChoice = "auto"
  merge_split_windows: bool = True

  def __post_init__(self):
    _check_choice("KernelOptions.spmm", self.spmm, tuple(_KERNEL_CODES))
    _check_choice("KernelOptions.sddmm", self.sddmm, tuple(_KERNEL_CODES))
    _check_choice(
      "KernelOptions.attention_backward", self.attention_backward, tuple(_BACKWARD_CODES)
    )
    if not isinstance(self.merge_split_windows, bool):
      raise ValueError(
        f"KernelOptions.merge_split_windows must be a bool; got {self.merge_split_windows!r}"
      )

  @property
  def spmm_code(self) -> int:
    return _KERNEL_CODES[self.spmm]

  @property
  def sddmm_code(self) -> int:
    return _KERNEL_CODES[self.sddmm]

  @property
  def attention_backward_code(self) -> int:
    return _BACKWARD_CODES[self.attention_backward]


DEFAULT_KERNEL_OPTIONS = KernelOptions()


def kernel_options(options) -> KernelOptions:
  """`options` as a KernelOptions (None: the defaults); anything else is a TypeError."""
  if options is None:
    return DEFAULT_KERNEL_OPTIONS
  if not isinstance(options, KernelOptions):
    raise TypeError(
      f"options must be a jaxsparse_tc.KernelOptions or None; got {type(options).__name__}"
    )
  return options


@dataclasses.dataclass(frozen=True)
class FormatOptions:
  """How the format builder cuts a matrix's window schedule (docs/FORMAT.md, "Schedule").

  Attributes:
    split_blocks: most blocks per piece of a long window (1..32). None: the builder's rule
      (4 on graphs under 65,536 nonzeros, where a kernel's time is its longest piece; 8 or 16
      where only 1 to 32 windows are longer than 32 blocks and the pattern has fewer than
      131,072 blocks; else 32).
    grouped: whether small graphs get a grouped schedule (a split window's pieces merge inside
      one CTA of the attention forward). None: the builder's rule (graphs under 65,536
      nonzeros whose windows have at most 32 blocks, unless split_blocks is given); False
      turns it off; True asks for it and fails where the pattern does not qualify.
    row_order: the order in which the CUDA-core kernels walk rows (docs/FORMAT.md, "Row
      view"): "length" (by length class, row order inside) or "locality" (row order, the
      longest rows first). None: the builder's rule ("locality" where a window's rows read
      each of their distinct columns 1.55 times or more on average).
  """

  split_blocks: int | None = None
  grouped: bool | None = None
  row_order: str | None = None

  def __post_init__(self):
    from jaxsparse_tc._src.pattern import ROW_ORDERS, SPLIT_BLOCKS

    if self.split_blocks is not None and (
      not isinstance(self.split_blocks, int)
      or isinstance(self.split_blocks, bool)
      or not 1 <= self.split_blocks <= SPLIT_BLOCKS
    ):
      raise ValueError(
        f"FormatOptions.split_blocks must be None or an integer in "
        f"[1, {SPLIT_BLOCKS}]; got {self.split_blocks!r}"
      )
    if self.grouped is not None and not isinstance(self.grouped, bool):
      raise ValueError(f"FormatOptions.grouped must be None or a bool; got {self.grouped!r}")
    if self.row_order is not None and self.row_order not in ROW_ORDERS:
      raise ValueError(
        f"FormatOptions.row_order must be None or one of {ROW_ORDERS}; got {self.row_order!r}"
      )
    if self.grouped and self.split_blocks is not None:
      raise ValueError(
        "FormatOptions: a grouped schedule chooses its own pieces; give "
        "split_blocks or grouped=True, not both"
      )
