"""Where a sharded step's GPU time goes: bench_distributed's SpMM and GCN training step on an
R-MAT graph, one device and sharded, under torch.profiler (its CUPTI trace records every kernel,
memset and copy of the process, XLA's and NCCL's included). Prints per device and step: the span
from its first activity to its last, the time inside activities, and the largest activities.

Usage: python3 -m scripts.profile_distributed [--scale 22] [--devices 2] [--overlap] [--no-plain]
"""

from __future__ import annotations

import argparse
import collections
import re

import jax

from benchmarks import bench_distributed as bd
from scripts.trace_chain import trace


def _short(name: str) -> str:
  name = re.sub(r"<.*", "", name)
  name = re.sub(r"\(.*", "", name)
  return name[:60]


def report(label: str, events: list[dict], runs: int, top: int) -> None:
  by_dev = collections.defaultdict(list)
  for e in events:
    by_dev[e.get("args", {}).get("device", 0)].append(e)
  for dev, evs in sorted(by_dev.items()):
    t0 = min(e["ts"] for e in evs)
    t1 = max(e["ts"] + e["dur"] for e in evs)
    busy = sum(e["dur"] for e in evs)
    print(
      f"{label} device {dev}: span {(t1 - t0) / runs / 1e3:.2f} ms/step, "
      f"activities {busy / runs / 1e3:.2f} ms/step"
    )
    agg = collections.Counter()
    cnt = collections.Counter()
    for e in evs:
      agg[_short(e["name"])] += e["dur"]
      cnt[_short(e["name"])] += 1
    for name, us in agg.most_common(top):
      print(f"    {us / runs / 1e3:7.3f} ms  x{cnt[name] // runs:<3d} {name}")


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--scale", type=int, default=22)
  p.add_argument("--devices", type=int, default=2)
  p.add_argument("--overlap", action="store_true")
  p.add_argument("--top", type=int, default=12)
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--no-plain", action="store_true", help="skip the one-device run")
  a = p.parse_args()
  g = bd.gcn_normalized(bd.rmat_graph(a.scale, 16))
  modes = [("sharded", a.devices)] if a.no_plain else [("plain", 1), ("sharded", a.devices)]
  for mode, ndev in modes:
    A, _ = bd._matrices(g, mode, ndev, "auto", a.overlap and mode != "plain")
    for op in ("spmm", "gcn"):
      if op == "spmm":
        fn, args = bd.spmm_program(A, 128, jax.numpy.float32)
      else:
        fn, args = bd.gcn_program(A, 128, 128, 16)
      report(f"{mode}{ndev} {op}", trace(jax.jit(fn), args, a.runs), a.runs, a.top)
    del A


if __name__ == "__main__":
  main()
