"""Shared fixtures: fresh random generators (seed reported on failure) and real graphs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from jaxsparse_tc.testing import random_coo, rel_err, window_blocks_coo  # noqa: F401 (tests import them from here)

ROOT = Path(__file__).resolve().parent.parent


def use_host_devices(count: int) -> None:
  """Sets up this process, before jax starts its backends, for `count` host (CPU) devices (the
  multi-device child processes, started with host_devices_env)."""
  import jax

  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", count)


def host_devices_env(count: int) -> dict:
  """The environment to start a child process of `count` host devices in. XLA's CPU client needs
  2 threads per device of a mesh (distributed.check_host_mesh) and sizes its pool when the
  process starts, from PJRT_NPROC, else from the CPUs, which may be fewer: XLA has no other
  setting for it, so the parent gives the child that variable at launch (nothing in a process
  changes its own environment)."""
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {**os.environ, "PJRT_NPROC": str(max(2 * count, cpus or 1))}


@pytest.fixture
def rng(request):
  """A fresh generator per test; its seed is shown when the test fails."""
  seed = int(np.random.SeedSequence().entropy % (2**32))
  request.node.user_properties.append(("seed", seed))
  request.node._jst_seed = seed
  return np.random.default_rng(seed)


def pytest_collection_finish(session):
  """Starts test_distributed.py's multi-device child process as soon as its tests are
  collected: it then runs beside the rest of the suite rather than after it."""
  for item in session.items:
    if "test_distributed.py::test_multi_device" in item.nodeid:
      item.module.start_child()
      return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  seed = getattr(item, "_jst_seed", None)
  if report.failed and seed is not None:
    report.sections.append(("random seed", f"rng seed = {seed}"))


@pytest.fixture
def x64():
  """Runs the test with jax_enable_x64: float64 finite differences for check_grads."""
  import jax

  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", False)


@pytest.fixture
def on_cpu():
  """Runs the test on the CPU kernels (the specification), also on a GPU machine."""
  import jax

  with jax.default_device(jax.devices("cpu")[0]):
    yield


def load_graph(name: str) -> sp.csr_matrix | None:
  """A real graph (npz with indptr/indices/shape) from the package or ../shared/data."""
  for folder in (ROOT / "jaxsparse_tc" / "data", ROOT.parent / "shared" / "data"):
    path = folder / f"{name}.npz"
    if path.exists():
      z = np.load(path)
      shape = tuple(int(s) for s in z["shape"])
      return sp.csr_matrix(
        (np.ones(len(z["indices"]), np.float32), z["indices"], z["indptr"]), shape=shape
      )
  return None


@pytest.fixture(scope="session")
def cora():
  g = load_graph("cora")
  if g is None:
    pytest.skip("cora.npz not found")
  return g
