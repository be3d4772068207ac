"""The package's layout: implementations live under jaxsparse_tc/_src, public modules re-export
them, and imports point one way (public -> _src), read from the sources' syntax trees so that
an import inside a function counts too. Pickles name public classes by their public modules."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_tc as jst

PACKAGE = Path(__file__).resolve().parent.parent / "jaxsparse_tc"
SRC = PACKAGE / "_src"
# The compiled extensions are leaves: they import nothing of the package.
EXTENSIONS = {"jaxsparse_tc._cpu", "jaxsparse_tc._cuda"}
# Public modules that only re-export what _src implements.
THIN = [
  "options.py",
  "sparse_matrix.py",
  "interop.py",
  "reorder.py",
  "sampling.py",
  "nn/batch.py",
  "nn/equinox.py",
  "nn/flax.py",
  "nn/functional.py",
  "nn/graph.py",
  "nn/pool.py",
]


def _module_name(path: Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
  """The jaxsparse_tc modules (or names of a package, as `package.name`) a source imports."""
  tree = ast.parse(path.read_text(), filename=str(path))
  package = _module_name(path)
  if path.name != "__init__.py":
    package = package.rpartition(".")[0]
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
      else:
        module = node.module
      out.add(module)
      out.update(f"{module}.{a.name}" for a in node.names)
  return {m for m in out if m == "jaxsparse_tc" or m.startswith("jaxsparse_tc.")}


def _is_module(name: str) -> bool:
  rel = Path(*name.split(".")[1:])
  return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def test_src_never_imports_public_modules():
  files = sorted(SRC.rglob("*.py"))
  assert len(files) > 30, f"found only {len(files)} sources under {SRC}"
  bad = []
  for path in files:
    for name in _imports(path):
      if name.startswith("jaxsparse_tc._src") or name in EXTENSIONS:
        continue
      # `from jaxsparse_tc import _cpu` reads as both the package and `jaxsparse_tc._cpu`.
      if name == "jaxsparse_tc" and _imports_only_extensions(path):
        continue
      bad.append(f"{path.relative_to(PACKAGE)} imports {name}")
  assert not bad, "\n".join(bad)


def _imports_only_extensions(path: Path) -> bool:
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import) and any(a.name == "jaxsparse_tc" for a in node.names):
      return False
    if isinstance(node, ast.ImportFrom) and node.module == "jaxsparse_tc" and not node.level:
      if any(f"jaxsparse_tc.{a.name}" not in EXTENSIONS for a in node.names):
        return False
  return True


def test_the_import_checker_sees_what_it_must():
  """The checker above catches the imports it exists to refuse (so it can fail)."""
  probe = SRC / "_layout_probe_for_test.py"
  probe.write_text(
    "import jaxsparse_tc as jst\n"
    "def f():\n"
    "  from jaxsparse_tc.sparse_matrix import SparseMatrix\n"
    "  from jaxsparse_tc import _cpu, nn\n"
  )
  try:
    found = _imports(probe)
    assert {"jaxsparse_tc", "jaxsparse_tc.sparse_matrix", "jaxsparse_tc.nn"} <= found
    assert not _imports_only_extensions(probe)
    with pytest.raises(AssertionError, match="_layout_probe_for_test.py imports"):
      test_src_never_imports_public_modules()
  finally:
    probe.unlink()


def test_no_import_cycle_between_public_modules_and_src():
  """No path of imports leads from a _src module back to a public one: the graph of the
  package's modules, read from the sources, restricted to edges out of _src, never leaves it."""
  graph = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    graph[_module_name(path)] = {m for m in _imports(path) if _is_module(m)}
  assert graph, PACKAGE
  for start in [m for m in graph if m.startswith("jaxsparse_tc._src")]:
    seen, stack = {start}, [start]
    while stack:
      for nxt in graph.get(stack.pop(), ()):
        # the _src package's parents are run by Python first; they are not imports of it
        if nxt in ("jaxsparse_tc",) or nxt in seen:
          continue
        assert nxt.startswith("jaxsparse_tc._src"), f"{start} reaches {nxt}"
        seen.add(nxt)
        stack.append(nxt)


@pytest.mark.parametrize("rel", THIN)
def test_public_modules_only_reexport(rel):
  """A thin public module holds its docstring, imports from _src and __all__, nothing else; and
  every name of __all__ is there."""
  path = PACKAGE / rel
  tree = ast.parse(path.read_text())
  body = tree.body
  assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), rel
  names = set()
  for node in body[1:]:
    if isinstance(node, ast.ImportFrom):
      assert node.module.startswith("jaxsparse_tc._src."), (rel, node.module)
      names.update(a.asname or a.name for a in node.names)
    else:
      assert isinstance(node, ast.Assign) and node.targets[0].id == "__all__", (rel, node.lineno)
      exported = ast.literal_eval(node.value)
  assert set(exported) <= names, (rel, set(exported) - names)


def test_sparse_matrix_pickles_under_its_public_module(rng):
  """A pickle names jaxsparse_tc.sparse_matrix.SparseMatrix (as pickles made before the
  implementation moved under _src do), and loads back to the same matrix."""
  rows, cols = rng.integers(0, 40, 300), rng.integers(0, 30, 300)
  vals = rng.standard_normal(300).astype(np.float32)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(40, 30))
  blob = pickle.dumps(A)
  assert b"jaxsparse_tc.sparse_matrix" in blob and b"_src.sparse_matrix" not in blob
  B = pickle.loads(blob)
  assert type(B) is jst.SparseMatrix and B.shape == A.shape
  np.testing.assert_array_equal(np.asarray(B.todense()), np.asarray(A.todense()))
  x = jnp.asarray(rng.standard_normal((30, 4)), jnp.float32)
  np.testing.assert_allclose(np.asarray(B @ x), np.asarray(A @ x), rtol=1e-6, atol=1e-6)


def test_graph_batch_classes_pickle_under_their_public_module(rng):
  from jaxsparse_tc.nn.batch import Budget, Graph

  ei = rng.integers(0, 12, (2, 30))
  g = Graph(ei, 12, x=rng.standard_normal((12, 3)).astype(np.float32), y=1)
  blob = pickle.dumps(g)
  assert b"jaxsparse_tc.nn.batch" in blob and b"_src" not in blob
  h = pickle.loads(blob)
  assert type(h) is Graph
  np.testing.assert_array_equal(h.edge_index, g.edge_index)
  np.testing.assert_array_equal(h.x, g.x)
  b = Budget.for_dataset([g], batch_size=2)
  assert pickle.loads(pickle.dumps(b)) == b
