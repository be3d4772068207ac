"""The graph-classification example (jaxsparse_tc/examples/graph_classification.py).

The model ignores padding (masked BatchNorm statistics, pooling that drops padding nodes): a
graph's logits do not depend on the budget or, in eval mode, on its batch-mates; and the
example runs end to end on a tiny synthetic TU-style dataset (2 folds, 2 epochs), returning
the validation-selected and Xu et al.'s figures, also through examples.train --task graph.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxsparse_tc.examples import graph_classification as gc
from jaxsparse_tc.nn.batch import Budget, batch_graphs


@pytest.fixture(autouse=True)
def _on_cpu():
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def tiny_tu(path, rng, graphs=40, tags=3):
  """A TU-style `<name>.npz` (row, col, graph_ptr, graph_label, node_tag): random symmetric
  graphs whose label is whether tag 0 is the most common tag."""
  rows, cols, ptr, labels, node_tags = [], [], [0], [], []
  for _ in range(graphs):
    n = int(rng.integers(3, 15))
    t = rng.integers(0, tags, n)
    e = rng.integers(0, n, (2, 2 * n))
    e = e[:, e[0] != e[1]]
    e = np.unique(np.concatenate([e, e[::-1]], axis=1), axis=1)
    rows.append(e[0] + ptr[-1])
    cols.append(e[1] + ptr[-1])
    node_tags.append(t)
    labels.append(int(np.bincount(t, minlength=tags).argmax() == 0))
    ptr.append(ptr[-1] + n)
  np.savez(
    path,
    row=np.concatenate(rows).astype(np.int32),
    col=np.concatenate(cols).astype(np.int32),
    graph_ptr=np.array(ptr, np.int64),
    graph_label=np.array(labels, np.int32),
    node_tag=np.concatenate(node_tags).astype(np.int32),
  )


@pytest.mark.parametrize("kind", ["gin", "gcn"])
def test_logits_ignore_padding_and_batch_mates(tmp_path, rng, kind):
  from jaxsparse_tc.datasets import load_tu_npz

  tiny_tu(tmp_path / "tiny.npz", rng, graphs=12)
  ds = load_tu_npz(tmp_path / "tiny.npz")
  loops = kind == "gcn"
  small = Budget.for_dataset(ds.graphs, 6, add_self_loops=loops)
  large = Budget(small.nodes + 37, small.edges + 50, 8, add_self_loops=loops)
  model = gc.build_model(kind, ds.num_features, 16, 2, layers=3, dropout=0.0, seed=1)
  # train mode: BatchNorm uses the batch's statistics, which must not see the padding
  a = model(batch_graphs(ds.graphs[:6], small))[:6]
  b = model(batch_graphs(ds.graphs[:6], large))[:6]
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
  # eval mode: running statistics; a graph's logits do not depend on its batch-mates
  model.eval()
  full = model(batch_graphs(ds.graphs[:6], small))[:6]
  for g in range(6):
    alone = model(batch_graphs([ds.graphs[g]], large))[0]
    np.testing.assert_allclose(np.asarray(full[g]), np.asarray(alone), rtol=2e-5, atol=2e-5)


def _tiny_args(tmp_path):
  return [
    "--data",
    str(tmp_path),
    "--dataset",
    "tiny",
    "--folds",
    "2",
    "--epochs",
    "2",
    "--layers",
    "2",
    "--hidden",
    "8",
    "--shuffles",
    "2",
    "--workers",
    "1",
    "--quiet",
  ]


def test_example_end_to_end_both_protocols(tmp_path, rng, capsys):
  tiny_tu(tmp_path / "tiny.npz", rng)
  out = tmp_path / "result.json"
  assert gc.main(_tiny_args(tmp_path) + ["--protocol", "both", "--json", str(out)]) == 0
  (r,) = json.loads(out.read_text())
  assert (r["dataset"], r["model"], r["folds"], r["epochs"]) == ("tiny", "gin", 2, 2)
  for k in ("val", "xu", "last"):
    assert 0.0 <= r["results"][k]["mean"] <= 1.0
  assert len(r["results"]["val"]["epoch"]) == 2  # the selected epoch of each fold
  assert r["results"]["xu"]["epoch"] in (1, 2)
  table = capsys.readouterr().out
  assert "val-selected" in table and "Xu (test-selected)" in table


def test_train_entry_point_runs_graph_task(tmp_path, rng, capsys):
  from jaxsparse_tc.examples import train

  tiny_tu(tmp_path / "tiny.npz", rng)
  args = _tiny_args(tmp_path) + ["--protocol", "xu", "--model", "gcn", "--epochs", "1"]
  assert train.main(["--task", "graph"] + args) == 0
  table = capsys.readouterr().out
  assert "gcn" in table and "Xu (test-selected)" in table and "val-selected" not in table


def test_folds_are_independent_and_see_only_their_training_graphs(tmp_path, rng):
  """The vmapped folds are independent: fold 0's parameters and metrics do not change when
  fold 1 gets another initialisation and other roles of the graphs, and its training metrics
  equal those of fold 0 trained alone (its val and test graphs masked out of the batches).
  (Alone, parameters match only in training-mode function: a Linear bias just before a
  BatchNorm gets a zero gradient up to rounding, which Adam turns into steps of ~lr that
  differ with the rounding; the BatchNorm removes them, its running mean follows them.)"""
  import argparse

  import jax.numpy as jnp

  from jaxsparse_tc.datasets import load_tu_npz

  tiny_tu(tmp_path / "tiny.npz", rng)
  ds = load_tu_npz(tmp_path / "tiny.npz")
  roles = np.zeros((3, len(ds)), np.int32)
  for f, split in enumerate(
    gc.fold_splits(ds.labels, argparse.Namespace(folds=3, protocol="both", seed=3))
  ):
    roles[f, split["val"]], roles[f, split["test"]] = 1, 2
  budget = Budget.for_dataset(ds.graphs, 8)
  data = gc.SharedBatches(ds.graphs, budget, 8, 2, seed=0, workers=1)
  models = {s: gc.build_model("gin", ds.num_features, 8, 2, layers=3, seed=s) for s in (5, 6, 7)}
  trainer = gc.Trainer(models[5], masked=not data.uniform)

  def train(seeds, folds):
    carry = trainer.init([models[s] for s in seeds], data.device)
    for s in range(2):
      carry, m = trainer.epoch(
        carry,
        jnp.float32(0.01),
        data.train,
        data.gid,
        data.order[s],
        data.valid[s],
        jnp.asarray(roles[folds]),
        data.order[0],
        data.valid[0],
        evaluate=True,
      )
    return carry[0], np.asarray(m)

  params_a, metrics_a = train([5, 6], [0, 1])
  params_b, metrics_b = train([5, 7], [0, 2])
  np.testing.assert_allclose(metrics_a[0], metrics_b[0], rtol=1e-6, atol=1e-6)
  for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
    np.testing.assert_allclose(np.asarray(a)[0], np.asarray(b)[0], rtol=1e-6, atol=1e-7)
  assert not np.allclose(metrics_a[1], metrics_b[1])  # fold 1 did change
  params_alone, alone = train([5], [0])
  np.testing.assert_allclose(metrics_a[0, :3], alone[0, :3], rtol=1e-5)  # training metrics
  np.testing.assert_array_equal(metrics_a[0, [5, 8]], alone[0, [5, 8]])  # val / test counts
  # no leak: fold 0's training ignores the features and labels of its val and test graphs
  held_out = set(np.nonzero(roles[0] > 0)[0].tolist())
  changed = [
    g._replace(x=np.roll(g.x, 1, axis=1), y=1 - g.y) if i in held_out else g
    for i, g in enumerate(ds.graphs)
  ]
  data = gc.SharedBatches(changed, budget, 8, 2, seed=0, workers=1)  # same packing: sizes
  params_c, metrics_c = train([5], [0])
  np.testing.assert_allclose(metrics_c[0, :3], alone[0, :3], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(params_alone), jax.tree.leaves(params_c)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert not np.array_equal(metrics_c[0, 3:], alone[0, 3:])  # held-out scores did change
