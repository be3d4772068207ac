"""The supported jax range: the import-time check, and pyproject.toml, README.md and .ci/run
stating the same range and commands."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

from jaxsparse_tc._src import jax_version

ROOT = Path(__file__).resolve().parent.parent
needs_source_tree = pytest.mark.skipif(
  not (ROOT / "pyproject.toml").exists(), reason="tests run outside the source tree"
)


def _version(parts) -> str:
  return ".".join(str(p) for p in parts)


def test_running_jax_is_supported():
  jax_version.check(jax.__version__)  # the package imported, so this must pass too


@pytest.mark.parametrize(
  "version", [_version(jax_version.OLDEST), "0.7.0", "0.11.2", "0.11.0.dev20260101"]
)
def test_check_accepts_the_range(version):
  jax_version.check(version)


@pytest.mark.parametrize("version", ["0.5.2", "0.4.38", "0.12.0", "0.12.0.dev20260101", "1.0.0"])
def test_check_refuses_outside_the_range(version):
  with pytest.raises(ImportError, match=re.escape(version)) as info:
    jax_version.check(version)
  assert jax_version.SUPPORTED in str(info.value)


def test_parse():
  assert jax_version.parse("0.5.3") == (0, 5, 3)
  assert jax_version.parse("0.11") == (0, 11, 0)
  assert jax_version.parse("0.11.2.dev20260101+abc") == (0, 11, 2)
  with pytest.raises(ValueError, match="'x.y'"):
    jax_version.parse("x.y")


def test_supported_matches_the_bounds():
  assert jax_version.SUPPORTED == f">={_version(jax_version.OLDEST)},<{_version(jax_version.BELOW)}"


@needs_source_tree
def test_pyproject_states_the_range():
  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())
  oldest = _version(jax_version.OLDEST)
  requires = project["build-system"]["requires"]
  assert f"jax=={oldest}" in requires and f"jaxlib=={oldest}" in requires, requires
  assert f"jax{jax_version.SUPPORTED}" in project["project"]["dependencies"]
  extras = project["project"]["optional-dependencies"]
  for package in ("pytest", "flax", "equinox", "optax"):
    assert any(r.startswith(package) for r in extras["test"]), (package, extras["test"])
  assert {r.split(">")[0] for r in extras["pyg"]} == {"torch", "torch_geometric"}


@needs_source_tree
def test_readme_commands_run_in_ci():
  """CI runs README's install and test commands as written, and states README's jax range."""
  readme = (ROOT / "README.md").read_text()
  ci = (ROOT / ".ci" / "run").read_text()
  block = re.search(r"## Two commands(.*?)\n## ", readme, flags=re.S)[1]
  commands = re.findall(r"```bash\n(.*?)```", block, flags=re.S)
  install, test = commands[0].strip().split(" && ")[0], commands[1].strip()
  assert f"python3 -m {install}" in ci and f"python3 -m {test.removeprefix('python -m ')}" in ci
  assert f"`jax{jax_version.SUPPORTED}`" in readme
