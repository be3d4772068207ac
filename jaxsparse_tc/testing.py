"""Helpers for testing code built on jaxsparse_tc: random patterns that reach the format's
corner cases, and the relative error the tests compare against float64 references with."""

from __future__ import annotations

import numpy as np

__all__ = ["random_coo", "window_blocks_coo", "rel_err"]


def random_coo(rng, m, n, density, duplicates=0.1):
  """Unsorted COO with some duplicate entries."""
  count = int(m * n * density)
  rows = rng.integers(0, m, count) if m else np.zeros(0, np.int64)
  cols = rng.integers(0, n, count) if n else np.zeros(0, np.int64)
  dup = rng.random(count) < duplicates
  rows = np.concatenate([rows, rows[dup]])
  cols = np.concatenate([cols, cols[dup]])
  vals = rng.standard_normal(rows.size).astype(np.float32)
  return rows, cols, vals


def window_blocks_coo(rng, max_blocks: int = 32, n: int = 4000, keep: float = 0.6):
  """COO indices of 8 * (max_blocks + 1) rows in which the rows of window w draw from a shared
  pool of 8 * w columns: windows of 0 .. max_blocks blocks (every piece count of a grouped
  schedule), some rows empty."""
  rows, cols = [], []
  for w in range(max_blocks + 1):
    pool = rng.choice(n, size=8 * w, replace=False)
    for r in range(8):
      c = pool[rng.random(pool.size) < keep]
      rows.append(np.full(c.size, 8 * w + r))
      cols.append(c)
  return np.concatenate(rows), np.concatenate(cols), (8 * (max_blocks + 1), n)


def rel_err(out, ref) -> float:
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  denom = np.linalg.norm(ref)
  return float(np.linalg.norm(out - ref) / (denom if denom else 1.0))
