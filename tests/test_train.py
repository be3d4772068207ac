"""A short run of the Cora example (python -m jaxsparse_tc.examples.train): the loss falls."""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("optax")


@pytest.mark.parametrize(
  "model,framework", [("gcn", "flax"), ("gat", "equinox"), ("agnn", "flax"), ("gt", "equinox")]
)
def test_short_training_decreases_loss(model, framework):
  pytest.importorskip(framework)
  from jaxsparse_tc.examples.train import train

  with jax.default_device(jax.devices("cpu")[0]):
    r = train(model, framework, seed=0, epochs=12, verbose=False)
  h = np.asarray(r["loss_history"])
  assert np.all(np.isfinite(h))
  assert h[-3:].mean() < h[:3].mean() - 0.02, h
  assert 0.0 <= r["test_acc"] <= 1.0 and 1 <= r["best_epoch"] <= 12
  if model in ("gcn", "gat"):  # these learn fast: well above the largest class (~0.3)
    assert r["best_val_acc"] > 0.5


def test_main_prints_progress_and_accuracy(capsys):
  pytest.importorskip("flax")
  from jaxsparse_tc.examples.train import main

  with jax.default_device(jax.devices("cpu")[0]):
    assert main(["--model", "gcn", "--epochs", "3"]) == 0
  out = capsys.readouterr().out
  assert out.count("epoch ") >= 3 and "test acc" in out
