"""Meshes for sharded matrices, and the check that refuses host (CPU) meshes XLA's CPU client can
deadlock on."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh

DEFAULT_AXIS = "shards"


def make_mesh(devices=None, axis_name: str = DEFAULT_AXIS) -> Mesh:
  """A 1-D mesh over `devices`: None (all of jax.devices()), a count N (the first N) or a list."""
  if devices is None:
    devs = jax.devices()
  elif isinstance(devices, (int, np.integer)):
    all_devs = jax.devices()
    if not 1 <= int(devices) <= len(all_devs):
      raise ValueError(
        f"asked for {devices} devices; {len(all_devs)} are visible "
        f"({all_devs[0].platform}); on CPU, force more with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N before jax starts"
      )
    devs = all_devs[: int(devices)]
  else:
    devs = list(devices)
  mesh = Mesh(np.array(devs), (axis_name,))
  check_host_mesh(mesh, "make_mesh")
  return mesh


# XLA's CPU client runs every device's part of a multi-device step as a task on one pool of T
# threads, T = max(PJRT_NPROC, else NPROC, else the schedulable CPUs; the CPU device count), sized
# when JAX starts its CPU backend. A step's collectives wait until the tasks of all N devices run
# at once. The task that dispatches a step onto a device first waits, on a pool thread, while 32
# steps are in flight on that device; so a loop that runs more than 32 steps ahead (nothing
# blocks on its results) holds up to N pool threads in that wait, and with T < 2 N the oldest
# step never gets its N threads: its collective waits for ever, and XLA aborts the process after
# 40 s ("Termination timeout for all gather ... only K of them arrived", K = T - blocked). This is
# XLA's, not the kernels': a plain JAX loop (shard_map + all_gather) hangs the same way, and with
# 2 N threads both run through. So host meshes are refused where T < 2 N.
_CPU_INFLIGHT_STEPS = 32  # XLA's max_inflight_computations_per_device


def cpu_client_threads(cpu_devices: int) -> tuple[int, str]:
  """XLA's CPU client pool size T (above), as XLA computes it, and where it comes from. The
  variables are XLA's own configuration, read here only to predict its pool (no public API
  reports it); nothing in the library changes with them but whether this check refuses."""
  for var in ("PJRT_NPROC", "NPROC"):
    value = os.environ.get(var)
    if value is None:
      continue
    try:
      threads = max(int(value), 0)
    except ValueError:
      continue
    return max(threads, cpu_devices), f"{var}={value}, {cpu_devices} CPU devices"
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  return max(cpus, cpu_devices), f"{cpus} schedulable CPUs, {cpu_devices} CPU devices"


def check_host_mesh(mesh: Mesh, op: str = "distributed") -> None:
  """Raises ValueError where a mesh of host (CPU) devices can deadlock XLA's CPU client: N >= 2
  devices of this process need a client pool of 2 N threads (the comment above says why)."""
  here = jax.process_index()
  n = sum(d.platform == "cpu" and d.process_index == here for d in np.asarray(mesh.devices).flat)
  if n < 2:
    return
  threads, source = cpu_client_threads(len(jax.local_devices(backend="cpu")))
  if threads >= 2 * n:
    return
  fewer = f", or shard over at most {threads // 2} devices" if threads >= 4 else ""
  raise ValueError(
    f"{op}: a mesh of {n} host (CPU) devices needs XLA's CPU client to run on at least {2 * n} "
    f"threads; it has {threads} (the larger of {source}). Each device's part of a step takes "
    f"one of those threads, a step's collectives wait until all {n} run, and a step dispatched "
    f"while {_CPU_INFLIGHT_STEPS} are in flight on a device holds one more thread waiting: with "
    f"fewer than 2 x {n} threads a loop that runs more than {_CPU_INFLIGHT_STEPS} steps ahead "
    "of the devices deadlocks (XLA aborts after 40 s: 'Termination timeout for all gather'). "
    f"Start the process with PJRT_NPROC={2 * n} in its environment (XLA reads it when JAX "
    f"starts its CPU backend){fewer}"
  )
