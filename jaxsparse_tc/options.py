"""Typed, frozen options: which kernel runs, and how a matrix's schedule is cut.

Nothing in the library reads the environment. Where a test, a benchmark or a user wants a
kernel other than the launch plan's choice (docs/DESIGN.md, "Which kernel runs"), they say so
with a `KernelOptions`, passed as a static argument to an operator:

    opts = jst.KernelOptions(spmm="rows")
    Y = jst.spmm(A, X, options=opts)

The options become primitive parameters, then FFI attributes of the CUDA handlers, so they are
part of jit's cache key: two programs that differ in options compile separately. The CPU kernels
have one implementation each and ignore them. Inside a jitted function close over the options
or pass them with `static_argnames`: they are hashable.

`FormatOptions` is the format builder's counterpart (`SparseMatrix.from_coo(..., format=...)`):
it decides how the window schedule is cut when the matrix is built, so it lives with the matrix.
"""

from jaxsparse_tc._src.options import (
  BackwardChoice,
  FormatOptions,
  KernelChoice,
  KernelOptions,
)

__all__ = ["KernelOptions", "FormatOptions", "KernelChoice", "BackwardChoice"]
