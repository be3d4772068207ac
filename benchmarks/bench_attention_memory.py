"""Out-of-memory frontier of sparse attention: the largest heads and graph each method handles.

float16, d = 64, forward and forward+backward (as bench_attention), for each method: `fused`
(jaxsparse_tc.sparse_attention), `lib` (the library's unfused sddmm -> edge_softmax -> spmm) and
`xla` (hand-written XLA unfused, CSR-sorted segment ops; bench_attention.methods):
(a) `heads`: H in {1, 2, 4, 8, 16, 32, 64} on rmat20-d16 (2^20 nodes, 16 edges per node);
(b) `size`: R-MAT scale 20, 21, 22, 23 (16 edges per node; rmat23-d16 has ~131M nonzeros) at
    H = 8; its scale-20 point is sweep (a)'s H = 8 point (run once).
Graphs come from common.rmat_csr (common.rmat's distribution, generated in parallel chunks).

Every point: compile (shapes only), record the memory_analysis footprint (temp + arguments +
outputs, MB; recorded even where the method is not run: a prediction), then run ONE call:
`ok` with its time (`ms`, first call after compilation), or `OOM` (RESOURCE_EXHAUSTED / out of
memory). A method that OOMs (or fails) is not run at larger points of that sweep
(`OOM (skipped)`); one whose call took > 20 s is not run at larger points (`skipped (slow)`);
points past the time budget are `skipped (time)`. Only the arrays of the method being run are
on the device: q, k, v, then w for fwd+bwd, and either A (fused, lib) or the edge list (xla).

The sweep runs in a child process (`python bench_attention_memory.py --worker FILE`) with
XLA_PYTHON_CLIENT_PREALLOCATE=false and XLA_PYTHON_CLIENT_MEM_FRACTION=0.95, so the limit is the
GPU's memory rather than the share a benchmark process preallocated, and the memory it grows
into goes back to the device when it exits (later benchmarks, PyG, get it back). `limit_MB`
(the child's allocator limit) and `gpu_used_at_start_MB` (nvidia-smi, once the child is up:
its CUDA context plus what other processes, e.g. the parent benchmark process, hold) go with
every row. The six programs of a point compile concurrently.
quick: rmat12-d16 with H in {1, 2}; scales 12 and 13 at H = 2.
Usage: python3 -m benchmarks.bench_attention_memory [--quick]
"""

from __future__ import annotations

import concurrent.futures
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

COLUMNS = [
  "sweep",
  "graph",
  "nodes",
  "nnz",
  "H",
  "mode",
  "method",
  "temp_MB",
  "footprint_MB",
  "status",
  "ms",
]

D = 64
EDGES_PER_NODE = 16
METHODS = ("fused", "lib", "xla")
MODES = ("fwd", "fwd+bwd")
GROUPS = (("edges", ("xla",)), ("A", ("fused", "lib")))  # run order, by graph operand
SLOW_S = 20.0  # a call slower than this is not repeated at a larger point
FULL = dict(
  fixed_scale=20,
  heads=(1, 2, 4, 8, 16, 32, 64),
  scales=(20, 21, 22, 23),
  size_h=8,
  budget_s=330.0,
  timeout_s=570.0,
)
QUICK = dict(
  fixed_scale=12, heads=(1, 2), scales=(12, 13), size_h=2, budget_s=240.0, timeout_s=420.0
)
_MB = 2.0**20


def _graph_name(scale):
  return f"rmat{scale}-d{EDGES_PER_NODE}"


# -- parent ------------------------------------------------------------------------------------
def run(quick: bool = False) -> list[dict]:
  """Runs the sweep in a child process and returns its rows (partial ones if it died)."""
  cfg = QUICK if quick else FULL
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
  env["PYTHONUNBUFFERED"] = "1"
  with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "rows.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path)]
    cmd += ["--quick"] if quick else []
    try:
      rc = subprocess.run(cmd, env=env, timeout=cfg["timeout_s"]).returncode
    except subprocess.TimeoutExpired:  # run() kills the child; keep what it wrote
      print(f"  attention memory sweep: child killed after {cfg['timeout_s']:.0f} s", flush=True)
      rc = "timeout"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
  if rc != 0:
    print(f"  attention memory sweep: child exited with {rc}; {len(rows)} rows kept", flush=True)
    if not rows:
      raise RuntimeError(f"attention memory sweep failed (child exit {rc}, no rows)")
  return sorted(
    rows,
    key=lambda r: (
      r["sweep"] != "heads",
      r["nodes"],
      r["H"],
      MODES.index(r["mode"]),
      METHODS.index(r["method"]),
    ),
  )


def _why(row):
  fp = row.get("footprint_MB")
  return row.get("status") + (f", footprint {fp / 1024:.1f} GB" if fp else "")


def summary(rows):
  """Per method and mode: the largest H (fixed graph) and largest graph (at size_H) that ran."""
  out = []
  limit = next((r["limit_MB"] for r in rows if r.get("limit_MB")), None)
  used = next(
    (r["gpu_used_at_start_MB"] for r in rows if r.get("gpu_used_at_start_MB") is not None), None
  )
  for method in METHODS:
    for mode in MODES:
      rec = {"method": method, "mode": mode}
      for sweep, key in (("heads", "H"), ("size", "nodes")):
        sel = sorted(
          (r for r in rows if r["sweep"] == sweep and r["method"] == method and r["mode"] == mode),
          key=lambda r: r[key],
        )
        ok = [i for i, r in enumerate(sel) if r.get("status") == "ok"]
        if ok:  # the point after the largest that ran: why it did not
          nxt = sel[ok[-1] + 1] if ok[-1] + 1 < len(sel) else None
        else:
          nxt = sel[0] if sel else None
        if sweep == "heads":
          rec["heads_graph"] = sel[0]["graph"] if sel else None
          rec["max_H_ok"] = sel[ok[-1]]["H"] if ok else "none"
          rec["next_H"] = f"{nxt['H']}: {_why(nxt)}" if nxt else "-"
        else:
          rec["size_H"] = sel[0]["H"] if sel else None
          best = sel[ok[-1]] if ok else None
          rec["max_graph_ok"] = (
            f"{best['graph']} ({best['nnz'] / 1e6:.1f}M nnz)" if best else "none"
          )
          rec["next_graph"] = f"{nxt['graph']}: {_why(nxt)}" if nxt else "-"
      rec["limit_GB"] = round(limit / 1024, 1) if limit else None
      rec["gpu_used_at_start_GB"] = round(used / 1024, 1) if used is not None else None
      out.append(rec)
  return out


# -- child -------------------------------------------------------------------------------------
def _gpu_used_mb():
  try:
    r = subprocess.run(
      ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
      capture_output=True,
      text=True,
      timeout=20,
    )
    return float(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else None
  except Exception:  # noqa: BLE001 - no nvidia-smi (CPU)
    return None


def _build(scale):
  """The graph of one scale: A on the host CPU device (moved per use) and CSR edges (numpy)."""
  import jax

  import jaxsparse_tc as jst
  from benchmarks import bench_attention as ba

  t0 = time.perf_counter()
  g = common.rmat_csr(scale, EDGES_PER_NODE)
  t1 = time.perf_counter()
  rows, cols = ba.csr_edges(g)
  del g
  try:  # A waits on the host; each group of runs puts it on the device (see _point)
    host = jax.devices("cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu
    host = jax.devices()[0]
  with jax.default_device(host):
    A = jst.SparseMatrix.from_coo(rows, cols, shape=(1 << scale, 1 << scale))
  A = jax.device_put(A, host)  # (a no-op where from_coo already followed default_device)
  assert A.nnz == rows.size
  t2 = time.perf_counter()
  print(
    f"  {_graph_name(scale)}: {A.nnz} nnz, generated in {t1 - t0:.1f} s, SparseMatrix in "
    f"{t2 - t1:.1f} s",
    flush=True,
  )
  return dict(
    name=_graph_name(scale), n=1 << scale, nnz=int(A.nnz), A=A, edges=(rows, cols), build_s=t2 - t0
  )


def _abstract(tree):
  import jax

  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _point(ctx, H, sweep, state, deadline, emit, pool):
  """Runs every method and mode at one (graph, H); emits each row when done, returns them."""
  import jax
  import jax.numpy as jnp

  from benchmarks import bench_attention as ba

  dev = jax.devices()[0]
  shape = (H, ctx["n"], D)
  fns = ba.methods(1.0 / math.sqrt(D))
  dense = jax.ShapeDtypeStruct(shape, jnp.float16)
  jobs = {}
  for graph_key, keys in GROUPS:
    for mode in MODES:
      for key in keys:
        fn = fns[key] if mode == "fwd" else ba.with_grad(fns[key])
        nargs = 3 if mode == "fwd" else 4
        jobs[(key, mode)] = (fn, (_abstract(ctx[graph_key]),) + (dense,) * nargs)
  # shapes only (nothing allocated): the footprint is known even where the call is not run
  compiled = ba._compile_all(jobs, pool) if time.perf_counter() < deadline else {}
  inputs = {}  # q, k, v, w: made on the device when first needed
  on_device = {}  # the graph operand of the group being run
  rows = []

  def one(row, graph_key, key, mode):
    st = state[(key, mode)]
    exe = compiled.pop((key, mode), None)
    if isinstance(exe, Exception):
      print(f"    compile failed: {str(exe).splitlines()[0][:120]}", flush=True)
      row["status"] = "fail (compile)"
      st["stop"] = "fail"
      return
    if exe is not None:
      row["temp_MB"], row["footprint_MB"] = ba.memory_mb(exe)
    if exe is None or time.perf_counter() > deadline:
      row["status"] = "skipped (time)"
      return
    if st["stop"] in ("OOM", "fail"):
      row["status"] = f"{st['stop']} (skipped)"
      return
    if st["stop"] == "slow":
      row["status"] = "skipped (slow)"
      return
    try:
      if graph_key not in on_device:
        on_device[graph_key] = jax.device_put(ctx[graph_key], dev)
      args = [on_device[graph_key]]
      for c in "qkvw"[: len(jobs[(key, mode)][1]) - 1]:
        if c not in inputs:
          inputs[c] = jax.block_until_ready(ba.normal_f16("qkvw".index(c), shape))
        args.append(inputs[c])
      t0 = time.perf_counter()
      jax.block_until_ready(exe(*args))
      dt = time.perf_counter() - t0
      row["status"], row["ms"] = "ok", dt * 1e3
      if dt > SLOW_S:
        st["stop"] = "slow"
    except Exception as e:  # noqa: BLE001
      row["status"] = st["stop"] = "OOM" if ba.is_oom(e) else "fail"
      print(f"    {str(e).splitlines()[0][:120]}", flush=True)

  # xla with only its edge list on the device, then fused and lib with only A
  for graph_key, keys in GROUPS:
    for mode in MODES:
      for key in keys:
        row = dict(
          sweep=sweep,
          graph=ctx["name"],
          nodes=ctx["n"],
          nnz=ctx["nnz"],
          H=H,
          mode=mode,
          method=key,
          limit_MB=state["limit_MB"],
          gpu_used_at_start_MB=state["gpu_used_MB"],
        )
        one(row, graph_key, key, mode)
        ms = "" if row.get("ms") is None else f" {row['ms']:.1f} ms"
        print(
          f"  {sweep} {ctx['name']} H={H} {mode} {key}: {row['status']}, footprint "
          f"{row.get('footprint_MB') or 0:.0f} MB{ms}",
          flush=True,
        )
        emit(row)
        rows.append(row)
        gc.collect()
      if mode == "fwd+bwd":
        inputs.pop("w", None)  # w only lives during fwd+bwd
    on_device.clear()
    gc.collect()
  inputs.clear()
  compiled.clear()
  gc.collect()
  return rows


def _worker(path: str, quick: bool) -> None:
  import jax

  cfg = QUICK if quick else FULL
  assert cfg["scales"][0] == cfg["fixed_scale"] and cfg["size_h"] in cfg["heads"]
  deadline = time.perf_counter() + cfg["budget_s"]
  stats = jax.devices()[0].memory_stats() or {}
  state_init = dict(
    limit_MB=stats["bytes_limit"] / _MB if stats.get("bytes_limit") else None,
    gpu_used_MB=_gpu_used_mb(),
  )
  print(
    f"  device {common.device_name()}, allocator limit {state_init['limit_MB']} MB, "
    f"GPU memory in use at start {state_init['gpu_used_MB']} MB",
    flush=True,
  )
  pool = concurrent.futures.ThreadPoolExecutor(len(METHODS) * len(MODES))
  with open(path, "w") as f, pool:

    def emit(row):
      f.write(json.dumps(row) + "\n")
      f.flush()

    def fresh():
      st = dict(state_init)
      st.update({(m, mode): {"stop": None} for m in METHODS for mode in MODES})
      return st

    heads_state = fresh()
    ctx = _build(cfg["fixed_scale"])
    shared = []
    for H in cfg["heads"]:
      rows = _point(ctx, H, "heads", heads_state, deadline, emit, pool)
      if H == cfg["size_h"]:
        shared = rows
    ctx_build_s = ctx["build_s"]
    del ctx
    gc.collect()
    # (b) the fixed graph at size_h is this sweep's first point: take its rows and stop states
    size_state = fresh()
    for r in shared:
      emit(dict(r, sweep="size"))
      s = r.get("status", "")
      stop = (
        "OOM"
        if s.startswith("OOM")
        else "fail"
        if s.startswith("fail")
        else "slow"
        if s == "skipped (slow)" or (r.get("ms") or 0) > SLOW_S * 1e3
        else None
      )
      size_state[(r["method"], r["mode"])]["stop"] = stop
    build_s = ctx_build_s
    for scale in cfg["scales"][1:]:
      build_s *= 2  # twice the edges of the previous scale
      if time.perf_counter() + build_s + 30.0 > deadline:  # no time to build and run it
        for mode in MODES:
          for m in METHODS:
            emit(
              dict(
                sweep="size",
                graph=_graph_name(scale),
                nodes=1 << scale,
                nnz=None,
                H=cfg["size_h"],
                mode=mode,
                method=m,
                status="skipped (time)",
              )
            )
        continue
      ctx = _build(scale)
      build_s = ctx["build_s"]
      _point(ctx, cfg["size_h"], "size", size_state, deadline, emit, pool)
      del ctx
      gc.collect()


def main() -> int:
  if "--worker" in sys.argv:
    _worker(sys.argv[sys.argv.index("--worker") + 1], "--quick" in sys.argv)
    return 0
  rows = run(quick="--quick" in sys.argv)
  common.print_table(rows, COLUMNS, "bench_attention_memory")
  s = summary(rows)
  if s:
    common.print_table(s, list(s[0].keys()), "summary")
  return 0


if __name__ == "__main__":
  sys.exit(main())
