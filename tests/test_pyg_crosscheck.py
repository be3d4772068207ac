"""Cross-check against PyTorch Geometric: the same weights in PyG's layers and ours.

Skipped unless torch_geometric (and flax) import. Runs torch and JAX on the CPU (float32;
the CUDA kernels' tf32 default would blur a 1e-4 comparison). Graphs: Cora (symmetric) and a
random directed graph (source -> target orientation, nodes without incoming edges).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pyg_nn = pytest.importorskip("torch_geometric.nn")
pytest.importorskip("flax")

from flax import nnx  # noqa: E402

from jaxsparse_tc.datasets import load_cora  # noqa: E402
from jaxsparse_tc.nn import flax as nnf  # noqa: E402
from jaxsparse_tc.nn import graph  # noqa: E402

RTOL = 1e-4


@pytest.fixture(autouse=True)
def _on_cpu():
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def _random_directed(n=300, e=1500, f=24, seed=0):
  rng = np.random.default_rng(seed)
  src = rng.integers(0, n, e)
  dst = rng.integers(0, n // 2, e) * 2  # odd nodes receive nothing
  keep = src != dst
  ei = np.unique(np.stack([src[keep], dst[keep]]), axis=1)  # no duplicates
  return ei, n, rng.normal(size=(n, f)).astype(np.float32)


@pytest.fixture(scope="module", params=["cora", "directed"])
def data(request):
  if request.param == "cora":
    ds = load_cora(normalize_features=True)
    rng = np.random.default_rng(0)
    cols = rng.choice(ds.num_features, 64, replace=False)  # keep the test fast
    x = ds.features[:, cols] * 10.0
    return ds.edge_index, ds.num_nodes, x.astype(np.float32)
  return _random_directed()


def copy_torch_to_flax(tmod, fmod):
  """PyG parameter `a.b.weight` -> `a.b.kernel` (transposed); att [1,H,C] -> [H,C]; beta -> ()."""
  for name, p in tmod.named_parameters():
    *path, leaf = name.split(".")
    target = fmod
    for part in path:
      target = getattr(target, part)
    if target is None:  # e.g. PyG keeps lin_skip when root_weight=False; it is not used
      continue
    value = p.detach().cpu().numpy()
    if leaf == "weight":
      leaf, value = "kernel", value.T
    var = getattr(target, leaf)
    value = value.reshape(var[...].shape)
    var[...] = jnp.asarray(value)


def _randomize_biases(tmod, seed=0):
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in tmod.named_parameters():
      if name.endswith("bias") or name == "beta":
        p.copy_(torch.rand(p.shape, generator=g) + 0.5)


def _compare(tmod, fmod, A, ei, x):
  _randomize_biases(tmod)
  copy_torch_to_flax(tmod, fmod)
  tmod.eval()
  fmod.eval()
  with torch.no_grad():
    ref = tmod(torch.from_numpy(x), torch.from_numpy(ei)).numpy().astype(np.float64)
  got = np.asarray(fmod(A, jnp.asarray(x)), np.float64)
  assert got.shape == ref.shape
  scale = np.abs(ref).max()
  assert scale > 0
  np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * scale)


def test_gcnconv(data):
  ei, n, x = data
  torch.manual_seed(0)
  _compare(pyg_nn.GCNConv(x.shape[1], 16), nnf.GCNConv(x.shape[1], 16, rngs=nnx.Rngs(0)),
           graph.gcn_norm(ei, n), ei, x)


@pytest.mark.parametrize("heads,concat", [(1, True), (4, True), (3, False)])
def test_gatconv(data, heads, concat):
  ei, n, x = data
  torch.manual_seed(1)
  tm = pyg_nn.GATConv(x.shape[1], 8, heads=heads, concat=concat)
  fm = nnf.GATConv(x.shape[1], 8, heads=heads, concat=concat, rngs=nnx.Rngs(0))
  _compare(tm, fm, graph.message_passing_matrix(ei, n, self_loops=True), ei, x)


@pytest.mark.parametrize("requires_grad", [True, False])
def test_agnnconv(data, requires_grad):
  ei, n, x = data
  tm = pyg_nn.AGNNConv(requires_grad=requires_grad)
  fm = nnf.AGNNConv(requires_grad=requires_grad)
  _compare(tm, fm, graph.message_passing_matrix(ei, n, self_loops=True), ei, x)


@pytest.mark.parametrize("heads,concat,beta,root,bias", [(1, True, False, True, True),
                                                         (4, True, True, True, True),
                                                         (2, False, False, True, True),
                                                         (2, True, False, False, True),
                                                         (2, True, False, True, False)])
def test_transformerconv(data, heads, concat, beta, root, bias):
  ei, n, x = data
  torch.manual_seed(2)
  tm = pyg_nn.TransformerConv(x.shape[1], 8, heads=heads, concat=concat, beta=beta,
                              root_weight=root, bias=bias)
  fm = nnf.TransformerConv(x.shape[1], 8, heads=heads, concat=concat, beta=beta,
                           root_weight=root, use_bias=bias, rngs=nnx.Rngs(0))
  # TransformerConv adds no self-loops: the mask is the edge list as given.
  _compare(tm, fm, graph.message_passing_matrix(ei, n), ei, x)
