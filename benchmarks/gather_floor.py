"""The gather floor: what rate does the GPU gather random dense rows at? (SpMM kernels with 5 and
39 instructions per nonzero measured within 1.4x of each other in rows per second: the gathers,
not the arithmetic, bound them.)

One kernel, no arithmetic beyond a running xor: groups of L lanes each gather `per_group`
consecutive rows of an index list, U rows in flight per lane (indices of a batch loaded first,
as the row kernels do), VB bytes per lane, rows of L * VB bytes. Occupancy is capped with unused
dynamic shared memory. Indices: the column list of rmat17-d16 in CSR order (what SpMM gathers) and
uniform random ids. Prints rows/s and bytes/s per shape, with the device name.

  python3 -m benchmarks.gather_floor                (needs cupy and a GPU)
  python3 -m benchmarks.gather_floor --rmat 20,8    (another R-MAT graph: scale, degree; only its
      column list, rows of 64/256/512 bytes, 64 warps/SM)
"""

from __future__ import annotations

import argparse

import numpy as np

SOURCE = r"""
extern "C" __global__ void gather(const char* __restrict__ x, const int* __restrict__ idx, long long m,
                       int row_bytes, int per_group, unsigned* __restrict__ out) {
  const int li = threadIdx.x % L;
  const long long group = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / L;
  const long long start = group * per_group;
  if (start >= m) return;
  const long long end = start + per_group < m ? start + per_group : m;
  unsigned acc = 0;
  for (long long k = start; k < end; k += U) {
    int r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = k + u < end ? __ldg(idx + k + u) : -1;
    if (VB == 16) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        v[u] = r[u] >= 0 ? __ldg(reinterpret_cast<const uint4*>(x + (long long)r[u] * row_bytes) + li)
                         : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    } else {
      uint2 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        v[u] = r[u] >= 0 ? __ldg(reinterpret_cast<const uint2*>(x + (long long)r[u] * row_bytes) + li)
                         : make_uint2(0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""

THREADS = 256
# (lanes per row, bytes per lane, rows in flight per lane)
SHAPES = [
  (16, 16, 1),
  (16, 16, 2),
  (16, 16, 4),
  (16, 16, 8),
  (32, 8, 4),
  (8, 16, 4),
  (32, 16, 4),
  (32, 16, 2),
]
WARPS_PER_SM = [64, 32, 16]


def main() -> None:
  import cupy as cp

  ap = argparse.ArgumentParser(description="the GPU's rate of gathering random dense rows")
  ap.add_argument("--rmat", default=None, help="SCALE,DEGREE of another R-MAT graph")
  rmat_arg = ap.parse_args().rmat

  from benchmarks import common

  props = cp.cuda.runtime.getDeviceProperties(0)
  smem_per_sm = props["sharedMemPerMultiprocessor"]
  print("# device:", props["name"].decode())
  shapes, warps_per_sm = SHAPES, WARPS_PER_SM
  if rmat_arg:
    scale, deg = (int(v) for v in rmat_arg.split(","))
    csr = common.rmat(scale, deg)
    index_sets = {f"rmat{scale}-d{deg} csr cols": csr.indices.astype(np.int32)}
    shapes, warps_per_sm = [(4, 16, 4), (16, 16, 4), (32, 16, 4)], [64]
  else:
    csr = common.rmat(17, 16)
    index_sets = {
      "rmat17 csr cols": csr.indices.astype(np.int32),
      "uniform": np.random.default_rng(0).integers(0, csr.shape[1], csr.nnz).astype(np.int32),
    }
  n = csr.shape[1]
  print(
    "| indices | row bytes | lanes x bytes | rows in flight | warps/SM | us | G rows/s | TB/s |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for iname, idx_np in index_sets.items():
    idx = cp.asarray(idx_np)
    m = idx.size
    for lanes, vb, u in shapes:
      row_bytes = lanes * vb
      x = cp.asarray(
        np.random.default_rng(1).integers(0, 2**31, (n, row_bytes // 4)), dtype=cp.uint32
      )
      kern = cp.RawKernel(f"#define L {lanes}\n#define VB {vb}\n#define U {u}\n" + SOURCE, "gather")
      per_group = 16
      groups = -(-m // per_group)
      blocks = -(-groups * lanes // THREADS)
      out = cp.empty(blocks * THREADS, cp.uint32)
      for warps in warps_per_sm:
        ctas = warps * 32 // THREADS
        smem = smem_per_sm // ctas - 1024  # caps the CTAs per SM
        if smem > 48 * 1024:
          kern.max_dynamic_shared_size_bytes = smem
        args = (x, idx, np.int64(m), np.int32(row_bytes), np.int32(per_group), out)
        us = common.time_cupy(lambda i: kern((blocks,), (THREADS,), args, shared_mem=max(smem, 0)))
        print(
          f"| {iname} | {row_bytes} | {lanes} x {vb} | {u} | {warps} | {us:.1f} | "
          f"{m / us / 1e3:.2f} | {m * row_bytes / us / 1e6:.2f} |",
          flush=True,
        )


if __name__ == "__main__":
  main()
