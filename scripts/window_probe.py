"""Where does a window-entry tensor-core SpMM lose time against a bare gather? (NOTES, session 7)

A stand-alone copy of the session's withdrawn window kernel (fp16, d=128, 64-feature slabs: the
MMA's k over a window's CSR-order entries, entries a chunk ahead one per lane, handed out by
shuffles) on rmat17-d16's CSR, in shapes that switch its parts on and off:
  MMA=1 the tensor-core sums (values, B fragments, PRMT, mma.sync); MMA=0 xor of the gathered rows;
  P   16-entry steps per chunk (gathers issued together: 8 x P 16-byte loads per lane);
  MINB CTAs of 4 warps per SM the register budget aims at (8: 64 registers, 32 warps/SM);
  POS=1 each value read at its position in the format's order, as the library's row view does
       (POS=0: at its CSR index); both read (column, position) pairs, 8 bytes per entry (the
       first table in NOTES, session 7, was taken with 4-byte columns: commit 89b4af3);
  PING=1 each call reads the previous call's output as X (the chained benchmark's data flow).
Windows longer than 512 entries are cut into items (their sums are not combined: a timing model).
Prints us per call and the occupancy, with the device name; gather_probe.py gives the floor.

  python3 scripts/window_probe.py            (needs cupy and a GPU)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

SOURCE = r"""
__device__ __forceinline__ unsigned word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

extern "C" __global__ void __launch_bounds__(128, MINB)
win(const int4* __restrict__ items, long long nitems, const int* __restrict__ row_ptr,
    const int2* __restrict__ cols, const unsigned short* __restrict__ vals,
    const uint4* __restrict__ x, int row_vecs, int m, uint4* __restrict__ out) {
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int fv = blockIdx.y * 8 + g;  // this thread's 16-byte vector of a row
  int ks[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) ks[q] = 2 * t + (q & 1) + 8 * (q >> 1);
  const long long warps = (long long)gridDim.x * 4;
  long long item = blockIdx.x * 4LL + (threadIdx.x >> 5);
  if (item >= nitems) return;
  int4 it = items[item];
  int2 ce = it.y + lane < it.z && lane < 16 * P ? cols[it.y + lane] : make_int2(-1, 0);
  for (; item < nitems; item += warps) {
    const long long next = item + warps;
    const int4 nit = next < nitems ? items[next] : make_int4(0, 0, 0, 0);
    const int row = it.x * 8 + g;
    int lo = it.y, hi = it.y;
    if (row < m) {
      lo = max(row_ptr[row], it.y);
      hi = min(row_ptr[row + 1], it.z);
    }
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    unsigned xacc = 0;
    for (int b = it.y; b < it.z; b += 16 * P) {
#if POS
      const unsigned vraw = ce.x >= 0 ? vals[ce.y] : 0u;
#else
      const unsigned vraw = b + lane < it.z && lane < 16 * P ? vals[b + lane] : 0u;
#endif
      uint4 xw[P][4];
#pragma unroll
      for (int st = 0; st < P; ++st)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int c = __shfl_sync(full, ce.x, 16 * st + ks[q]);
          xw[st][q] = c >= 0 ? __ldg(x + (long long)c * row_vecs + fv) : make_uint4(0, 0, 0, 0);
        }
      const int nb = b + 16 * P;
      const int2 none = make_int2(-1, 0);
      ce = nb < it.z ? (nb + lane < it.z && lane < 16 * P ? cols[nb + lane] : none)
                     : (nit.y + lane < nit.z && lane < 16 * P ? cols[nit.y + lane] : none);
#pragma unroll
      for (int st = 0; st < P; ++st) {
#if MMA
        unsigned v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int src = 16 * st + ks[q], k = b + src;
          const unsigned raw = __shfl_sync(full, vraw, src);
          v[q] = k >= lo && k < hi ? raw : 0u;
        }
        const unsigned b0 = v[0] | (v[1] << 16), b1 = v[2] | (v[3] << 16);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const unsigned w0 = word(xw[st][0], j), w1 = word(xw[st][1], j);
          const unsigned w2 = word(xw[st][2], j), w3 = word(xw[st][3], j);
          const unsigned a0 = __byte_perm(w0, w1, 0x5410), a1 = __byte_perm(w0, w1, 0x7632);
          const unsigned a2 = __byte_perm(w2, w3, 0x5410), a3 = __byte_perm(w2, w3, 0x7632);
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
              "{%8,%9}, {%0,%1,%2,%3};\n"
              : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
              : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
#else
#pragma unroll
        for (int q = 0; q < 4; ++q)
          xacc ^= xw[st][q].x ^ xw[st][q].y ^ xw[st][q].z ^ xw[st][q].w;
        xacc ^= vraw ^ unsigned(lo ^ hi);
#endif
      }
    }
    if (it.y >= it.z)
      ce = nit.y + lane < nit.z && lane < 16 * P ? cols[nit.y + lane] : make_int2(-1, 0);
    const int r0 = it.x * 8 + 2 * t;
    uint4 o0, o1;
#if MMA
    unsigned h0[4], h1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      h0[j] = __float_as_uint(acc[j][0]) ^ (__float_as_uint(acc[j][2]) << 16);
      h1[j] = __float_as_uint(acc[j][1]) ^ (__float_as_uint(acc[j][3]) << 16);
    }
    o0 = make_uint4(h0[0], h0[1], h0[2], h0[3]);
    o1 = make_uint4(h1[0], h1[1], h1[2], h1[3]);
#else
    o0 = o1 = make_uint4(xacc, xacc, xacc, xacc);
#endif
    if (r0 < m) out[(long long)r0 * row_vecs + fv] = o0;
    if (r0 + 1 < m) out[(long long)(r0 + 1) * row_vecs + fv] = o1;
    it = nit;
  }
}
"""

SHAPES = [  # (MMA, P, MINB, POS, PING)
    (1, 2, 5, 0, 0), (0, 2, 5, 0, 0), (1, 2, 4, 0, 0), (1, 1, 8, 0, 0), (0, 1, 8, 0, 0),
    (1, 1, 6, 0, 0), (1, 2, 8, 0, 0),
    # the library's parts, one at a time and together (v3 measured 158 us in the library)
    (1, 1, 8, 1, 0), (1, 1, 8, 0, 1), (1, 1, 8, 1, 1), (0, 1, 8, 1, 0)]
PIECE = 512
if os.environ.get("WINDOW_PROBE_SHAPES"):  # e.g. "1,1,8,1,1;0,1,8,0,0" (for ncu: one shape)
  SHAPES = [tuple(int(v) for v in s.split(",")) for s in os.environ["WINDOW_PROBE_SHAPES"].split(";")]


def window_items(indptr: np.ndarray) -> np.ndarray:
  m = indptr.size - 1
  wptr = indptr[np.minimum(np.arange(0, -(-m // 8) * 8 + 1, 8), m)].astype(np.int64)
  items = []
  for w in range(wptr.size - 1):
    b, e = wptr[w], wptr[w + 1]
    items.extend((w, s, min(s + PIECE, e), 0) for s in range(b, max(e, b + 1), PIECE))
  items = np.asarray(items, np.int32)
  return items[np.argsort(-(items[:, 2] - items[:, 1]), kind="stable")]


def format_positions(csr) -> np.ndarray:
  """Each CSR entry's position in the format's value order (window, then column, then row)."""
  coo = csr.tocoo()
  order = np.lexsort((coo.row, coo.col, coo.row // 8))
  pos = np.empty(csr.nnz, np.int64)
  pos[order] = np.arange(csr.nnz)
  return pos  # coo of a canonical CSR lists entries in CSR order


def main() -> None:
  import cupy as cp

  import common

  props = cp.cuda.runtime.getDeviceProperties(0)
  sms = props["multiProcessorCount"]
  print("# device:", props["name"].decode())
  csr = common.rmat(17, 16)
  m, n = csr.shape
  items = cp.asarray(window_items(csr.indptr))
  row_ptr = cp.asarray(csr.indptr.astype(np.int32))
  csr.sort_indices()
  csr_pairs = np.stack([csr.indices, np.arange(csr.nnz)], 1).astype(np.int32)
  pos_pairs = np.stack([csr.indices, format_positions(csr)], 1).astype(np.int32)
  vals = cp.asarray(np.random.default_rng(0).standard_normal(csr.nnz).astype(np.float16).view(np.uint16))
  x = cp.asarray(np.random.default_rng(1).standard_normal((n, 128)).astype(np.float16))
  out = cp.asarray(np.random.default_rng(2).standard_normal((m, 128)).astype(np.float16))
  print(f"rmat17-d16: {m} rows, {csr.nnz} nnz, {items.shape[0]} items; d=128 fp16, 2 slabs of 64")
  print("| MMA | P | MINB | POS | PING | registers | warps/SM | us |")
  print("|---|---|---|---|---|---|---|---|")
  for mma, p, minb, pos, ping in SHAPES:
    defs = f"#define MMA {mma}\n#define P {p}\n#define MINB {minb}\n#define POS {pos}\n"
    kern = cp.RawKernel(defs + SOURCE, "win")
    regs = kern.num_regs
    per_sm = min(16, 65536 // (128 * (-(-regs // 8) * 8)))
    grid = (per_sm * sms, 2)
    pairs = cp.asarray(pos_pairs if pos else csr_pairs)
    bufs = [x, out]  # square graph: the output can be the next call's X

    def call(i):
      src, dst = (bufs[i % 2], bufs[1 - i % 2]) if ping else (x, out)
      kern(grid, (128,), (items, np.int64(items.shape[0]), row_ptr, pairs, vals, src,
                          np.int32(16), np.int32(m), dst))

    us = common.time_cupy(call)
    print(f"| {mma} | {p} | {minb} | {pos} | {ping} | {regs} | {per_sm * 4} | {us:.1f} |",
          flush=True)


if __name__ == "__main__":
  main()
