"""Window/block statistics of a pattern in the format (docs/FORMAT.md), computed in C++
(csrc/cpu/reorder.cc), before and after a node permutation."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxsparse_tc import _cpu
from jaxsparse_tc._src.reorder import inputs


@dataclasses.dataclass(frozen=True)
class BlockStats:
  """Window/block statistics of a pattern in the format (docs/FORMAT.md): `windows` row windows
  of 8 rows (`nonempty_windows` with a nonzero), `condensed_cols` distinct columns summed over
  windows, `blocks` 8x8 blocks, `nnz` distinct entries, and `block_nnz_hist[k]` the number of
  blocks holding k nonzeros (k = 1..64)."""

  windows: int
  nonempty_windows: int
  condensed_cols: int
  blocks: int
  nnz: int
  block_nnz_hist: np.ndarray

  @property
  def nnz_per_block(self) -> float:
    """Mean nonzeros per 8x8 block (Acc-SpMM's MeanNNZTC): at most 64."""
    return self.nnz / self.blocks if self.blocks else 0.0

  @property
  def cols_per_window(self) -> float:
    """Mean distinct columns per row window (over all windows)."""
    return self.condensed_cols / self.windows if self.windows else 0.0

  @property
  def fill(self) -> float:
    """nnz / (64 blocks): the fraction of the blocks' cells that hold a nonzero."""
    return self.nnz / (64 * self.blocks) if self.blocks else 0.0

  def block_nnz_quantiles(self, q=(0.1, 0.5, 0.9)) -> tuple:
    """Quantiles of the nonzeros per block (over blocks)."""
    cum = np.cumsum(self.block_nnz_hist)
    if cum[-1] == 0:
      return tuple(0 for _ in q)
    return tuple(int(np.searchsorted(cum, x * cum[-1], side="left")) for x in q)

  def __str__(self) -> str:
    q10, q50, q90 = self.block_nnz_quantiles()
    return (
      f"{self.nnz_per_block:.2f} nnz/block (p10/p50/p90 {q10}/{q50}/{q90}), "
      f"{self.cols_per_window:.1f} cols/window, fill {self.fill:.3f}, {self.blocks} blocks"
    )


def stats(rows, cols, m: int, n: int, row_new=None, col_new=None) -> BlockStats:
  """BlockStats of the COO pattern (rows, cols) of an m x n matrix, its rows and columns
  renamed by `row_new[old] = new` and `col_new` where given."""
  d = _cpu.block_stats(rows, cols, m, n, row_new, col_new, inputs.default_threads())
  return BlockStats(
    int(d["windows"]),
    int(d["nonempty_windows"]),
    int(d["condensed_cols"]),
    int(d["blocks"]),
    int(d["nnz"]),
    np.asarray(d["block_nnz_hist"]),
  )


def block_stats(A, perm=None, *, num_nodes: int | None = None) -> BlockStats:
  """The block statistics of A's pattern (a SparseMatrix, scipy matrix, edge_index or
  (rows, cols) pair, as `reorder` takes), or of P A P^T for a permutation `perm[new] = old`."""
  rows, cols, (m, n) = inputs.coo(A, num_nodes)
  if perm is None:
    return stats(rows, cols, m, n)
  inv = inputs.inverse(inputs.check_perm(perm, n))
  return stats(rows, cols, m, n, inv, inv)
