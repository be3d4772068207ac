"""jax.export of programs that call the operators, run again in a fresh process; pickle and
flax.serialization of SparseMatrix.

The exported programs run on the default device (on a GPU machine: the CUDA kernels), and are
exported for CUDA too where the CUDA extension was built.
"""

from __future__ import annotations

import importlib.util
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo, rel_err

import jaxsparse_tc as jst
from jaxsparse_tc._src import extensions
from jaxsparse_tc._src.checks import OperandError
from jaxsparse_tc._src.integrity import PatternError
from jaxsparse_tc.nn import functional as F

# jax.export's serialization needs flatbuffers (the package's "test" extra installs it).
needs_flatbuffers = pytest.mark.skipif(
  importlib.util.find_spec("flatbuffers") is None,
  reason="jax.export serialization needs flatbuffers",
)
PLATFORMS = ("cpu", "cuda") if extensions.has_cuda() else ("cpu",)


def _export(fn, *args) -> jax.export.Exported:
  return jax.export.export(
    jax.jit(fn), platforms=PLATFORMS, disabled_checks=jst.export_disabled_checks()
  )(*args)


def _run_child(script: str, cwd, timeout: int) -> subprocess.CompletedProcess:
  """Runs `script` in a new Python process that imports the jaxsparse_tc this process imported
  (its folder first on sys.path: a checkout or an installed wheel) and does not preallocate the
  GPU the test process holds (XLA's allocator takes that setting only from its variable, set in
  the child before jax starts)."""
  prelude = (
    "import os, sys\n"
    "os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'\n"
    f"sys.path.insert(0, {str(Path(jst.__file__).resolve().parent.parent)!r})\n"
  )
  return subprocess.run(
    [sys.executable, "-c", prelude + script],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _run_fresh(tmp_path, cases: dict, import_library: bool = True) -> subprocess.CompletedProcess:
  """Deserializes each case's artifact, {name: (bytes, args)}, and calls it on args (unless
  None), in a new Python process that imports only jax, numpy and pickle (and jaxsparse_tc where
  asked); its results come back in results.pkl as numpy arrays."""
  with open(tmp_path / "cases.pkl", "wb") as f:
    pickle.dump(cases, f)
  script = textwrap.dedent(
    f"""
    import pickle, sys
    import jax, numpy as np
    from jax import export  # before jax 0.6 not an attribute until imported
    if {import_library}:
      import jaxsparse_tc
    assert ("jaxsparse_tc" in sys.modules) == {import_library}
    with open("cases.pkl", "rb") as f:
      cases = pickle.load(f)
    results = {{}}
    for name, (blob, args) in cases.items():
      exported = export.deserialize(bytearray(blob))
      if args is not None:
        results[name] = jax.tree.map(np.asarray, exported.call(*args))
    with open("results.pkl", "wb") as f:
      pickle.dump(results, f)
    """
  )
  return _run_child(script, tmp_path, timeout=600)


def _dense(rows, cols, vals, shape) -> np.ndarray:
  dense = np.zeros(shape)
  np.add.at(dense, (rows, cols), np.asarray(vals, np.float64))
  return dense


def _gcn(A, x, w1, b1, w2):
  h = jax.nn.relu(F.gcn_conv(A, x, w1, b1))
  return F.gcn_conv(A, h, w2)


def _gcn_loss(values, A, x, w1, b1, w2, target):
  out = _gcn(A.with_values(values), x, w1, b1, w2)
  return jnp.sum((out - target) ** 2)


def _attention_loss(A, q, k, v, bias, g):
  return jnp.sum(jst.sparse_attention(A, q, k, v, bias=bias) * g)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """GCN (forward, gradient), sparse attention (forward, gradient) and a vmapped SpMM, exported,
  serialized and run in a fresh process; with the in-process jitted results and float64 inputs."""
  rng = np.random.default_rng(int(np.random.SeedSequence().entropy % (2**32)))
  m, d, hidden, classes = 96, 12, 16, 5
  rows, cols, vals = random_coo(rng, m, m, 0.08)
  vals = np.abs(vals)  # a GCN-like positive normalised adjacency
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(m, m))
  f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  x, w1, b1, w2, target = f32(m, d), f32(d, hidden), f32(hidden), f32(hidden, classes), f32(m, 5)
  q, k, v, g = f32(m, 8), f32(m, 8), f32(m, 6), f32(m, 6)
  bias = f32(A.nnz)
  xs = f32(3, m, 7)

  cases = {
    "gcn": (_gcn, (A, x, w1, b1, w2)),
    "gcn_grad": (
      jax.grad(_gcn_loss, argnums=(0, 2, 3, 4, 5)),
      (A.values, A, x, w1, b1, w2, target),
    ),
    "attention": (lambda *a: jst.sparse_attention(*a[:4], bias=a[4]), (A, q, k, v, bias)),
    "attention_grad": (jax.grad(_attention_loss, argnums=(1, 2, 3, 4)), (A, q, k, v, bias, g)),
    "spmm_vmap": (jax.vmap(jst.spmm, in_axes=(None, 0)), (A, xs)),
  }
  artifacts = {name: _export(fn, *args) for name, (fn, args) in cases.items()}
  blobs = {name: (bytes(e.serialize()), cases[name][1]) for name, e in artifacts.items()}
  tmp = tmp_path_factory.mktemp("export")
  proc = _run_fresh(tmp, blobs)
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(tmp / "results.pkl", "rb") as f:
    fresh = pickle.load(f)
  local = {name: jax.tree.map(np.asarray, jax.jit(fn)(*args)) for name, (fn, args) in cases.items()}
  inputs = dict(rows=rows, cols=cols, vals=vals, m=m, x=x, w1=w1, b1=b1, w2=w2, xs=xs)
  inputs.update(q=q, k=k, v=v, bias=bias, A=A)
  return dict(artifacts=artifacts, fresh=fresh, local=local, inputs=inputs)


@needs_flatbuffers
@pytest.mark.parametrize("name", ["gcn", "gcn_grad", "attention", "attention_grad", "spmm_vmap"])
def test_fresh_process_matches_the_jitted_call(exported, name):
  """The deserialized artifact, run in a process that only imported jaxsparse_tc, gives the
  in-process jitted result (the same program: up to the kernels' summation order)."""
  fresh, local = exported["fresh"][name], exported["local"][name]
  assert jax.tree.structure(fresh) == jax.tree.structure(local)
  for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(local)):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.any(b != 0)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(b))))


@needs_flatbuffers
def test_exported_results_match_float64_references(exported):
  """The in-process results compared with above are right: GCN and the vmapped SpMM against
  dense float64 products, attention against a dense float64 masked softmax. On a GPU float32
  products default to TF32 (10-bit mantissa), XLA's dense ones included, hence its tolerance."""
  i, fresh = exported["inputs"], exported["fresh"]
  tol = 1e-5 if jax.default_backend() == "cpu" else 5e-3
  dense = _dense(i["rows"], i["cols"], i["vals"], (i["m"], i["m"]))
  f64 = lambda a: np.asarray(a, np.float64)
  h = np.maximum(dense @ (f64(i["x"]) @ f64(i["w1"])) + f64(i["b1"]), 0)
  assert rel_err(fresh["gcn"], dense @ (h @ f64(i["w2"]))) < tol
  assert rel_err(fresh["spmm_vmap"], dense @ f64(i["xs"])) < tol

  A = i["A"]
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  logits = np.full(A.shape, -np.inf)
  q, k, v = f64(i["q"]), f64(i["k"]), f64(i["v"])
  logits[r, c] = np.sum(q[r] * k[c], axis=1) / np.sqrt(q.shape[1]) + f64(i["bias"])
  has_entries = np.isfinite(logits).any(axis=1, keepdims=True)
  p = np.exp(logits - np.where(has_entries, logits.max(axis=1, keepdims=True), 0))
  p = p / np.where(has_entries, p.sum(axis=1, keepdims=True), 1)
  assert rel_err(fresh["attention"], p @ v) < tol


@needs_flatbuffers
def test_serialized_targets_carry_their_version(exported):
  """Every custom call of the artifacts is a versioned target of the op table; a changed
  binding gets a new version, so an old artifact finds no handler instead of a wrong one."""
  table = set(extensions.OPS.values())
  seen = set()
  for e in exported["artifacts"].values():
    assert e.platforms == PLATFORMS
    targets = set(re.findall(r"custom_call @(jaxsparse_tc\w*)", e.mlir_module()))
    assert targets, "no jaxsparse_tc custom call in the exported module"
    for t in targets:
      assert re.fullmatch(r"jaxsparse_tc_\w+_v[1-9][0-9]*", t) and t in table, t
    seen |= targets
  assert {extensions.target("spmm"), extensions.target("attention_fwd")} <= seen


def test_disabled_checks_name_every_target():
  checks = jst.export_disabled_checks()
  assert len(checks) == len(extensions.OPS)
  assert {str(c) for c in checks} == {
    str(jax.export.DisabledSafetyCheck.custom_call(t)) for t in extensions.OPS.values()
  }
  assert all(c.is_custom_call() for c in checks)


def test_export_without_the_disabled_checks_names_the_target(rng):
  rows, cols, vals = random_coo(rng, 20, 20, 0.2)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(20, 20))
  x = jnp.asarray(rng.standard_normal((20, 4)), jnp.float32)
  with pytest.raises(ValueError, match=extensions.target("spmm")):
    jax.export.export(jax.jit(jst.spmm))(A, x)


@needs_flatbuffers
def test_a_process_without_jaxsparse_tc_fails_naming_the_target(rng, tmp_path):
  """Without `import jaxsparse_tc` the handlers are not registered: compiling the artifact
  fails, and the error names the missing versioned target. An artifact that takes a matrix
  fails sooner, at deserialization, naming the library's unregistered pytree node."""
  rows, cols, vals = random_coo(rng, 30, 30, 0.2)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(30, 30))
  x = np.asarray(rng.standard_normal((30, 4)), np.float32)
  e = _export(lambda x: jst.spmm(A, x), x)  # A is a constant: the call takes plain arrays
  proc = _run_fresh(tmp_path, {"spmm": (bytes(e.serialize()), (x,))}, import_library=False)
  assert proc.returncode != 0
  assert extensions.target("spmm") in proc.stderr, proc.stderr[-4000:]

  e = _export(jst.spmm, A, x)
  proc = _run_fresh(tmp_path, {"spmm": (bytes(e.serialize()), None)}, import_library=False)
  assert proc.returncode != 0
  assert re.search(r"unregistered type `jaxsparse_tc\.\w+`", proc.stderr), proc.stderr[-4000:]


@needs_flatbuffers
def test_matrix_pytree_nodes_round_trip_through_serialization(rng):
  """A matrix argument's node keeps its static parts (shape, grouped, padded) through
  serialization, so that the deserialized artifact takes the same matrices."""
  rows, cols, vals = random_coo(rng, 40, 24, 0.2)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(40, 24))
  x = jnp.asarray(rng.standard_normal((24, 3)), jnp.float32)
  e = jax.export.deserialize(_export(jst.spmm, A, x).serialize())
  assert e.in_tree == jax.tree.structure(((A, x), {}))
  np.testing.assert_allclose(e.call(A, x), jax.jit(jst.spmm)(A, x), rtol=1e-6, atol=1e-6)
  B = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(41, 24))  # another static shape
  with pytest.raises((ValueError, TypeError)):
    e.call(B, x)


@needs_flatbuffers
def test_a_reordered_matrix_argument_round_trips(rng):
  rows, cols, vals = random_coo(rng, 48, 48, 0.1)
  R = jst.ReorderedMatrix.from_coo(rows, cols, vals, shape=(48, 48), method="affinity")
  x = jnp.asarray(rng.standard_normal((48, 3)), jnp.float32)
  e = jax.export.deserialize(_export(jst.spmm, R, x).serialize())
  assert e.in_tree == jax.tree.structure(((R, x), {}))
  dense = _dense(rows, cols, vals, (48, 48))
  np.testing.assert_allclose(e.call(R, x), dense @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-5)


# -- pickle and flax.serialization ---------------------------------------------------------------
def _matrix(rng, heads=None):
  rows, cols, vals = random_coo(rng, 50, 37, 0.15)
  if heads:
    vals = rng.standard_normal((heads, rows.size)).astype(np.float32)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(50, 37))
  return A, _dense(rows, cols, vals, (50, 37)) if not heads else None


def _same_matrix(B, A):
  assert type(B) is jst.SparseMatrix
  assert (B.shape, B.grouped, B.padded, B.nnz) == (A.shape, A.grouped, A.padded, A.nnz)
  for a, b in zip(jax.tree.leaves(A), jax.tree.leaves(B)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("heads", [None, 2])
def test_pickle_round_trip(rng, heads):
  A, dense = _matrix(rng, heads)
  B = pickle.loads(pickle.dumps(A))
  _same_matrix(B, A)
  x = jnp.asarray(rng.standard_normal((37, 5)), jnp.float32)
  np.testing.assert_array_equal(jst.spmm(B, x), jst.spmm(A, x))
  if dense is not None:
    np.testing.assert_allclose(
      jst.spmm(B, x), dense @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-5
    )


def test_pickle_rechecks_the_pattern(rng):
  """Unpickling goes through the constructor's checks: a corrupted pattern is refused."""
  A, _ = _matrix(rng)
  broken = A.pattern._replace(block_bitmap=jnp.zeros_like(A.pattern.block_bitmap))
  state = pickle.dumps(A).replace(
    np.asarray(A.pattern.block_bitmap).tobytes(), np.asarray(broken.block_bitmap).tobytes()
  )
  assert state != pickle.dumps(A)
  with pytest.raises((PatternError, ValueError, OperandError)):
    pickle.loads(state)


def test_flax_round_trip_of_a_params_tree(rng):
  serialization = pytest.importorskip("flax.serialization")
  A, dense = _matrix(rng)
  params = {
    "adjacency": A,
    "dense": {"kernel": jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)},
  }
  blob = serialization.to_bytes(params)
  B = serialization.from_bytes(A, serialization.to_bytes(A))
  _same_matrix(B, A)
  restored = serialization.from_bytes(params, blob)
  _same_matrix(restored["adjacency"], A)
  np.testing.assert_array_equal(restored["dense"]["kernel"], params["dense"]["kernel"])
  x = jnp.asarray(rng.standard_normal((37, 5)), jnp.float32)
  got = jst.spmm(restored["adjacency"], x)
  np.testing.assert_array_equal(got, jst.spmm(A, x))
  np.testing.assert_allclose(got, dense @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-5)
  # A template of another pattern: the saved matrix comes back, not the template's.
  other, _ = _matrix(rng)
  _same_matrix(serialization.from_bytes(other, serialization.to_bytes(A)), A)


def test_flax_restore_checks_the_pattern(rng):
  serialization = pytest.importorskip("flax.serialization")
  A, _ = _matrix(rng)
  state = serialization.to_state_dict(A)
  state["pattern"]["rows"] = np.asarray(state["pattern"]["rows"])[::-1].copy()
  with pytest.raises((PatternError, ValueError)):
    serialization.from_state_dict(A, state)
  del state["perm_t"]
  with pytest.raises(ValueError, match="perm_t"):
    serialization.from_state_dict(A, state)


def test_flax_registration_waits_for_flax(tmp_path):
  """Importing jaxsparse_tc does not import flax; importing flax.serialization afterwards
  registers the matrix handlers."""
  script = textwrap.dedent(
    """
    import sys
    import jaxsparse_tc as jst
    assert "flax" not in sys.modules, "jaxsparse_tc imported flax"
    from flax import serialization
    state = serialization.to_state_dict(jst.SparseMatrix.from_coo([0, 1], [1, 0]))
    assert isinstance(state, dict) and state["shape"] == [2, 2], state
    """
  )
  pytest.importorskip("flax")
  proc = _run_child(script, tmp_path, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]


def test_orbax_round_trip_of_a_params_tree(rng, tmp_path):
  """orbax saves a matrix as the pytree it is (its arrays) and restores it into an abstract
  template of the same tree, through the pytree's checked unflattening."""
  ocp = pytest.importorskip("orbax.checkpoint")
  A, dense = _matrix(rng)
  params = {"adjacency": A, "kernel": jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)}
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", params)
  checkpointer.wait_until_finished()
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
  restored = checkpointer.restore(tmp_path / "ckpt", abstract)
  _same_matrix(restored["adjacency"], A)
  x = jnp.asarray(rng.standard_normal((37, 5)), jnp.float32)
  got = jst.spmm(restored["adjacency"], x)
  np.testing.assert_allclose(got, dense @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-5)
