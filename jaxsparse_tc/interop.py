"""Conversions between SparseMatrix and `jax.experimental.sparse.BCOO`.

    B = jst.interop.to_bcoo(A)            # or A.to_bcoo(): traceable in A's values
    A2 = jst.interop.from_bcoo(B)         # or SparseMatrix.from_bcoo(B): builds the pattern

`from_bcoo` builds the format on the host, so the BCOO's indices must be concrete (outside
jit, or closed over); `to_bcoo` only gathers, and works under jit, grad and vmap.
"""

from jaxsparse_tc._src.interop import (
  from_bcoo,
  to_bcoo,
)

__all__ = ["from_bcoo", "to_bcoo"]
