"""README.md's Python snippets run as written (each ```python block, in its own namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
  assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs(index):
  code = BLOCKS[index]
  for module in ("flax", "equinox", "optax"):
    if re.search(rf"\b(from|import) {module}\b", code):
      pytest.importorskip(module)
  with jax.default_device(jax.devices("cpu")[0]):
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "readme"})
