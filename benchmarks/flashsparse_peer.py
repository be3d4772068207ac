"""FlashSparse (github.com/ParCIS/FlashSparse) as a timed peer of benchmarks/bench_kernels.py.

FlashSparse has no licence: nothing of it is in this repository. Build it yourself (its
setup.py builds the PyTorch extensions FS_Block, FS_SpMM, FS_SDDMM) and pass the folder that
holds the built modules (or its checkout, whose build/lib.* folders are searched too):

    python -m benchmarks.bench_kernels --flashsparse /path/to/FlashSparse/FlashSparse ...
    python -m benchmarks.flashsparse_peer /path/to/FlashSparse/FlashSparse   # import check

Calls (its public Python functions, as its own tests make them): the CSR (int32, rows padded
to a multiple of 16 as its datasets pad them) goes through FS_Block's preprocessing into its
8-row windows (`blockProcess_fp16_balance` 8x8, `blockProcess_tf32_balance` 8x4, parts of 2;
SDDMM `blockProcess_sddmm_balance` 8x16, parts of 32), then FS_SpMM.forward_{fp16,tf32}_balance
and FS_SDDMM.forward_gen_{fp16,tf32} run the kernel `epochs` times and return the output and
the mean kernel milliseconds of its own CUDA-event timer (host tensors in and out: the copies are
outside its timer; the timer has no warm-up, so a one-launch call runs first, and it checks the
SpMM output). Its SDDMM is X X^T sampled on the pattern (one operand); ours in the grid
takes two of the same shape, so the work is the same.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import numpy as np

IMPL = "flashsparse"
MODULES = ("FS_Block", "FS_SpMM", "FS_SDDMM")
HOW = "FlashSparse's CUDA-event timer, mean of {} launches"


class FlashSparseUnavailable(ImportError):
  """FlashSparse could not be loaded from the path given."""


@dataclasses.dataclass
class FlashSparse:
  """The loaded extension modules of a built FlashSparse."""

  path: Path
  block: object
  spmm: object
  sddmm: object


def _search_dirs(root: Path) -> list[Path]:
  """root itself, then the build/lib.* folders a `setup.py build` leaves under it."""
  return [root, *sorted(p for p in (root / "build").glob("lib*") if p.is_dir())]


def load(path) -> FlashSparse:
  """FlashSparse's modules (MODULES) imported from `path` (put on sys.path); raises
  FlashSparseUnavailable naming the path and what is missing."""
  root = Path(path).expanduser().resolve()
  if not root.is_dir():
    raise FlashSparseUnavailable(
      f"--flashsparse: {path!r} is not a folder; expected a built FlashSparse (the folder of "
      f"its setup.py after `python setup.py build_ext --inplace`, or one holding {MODULES})"
    )
  for d in reversed(_search_dirs(root)):
    if str(d) not in sys.path:
      sys.path.insert(0, str(d))
  loaded, failed = {}, []
  for name in MODULES:
    try:
      loaded[name] = importlib.import_module(name)
    except ImportError as e:  # a missing module or a missing dependency (torch, CUDA libraries)
      failed.append(f"{name} ({type(e).__name__}: {e})")
  if failed:
    raise FlashSparseUnavailable(
      f"--flashsparse {root}: cannot import {', '.join(failed)}; searched "
      f"{[str(d) for d in _search_dirs(root)]}. Build FlashSparse's extensions there first "
      f"(they need torch with CUDA)."
    )
  return FlashSparse(root, loaded["FS_Block"], loaded["FS_SpMM"], loaded["FS_SDDMM"])


def _padded_csr(csr):
  """torch int32 row pointers and columns of csr with rows padded (empty) to a multiple of 16
  as FlashSparse's datasets pad them, and the padded row count."""
  import torch

  m = csr.shape[0]
  padded = m + 16 - m % 16
  indptr = np.concatenate([csr.indptr, np.full(padded - m, csr.indptr[-1])]).astype(np.int32)
  return torch.from_numpy(indptr), torch.from_numpy(csr.indices.astype(np.int32)), padded


# (preprocessing, its window and width, kernel, value dtype) per dtype, as its tests call them.
_SPMM = {
  "fp16": ("blockProcess_fp16_balance", 8, 8, "forward_fp16_balance", "float16"),
  "fp32": ("blockProcess_tf32_balance", 8, 4, "forward_tf32_balance", "float32"),
}
# Its SpMM variants, all timed, the fastest reported ("FlashSparse's best"): `balance` with
# windows cut into parts of 2 and of 16 blocks, `map` with 4 and 8 warps per block (its
# per-edge preprocessing, blockProcess_{fp16,tf32}).
SPMM_VARIANTS = (("balance", 2), ("balance", 16), ("map", 4), ("map", 8))
_MAP = {
  "fp16": ("blockProcess_fp16", "forward_fp16_map"),
  "fp32": ("blockProcess_tf32", "forward_tf32_map"),
}
_SDDMM = {"fp16": "forward_gen_fp16", "fp32": "forward_gen_tf32"}
# A variant's result counts as right within this error (max over the reference's max): its fp16
# and tf32 variants measured 4e-4 to 2e-3 on the dense graphs.
CHECK_TOL = 1e-2


def spmm_call(
  fs: FlashSparse, csr, x: np.ndarray, dtype: str, epochs: int = 20, variant=("balance", 2)
):
  """(A x as float32 numpy, mean kernel ms) of FlashSparse's SpMM `variant` (SPMM_VARIANTS) on
  A's pattern with unit values (its preprocessing takes a node scale s and stores s[row] *
  s[col], or an edge scale: ones, as its tests pass)."""
  import torch

  kind, arg = variant
  prep, window, width, fn, vdt = _SPMM[dtype]
  indptr, indices, padded = _padded_csr(csr)
  tdt = getattr(torch, vdt)
  xt = torch.from_numpy(np.ascontiguousarray(x)).to(tdt)
  if kind == "map":
    map_prep, map_fn = _MAP[dtype]
    rp, ci, vals = getattr(fs.block, map_prep)(
      indptr, indices, torch.ones(indices.shape[0], dtype=tdt), window, width
    )
    out, ms = getattr(fs.spmm, map_fn)(
      rp, ci, vals, xt, padded, x.shape[1], csr.shape[0], epochs, arg
    )
  else:
    scale = torch.ones(padded, dtype=tdt)
    blocked = getattr(fs.block, prep)(indptr, indices, scale, window, width, arg)
    rows, cols, vals, t_window_row, t_atomic = blocked
    out, ms = getattr(fs.spmm, fn)(
      rows, cols, vals, t_window_row, t_atomic, xt, padded, x.shape[1], csr.shape[0], epochs
    )
  return out.float().numpy()[: csr.shape[0]], float(ms)


def sddmm_call(fs: FlashSparse, csr, x: np.ndarray, dtype: str, epochs: int = 20, max_part=4):
  """(output in FlashSparse's block order, mean kernel ms) of its SDDMM X X^T on A's pattern."""
  import torch

  indptr, indices, _ = _padded_csr(csr)
  rows, cols, vals, t_window_row = fs.block.blockProcess_sddmm_balance(indptr, indices, 8, 16, 32)
  tdt = torch.float16 if dtype == "fp16" else torch.float32
  xt = torch.from_numpy(np.ascontiguousarray(x)).to(tdt)
  out, ms = getattr(fs.sddmm, _SDDMM[dtype])(
    x.shape[1], rows, cols, vals, t_window_row, xt, epochs, max_part
  )
  return out, float(ms)


def peer_rows(add, fs: FlashSparse, csr, ops, dims, dtypes, epochs: int = 20) -> None:
  """bench_kernels' rows of FlashSparse for one (graph, order): `add` is its recorder. SpMM rows
  carry `rel_err`: the max error of A x (A's pattern, unit values) against float64 scipy, over
  the reference's max."""
  rng = np.random.default_rng(0)
  pattern = csr.astype(np.float64)
  pattern.data[:] = 1.0
  for op in ("spmm", "sddmm"):
    if op not in ops:
      continue
    for dtype in dtypes:
      if dtype not in _SPMM:
        continue
      for d in dims:
        x = rng.standard_normal((csr.shape[0], d)).astype(np.float32)
        if op == "spmm":

          def timed(x=x, dtype=dtype):
            # Per variant one launch for the check (balance's atomics accumulate over launches
            # into an output zeroed once) that also warms up (its timer has no warm-up), then
            # the timed run; the fastest variant within CHECK_TOL of float64 is the row (a wrong
            # one is never "best"; none right: an error row), all of them in `variants`.
            want = pattern @ x.astype(np.float64)
            runs = {}
            for variant in SPMM_VARIANTS:
              out, _ = spmm_call(fs, csr, x, dtype, 1, variant)
              _, ms = spmm_call(fs, csr, x, dtype, epochs, variant)
              err = float(np.nanmax(np.abs(out - want)) / max(np.max(np.abs(want)), 1e-30))
              if not np.isfinite(out).all():
                err = float("nan")
              runs[f"{variant[0]}-{variant[1]}"] = (ms * 1e3, err)
            right = [k for k in runs if runs[k][1] <= CHECK_TOL]  # NaN fails too
            if not right:
              raise RuntimeError(
                f"no FlashSparse SpMM variant matched float64 within {CHECK_TOL}: "
                + ", ".join(f"{k} {e:.2g}" for k, (_, e) in runs.items())
              )
            best = min(right, key=lambda k: runs[k][0])
            return {
              "us_per_call": runs[best][0],
              "wall_us": None,
              "how": HOW.format(epochs) + f", fastest of its variants: {best}",
              "rel_err": runs[best][1],
              "variants": {k: {"us": us, "rel_err": e} for k, (us, e) in runs.items()},
            }

        else:

          def timed(x=x, dtype=dtype):
            sddmm_call(fs, csr, x, dtype, 1)  # warm-up: its timer has none
            _, ms = sddmm_call(fs, csr, x, dtype, epochs)
            return {"us_per_call": ms * 1e3, "wall_us": None, "how": HOW.format(epochs)}

        add(op, d, dtype, IMPL, timed)


def main(argv=None) -> None:
  """Import check: python -m benchmarks.flashsparse_peer PATH."""
  import argparse

  ap = argparse.ArgumentParser(description="check that a built FlashSparse imports")
  ap.add_argument("path")
  a = ap.parse_args(argv)
  try:
    fs = load(a.path)
  except FlashSparseUnavailable as e:
    raise SystemExit(str(e)) from None
  print(
    f"FlashSparse from {fs.path}: {', '.join(m.__file__ for m in (fs.block, fs.spmm, fs.sddmm))}"
  )


if __name__ == "__main__":
  main()
