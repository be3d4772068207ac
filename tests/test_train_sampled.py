"""The sampled-training example (jaxsparse_tc.examples.train_sampled) end to end on the shipped
Cora: the loss falls, the accuracy beats chance by a wide margin, and one trace of the train
step serves every batch of every epoch (the last, smaller batch included)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxsparse_tc.datasets import load_cora
from jaxsparse_tc.examples import train, train_sampled


@pytest.fixture(scope="module")
def cora():
  return load_cora(normalize_features=True)


def test_sampled_training_learns_with_one_trace(cora, rng):
  seed = int(rng.integers(1000))
  r = train_sampled.train(
    fanouts=(5, 5), batch_size=32, epochs=8, hidden=32, seed=seed, verbose=False, ds=cora
  )
  # 140 training nodes in batches of 32: 4 full batches and one of 12 (padded).
  assert r["steps_per_epoch"] == 5
  assert r["traces"] == 1
  losses = r["loss_history"]
  assert np.mean(losses[-2:]) < 0.75 * np.mean(losses[:2]), losses
  labels = cora.labels[cora.test_idx]
  majority = np.bincount(labels).max() / labels.size  # the best constant guess (~0.32)
  assert r["best_val_acc"] > majority + 0.2, r
  assert r["test_acc"] > majority + 0.2, r


def test_train_task_node_sampled_dispatches(cora, monkeypatch, capsys):
  """train.py --task node-sampled hands its arguments to train_sampled (training itself is
  the test above: here a stand-in records the call)."""
  calls = []

  def fake_train(dataset, **kw):
    calls.append(dict(kw, dataset=dataset))
    return {
      "mode": "sampled",
      "test_acc": 0.5,
      "best_val_acc": 0.5,
      "best_epoch": 1,
      "final_test_acc": 0.5,
      "seconds_per_epoch": 0.1,
      "traces": 1,
    }

  monkeypatch.setattr(train_sampled, "train", fake_train)
  monkeypatch.setattr(train_sampled, "load_dataset", lambda name, data: cora)
  args = "--task node-sampled --fanouts 25 10 --batch-size 64 --seeds 2 --seed 3 --quiet"
  assert train.main(args.split()) == 0
  assert [c["seed"] for c in calls] == [3, 4]
  c = calls[0]
  assert c["fanouts"] == [25, 10] and c["batch_size"] == 64 and c["epochs"] == 50
  assert c["dataset"] == "cora" and c["ds"] is cora and not c["full_batch"]
  assert "mean test acc over seeds 3..4" in capsys.readouterr().out


def test_fanouts_must_match_the_layers():
  with pytest.raises(SystemExit):
    train_sampled.main(["--fanouts", "5", "5", "5"])


@pytest.mark.parametrize("fanouts", [(15, 10), (4, -1, 2)])
def test_bench_sampled_torch_sampler(rng, fanouts):
  """The benchmark's PyTorch peer samples as ours promises (its own checks, on the CPU)."""
  pytest.importorskip("torch")
  from benchmarks import bench_sampled

  ei, n, seeds = bench_sampled.check_graph(rng)
  bench_sampled.check_torch_sampler(ei, n, fanouts, seeds, seed=int(rng.integers(1 << 30)))
