"""Shared benchmark helpers: graphs, timing, the results table."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from benchmarks import standins

ROOT = Path(__file__).resolve().parent.parent
# The benchmark graphs: ../shared/data beside the checkout, or shared/data inside it (a GPU
# machine gets a copy of the checkout only).
SHARED_DATA = next(
  (p for p in (ROOT.parent / "shared" / "data", ROOT / "shared" / "data") if p.exists()),
  ROOT.parent / "shared" / "data",
)


def rmat(scale: int, edges_per_node: int, seed: int = 0, a=0.57, b=0.19, c=0.19) -> sp.csr_matrix:
  """R-MAT graph with 2**scale nodes, node ids randomly permuted, duplicates removed.

  The graphs of ../shared/BASELINES.md (rmat17-d16: scale 17, 16 edges per node; rmat20-d8).
  """
  rng = np.random.default_rng(seed)
  n = 1 << scale
  e = n * edges_per_node
  rows = np.zeros(e, np.int64)
  cols = np.zeros(e, np.int64)
  for _ in range(scale):
    u = rng.random(e)
    right = (u >= a) & (u < a + b) | (u >= a + b + c)
    down = u >= a + b
    rows = (rows << 1) | down
    cols = (cols << 1) | right
  perm = rng.permutation(n)
  m = sp.coo_matrix((np.ones(e, np.float32), (perm[rows], perm[cols])), shape=(n, n)).tocsr()
  m.sum_duplicates()
  m.data[:] = rng.uniform(0.5, 1.5, m.nnz).astype(np.float32)
  return m


_RMAT_CHUNK = 1 << 22  # edges per generator chunk (part of the seed: do not change)


def rmat_csr(
  scale: int, edges_per_node: int, seed: int = 0, a=0.57, b=0.19, c=0.19, threads: int | None = None
) -> sp.csr_matrix:
  """R-MAT as `rmat` (same distribution, another random stream), for graphs of 10^8 edges.

  Edges are drawn in chunks of 2^22 on a thread pool (numpy releases the GIL) with int32
  indices and float32 uniforms; duplicates are removed by a sort bucketed on the row's high
  bits. Returns a CSR matrix with sorted int32 indices, no duplicates and ones as values. The
  result depends on (scale, edges_per_node, seed) only, not on the number of threads.
  Host memory: ~24 bytes per edge at the peak (rmat23-d16, 134M edges: ~3.5 GB); time on 2
  cores: 16 s for rmat23-d16 (131M nonzeros), 0.9 s for rmat20-d16.
  """
  import concurrent.futures
  import functools

  if not 1 <= scale <= 30:
    raise ValueError(f"scale must be in 1..30; got {scale}")
  n = 1 << scale
  e = n * edges_per_node
  chunks = -(-e // _RMAT_CHUNK)
  seeds = np.random.SeedSequence(seed).spawn(chunks + 1)
  perm = np.random.default_rng(seeds[0]).permutation(n).astype(np.int32)
  ab, abc = np.float32(a + b), np.float32(a + b + c)
  fa = np.float32(a)
  shift = 2 * scale - min(2 * scale, 8)  # 256 buckets (fewer for tiny graphs) by key high bits
  nb = 1 << (2 * scale - shift)

  def draw(i):
    rng = np.random.default_rng(seeds[i + 1])
    size = min(_RMAT_CHUNK, e - i * _RMAT_CHUNK)
    rows = np.zeros(size, np.int32)
    cols = np.zeros(size, np.int32)
    for _ in range(scale):
      u = rng.random(size, dtype=np.float32)
      down = u >= ab
      right = ((u >= fa) & ~down) | (u >= abc)
      rows <<= 1
      rows |= down
      cols <<= 1
      cols |= right
    key = perm[rows].astype(np.int64) << scale
    key |= perm[cols]
    key.sort()
    return key, np.searchsorted(key, np.arange(nb + 1, dtype=np.int64) << shift)

  def merge(drawn, j):
    part = np.concatenate([k[s[j] : s[j + 1]] for k, s in drawn])
    part.sort()
    keep = np.ones(part.size, bool)
    np.not_equal(part[1:], part[:-1], out=keep[1:])
    return part[keep]

  workers = threads or min(32, os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    drawn = list(pool.map(draw, range(chunks)))
    keys = np.concatenate(list(pool.map(functools.partial(merge, drawn), range(nb))))
    del drawn
  nnz = keys.size
  idx = np.int32 if nnz < 2**31 else np.int64
  cols = (keys & (n - 1)).astype(idx)
  counts = np.bincount((keys >> scale).astype(np.int32), minlength=n)
  del keys
  indptr = np.zeros(n + 1, idx)
  np.cumsum(counts, out=indptr[1:])
  return sp.csr_matrix((np.ones(nnz, np.float32), cols, indptr), shape=(n, n))


def communities(scale: int, size: int, degree: int, out_degree: int = 1, seed: int = 0):
  """A graph of dense communities, the block-dense case of the tensor-core kernels: 2**scale
  nodes in communities of `size` consecutive ids, each node joined to `degree` members of its
  own community drawn at random (self loops dropped) and to `out_degree` nodes anywhere,
  symmetrized, duplicates removed, then node ids randomly permuted (so only a reordering finds
  the blocks again). Values uniform in [0.5, 1.5). Deterministic for (scale, size, degree,
  out_degree, seed)."""
  if not 1 <= scale <= 26 or size < 2 or (1 << scale) % size:
    raise ValueError(f"communities: need 2**scale nodes divisible by size; got {scale}, {size}")
  rng = np.random.default_rng(seed)
  n = 1 << scale
  src = np.repeat(np.arange(n, dtype=np.int64), degree)
  dst = (src // size) * size + rng.integers(0, size, src.size)
  far_src = np.repeat(np.arange(n, dtype=np.int64), out_degree)
  far_dst = rng.integers(0, n, far_src.size)
  r = np.concatenate([src, dst, far_src, far_dst])
  c = np.concatenate([dst, src, far_dst, far_src])
  keep = r != c
  perm = rng.permutation(n)
  m = sp.coo_matrix(
    (np.ones(int(keep.sum()), np.float32), (perm[r[keep]], perm[c[keep]])), shape=(n, n)
  ).tocsr()
  m.sum_duplicates()
  m.sort_indices()
  m.data = rng.uniform(0.5, 1.5, m.nnz).astype(np.float32)
  return m


_COMMUNITIES = re.compile(r"comm(\d+)-c(\d+)-d(\d+)")
SYNTHETIC = ("rmat17-d16", "rmat20-d8")  # the generated graphs of the default suite
# Dense-community stand-ins of the default suite (standins.py; quick: the first): imdb-binary's
# block statistics at 10x its size, and the large graph's at a third of its 24.6M edges
# (dense24.6M-large by name: minutes to generate).
DENSE_STANDINS = ("dense2M-imdb", "dense8M-large")


def graph_kind(name: str) -> str:
  """ "rmat", "communities" or "dense" (standins.dense_communities) for a generated graph's
  name, "real" for any other."""
  if name.startswith("rmat"):
    return "rmat"
  if standins.parse_dense_name(name) is not None:
    return "dense"
  return "communities" if _COMMUNITIES.fullmatch(name) else "real"


def is_synthetic(name: str) -> bool:
  """Whether `name` is a generated graph (R-MAT, communities, dense stand-in), not one of
  ../shared/data."""
  return graph_kind(name) != "real"


def synthetic_graph(name: str):
  """A generated graph by name: rmat{scale}-d{edges per node} (`rmat`; the suite's rmat17-d16
  and rmat20-d8 are BASELINES.md's), comm{scale}-c{size}-d{degree} (`communities`) or
  dense{edges}{k|M}-{preset}[-rand] (standins.dense_communities, fitted to the dense-community
  graphs' block statistics: dense193k-imdb, dense24.6M-large); None for any other name."""
  hit = re.fullmatch(r"rmat(\d+)-d(\d+)", name)
  if hit:
    return rmat(*(int(x) for x in hit.groups()))
  dense = standins.dense_graph(name)
  if dense is not None:
    return dense
  hit = _COMMUNITIES.fullmatch(name)
  return communities(*(int(x) for x in hit.groups())) if hit else None


def package_graph(name: str) -> sp.csr_matrix:
  """A real graph: the package's Cora (CSR npz) or an edge list of ../shared/data (row/col npz,
  symmetrized: the GNN view of graphs stored "listed once"), with unit values."""
  for folder in (ROOT / "jaxsparse_tc" / "data", SHARED_DATA):
    path = folder / f"{name}.npz"
    if not path.exists():
      continue
    z = np.load(path)
    if "indptr" in z:
      return sp.csr_matrix(
        (np.ones(len(z["indices"]), np.float32), z["indices"], z["indptr"]),
        shape=tuple(int(s) for s in z["shape"]),
      )
    n = int(z["num_nodes"])
    g = sp.coo_matrix((np.ones(len(z["row"]), np.float32), (z["row"], z["col"])), shape=(n, n))
    g = (g + g.T).tocsr()
    g.data[:] = 1.0
    g.sort_indices()
    return g
  raise FileNotFoundError(f"no graph {name!r} in jaxsparse_tc/data or {SHARED_DATA}")


def real_graph_names() -> list[str]:
  names = {p.stem for p in SHARED_DATA.glob("*.npz")} if SHARED_DATA.exists() else set()
  names |= {p.stem for p in (ROOT / "jaxsparse_tc" / "data").glob("*.npz")}
  return sorted(names)


def benchmark_graphs(quick: bool = False, names=None) -> dict[str, sp.csr_matrix]:
  """Real graphs plus the two R-MAT graphs of BASELINES.md and the dense-community stand-ins
  (`names`: those only, any name `load_graph` knows), all made or loaded by this call: ask for
  one name at a time where memory matters."""
  default = [
    *real_graph_names(),
    *SYNTHETIC[: 1 if quick else 2],
    *DENSE_STANDINS[: 1 if quick else 2],
  ]
  names = default if names is None else list(names)
  return {nm: load_graph(nm) for nm in names}


def load_graph(name: str) -> sp.csr_matrix:
  """A graph by name: a generated one (`synthetic_graph`) or a real one (`package_graph`)."""
  g = synthetic_graph(name)
  return package_graph(name) if g is None else g


def torch_csr(csr, dtype=None):
  """A scipy CSR matrix as a torch CSR tensor on the GPU (cuSPARSE's operand), in `dtype`
  (a torch dtype; default: the data's)."""
  import torch

  t = torch.sparse_csr_tensor(
    torch.as_tensor(csr.indptr.astype(np.int64)),
    torch.as_tensor(csr.indices.astype(np.int64)),
    torch.as_tensor(csr.data),
    size=csr.shape,
  ).cuda()
  return t if dtype is None else t.to(dtype)


def time_fn(fn, *args, warmup: int = 5, repeat: int = 50) -> float:
  """Median milliseconds of fn(*args) after warm-up, synchronised with block_until_ready."""
  import jax

  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times) * 1e3)


def time_torch(fn, warmup: int = 5, repeat: int = 50) -> float:
  """Median milliseconds of a torch CUDA callable, timed with CUDA events."""
  import torch

  for _ in range(warmup):
    fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(repeat):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end))
  return float(np.median(times))


_HEAD = {}


def _device_head(seconds: float = 2e-3):
  """A jitted matmul loop of at least `seconds` (2 ms or more) and its argument, calibrated once
  per process: queued before a program, it keeps the GPU busy until the host has queued the
  whole program."""
  import jax
  import jax.numpy as jnp

  if not _HEAD:
    a = jnp.full((4096, 4096), 1.0 / 4096, jnp.float32)  # a @ a == a: values stay put
    one = jax.jit(lambda a: a @ a)
    _HEAD.update(arg=a, step=time_fn(one, a, warmup=2, repeat=5) * 1e-3)
  n = max(1, int(np.ceil(max(seconds, 2e-3) / max(_HEAD["step"], 1e-6))))
  n = 1 << (n - 1).bit_length()  # few distinct loops to compile
  if n not in _HEAD:
    _HEAD[n] = jax.jit(lambda a: jax.lax.fori_loop(0, n, lambda i, b: b @ a, a))
  return _HEAD[n], _HEAD["arg"]


def time_jax_device(prog, args, k: int, repeat: int | None = None) -> tuple[float, float]:
  """(device, wall) microseconds per call of a program making k calls.

  wall: the program's median wall time / k, which on a small graph is the host's pace (a
  jitted call costs tens of us to dispatch, each FFI call more to enqueue). device: the program
  queued behind a 2-20 ms matmul, so the GPU reaches it only after the host has queued all of it:
  T(matmul + program) - T(matmul) over k, the GPU's own time, as CUDA events around a CUDA graph
  replay measure the torch peers. The difference is taken per repeat, between adjacent runs
  (their median), so that drift in the matmul's time (clocks) cancels; a program under 5 ms of
  wall time gets 31 repeats rather than 15 (on Cora one call is ~1/10 of the head's time, and
  independent medians of the two moved a 10-20 us call by several us between runs)."""
  import jax

  jax.block_until_ready(prog(*args))  # compiles
  t0 = time.perf_counter()
  jax.block_until_ready(prog(*args))
  # The head must outlast the host's queueing of the program: a small graph's program of many
  # calls can take longer to queue than 2 ms (Cora's attention fwd+bwd chain: its "device" time
  # came out above its wall time). Queueing is at most the program's wall time; 20 ms caps it.
  first = time.perf_counter() - t0
  head, a = _device_head(min(3.0 * first, 20e-3))
  jax.block_until_ready(head(a))
  if repeat is None:
    repeat = 31 if first < 5e-3 else 15
  wall, extra = [], []
  for _ in range(repeat):
    t0 = time.perf_counter()
    jax.block_until_ready(prog(*args))
    wall.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    jax.block_until_ready(head(a))
    alone = time.perf_counter() - t0
    t0 = time.perf_counter()
    h = head(a)
    jax.block_until_ready(prog(*args))
    extra.append(time.perf_counter() - t0 - alone)
    jax.block_until_ready(h)
  device = np.median(extra) / k * 1e6
  return float(device), float(np.median(wall) / k * 1e6)


_COPY = {}


def copy_bandwidth(measure: bool = True) -> float | None:
  """The device's copy bandwidth, bytes per second read + written, of x + 1 over 512 MiB of
  float32 (32 MiB on the CPU backend), measured once per process: device time on a GPU
  (time_jax_device), wall time on the CPU. measure=False: None unless already measured."""
  if "bw" not in _COPY:
    if not measure:
      return None
    import jax
    import jax.numpy as jnp

    cpu = jax.default_backend() == "cpu"
    n = (8 if cpu else 128) << 20  # float32 elements
    x = jnp.ones((n,), jnp.float32)
    prog = jax.jit(lambda x: x + 1.0)
    us = time_fn(prog, x, warmup=1, repeat=5) * 1e3 if cpu else time_jax_device(prog, (x,), 1)[0]
    _COPY["bw"] = 2 * 4 * n / (us * 1e-6)
    del x
  return _COPY["bw"]


def min_bytes(csr, d: int, itemsize: int, op: str = "spmm") -> int:
  """The bytes floor of one call: A's column indices (4 B), row pointers (4 B) and values once;
  SpMM: each touched row of X once and the output once; SDDMM: each touched row of both
  operands once."""
  m = csr.shape[0]
  structure = csr.nnz * (4 + itemsize) + (m + 1) * 4
  touched_cols = int(np.count_nonzero(np.bincount(csr.indices, minlength=csr.shape[1])))
  if op == "spmm":
    return structure + (touched_cols + m) * d * itemsize
  touched_rows = int(np.count_nonzero(np.diff(csr.indptr)))
  return structure + (touched_rows + touched_cols) * d * itemsize


def time_cupy(call, warmup: int = 3, repeat: int = 20) -> float:
  """Microseconds per call of `call(i)` (i: the call's index), `repeat` launches back to back
  between two CUDA events on cupy's current stream, after `warmup` calls."""
  import cupy as cp

  for i in range(warmup):
    call(i)
  start, stop = cp.cuda.Event(), cp.cuda.Event()
  start.record()
  for i in range(repeat):
    call(warmup + i)
  stop.record()
  stop.synchronize()
  return cp.cuda.get_elapsed_time(start, stop) * 1e3 / repeat


def device_name() -> str:
  import jax

  d = jax.devices()[0]
  return getattr(d, "device_kind", str(d))


def geomean(xs) -> float:
  xs = [x for x in xs if x and np.isfinite(x)]
  return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def speedup_row(label_col: str, label: str, graphs, ours_time, peer_time, **extra) -> dict:
  """{label_col: label, geomean, extra..., graph: peer / ours time, ...} of a comparison;
  ours_time / peer_time map a graph name to a time or None (then the graph has no ratio)."""
  ratios = {}
  for g in graphs:
    a, b = ours_time(g), peer_time(g)
    if a and b:
      ratios[g] = b / a
  row = {label_col: label, "geomean": geomean(ratios.values()), **extra}
  row.update({g: ratios.get(g) for g in graphs})
  return row


def main(module) -> None:
  """A benchmark module run as a script: its rows, then its summary (if it has one)."""
  import sys

  rows = module.run(quick="--quick" in sys.argv)
  name = module.__name__ if module.__name__ != "__main__" else Path(sys.argv[0]).stem
  print_table(rows, module.COLUMNS, name)
  if hasattr(module, "summary"):
    s = module.summary(rows)
    print_table(s, list(s[0].keys()), "summary")


def print_table(rows: list[dict], columns: list[str], title: str = "") -> None:
  if title:
    print(f"\n## {title}")
  widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) if rows else len(c) for c in columns]
  print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |")
  print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
  for r in rows:
    print("| " + " | ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)) + " |")


def _fmt(v) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
  return str(v)


def write_json(rows: list[dict], name: str) -> Path:
  out = Path(os.environ.get("OUT", ROOT / "out"))
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"{name}.json"
  path.write_text(json.dumps({"device": device_name(), "rows": rows}, indent=1))
  return path
