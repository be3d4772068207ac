"""Small graphs: does a shorter row piece shorten the row kernels' device time? (NOTES, session 8)

On a small graph every row kernel's device time is its longest chain of dependent loads: a lane
group walks a whole row of up to `piece` entries, 4 entries per round trip, while longer rows
are shared by a CTA's groups (row_piece: 32 on Cora before session 8, 16 since, after this
probe). This times the same SpMM with the row schedule rebuilt for shorter pieces (the CTA
share grown so that no row needs a workspace slot):
chain (one program of 32 dependent SpMMs, wall / 32) and device (the chain queued behind a
matmul, latency_probe.py's method), us per SpMM, d=128, fp16 and exact float32; and SDDMM's
device time (K independent fp16 calls, d=128). LATENCY_PROBE_K=128 steadies small graphs.

  python3 scripts/piece_probe.py [graph]        (needs the CUDA extension and a GPU)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402
from jaxsparse_tc._src import pattern as pattern_lib  # noqa: E402
from latency_probe import K, chain_and_device_us  # noqa: E402

SHAPES = [(32, 16), (16, 32), (8, 64), (4, 128)]  # (piece, CTA pieces); (32, 16): Cora's old default


def with_piece(p, m, piece, cta_pieces):
  ptr = np.concatenate([[0], np.cumsum(np.bincount(np.asarray(p.rows), minlength=m))])
  old = pattern_lib.ROW_CTA_PIECES
  pattern_lib.ROW_CTA_PIECES = cta_pieces
  try:
    sched = pattern_lib.row_schedule(ptr, piece)
  finally:
    pattern_lib.ROW_CTA_PIECES = old
  return p._replace(row_schedule=jnp.asarray(sched))


def main():
  name = sys.argv[1] if len(sys.argv) > 1 else "cora"
  csr = common.package_graph(name).tocsr()
  deg = np.maximum(np.asarray(csr.sum(1)).ravel(), 1)
  csr = csr.multiply(1.0 / deg[:, None]).tocsr()
  A = jst.SparseMatrix.from_scipy(csr)
  print(f"# device: {jax.devices()[0].device_kind}; {name}: {csr.shape[0]} rows, nnz {csr.nnz}, "
        f"default piece {pattern_lib.row_piece(A.nnz)}")
  x = jnp.asarray(np.random.default_rng(0).standard_normal((csr.shape[1], 128)), jnp.float32)
  # SDDMM: K independent calls on distinct operand pairs in one program (bench_chained's fan).
  rng = np.random.default_rng(1)
  qs = tuple(jnp.asarray(rng.standard_normal((csr.shape[0], 128)), jnp.float16) for _ in range(K))
  ys = tuple(jnp.asarray(rng.standard_normal((csr.shape[1], 128)), jnp.float16) for _ in range(K))
  fan = jax.jit(lambda B, qs, ys: tuple(jst.sddmm(B, q, y).values for q, y in zip(qs, ys)))
  print("| piece | CTA pieces | fp16 chain | fp16 device | fp32 chain | fp32 device "
        "| SDDMM fp16 device |")
  print("|---|---|---|---|---|---|---|")
  for piece, cta in SHAPES:
    pt = with_piece(A.pattern, A.shape[0], piece, cta)
    ptt = with_piece(A.pattern_t, A.shape[1], piece, cta)
    B = jst.SparseMatrix(A.values, pt, ptt, A.perm_t, A.perm_t_inv, A.input_to_format, A.shape)
    cells = []
    for dt in (jnp.float16, jnp.float32):
      Bd = B.with_values(B.values.astype(dt))
      ch, dev = chain_and_device_us(lambda A, x: jst.spmm(A, x), (Bd,), x.astype(dt))
      cells += [f"{ch:.1f}", f"{dev:.1f}"]
    B16 = B.with_values(B.values.astype(jnp.float16))
    cells.append(f"{common.time_jax_device(fan, (B16, qs, ys), K)[0]:.1f}")
    print(f"| {piece} | {cta} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
