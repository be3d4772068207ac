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
  """PyG parameter `a.b.weight` -> `a.b.kernel` (transposed); att [1,H,C] -> [H,C]; beta, eps
  -> (); numbered parts (`lins.0`) index lists."""
  for name, p in tmod.named_parameters():
    *path, leaf = name.split(".")
    target = fmod
    for part in path:
      target = target[int(part)] if part.isdigit() else getattr(target, part)
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


def _compare(tmod, fmod, A, ei, x, edge_attr=None):
  _randomize_biases(tmod)
  copy_torch_to_flax(tmod, fmod)
  tmod.eval()
  fmod.eval()
  kw = {} if edge_attr is None else {"edge_attr": torch.from_numpy(edge_attr)}
  with torch.no_grad():
    ref = tmod(torch.from_numpy(x), torch.from_numpy(ei), **kw).numpy().astype(np.float64)
  fkw = {} if edge_attr is None else {"edge_attr": jnp.asarray(edge_attr)}
  got = np.asarray(fmod(A, jnp.asarray(x), **fkw), np.float64)
  assert got.shape == ref.shape
  scale = np.abs(ref).max()
  assert scale > 0
  np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * scale)


def test_gcnconv(data):
  ei, n, x = data
  torch.manual_seed(0)
  _compare(
    pyg_nn.GCNConv(x.shape[1], 16),
    nnf.GCNConv(x.shape[1], 16, rngs=nnx.Rngs(0)),
    graph.gcn_norm(ei, n),
    ei,
    x,
  )


@pytest.mark.parametrize("heads,concat", [(1, True), (4, True), (3, False)])
def test_gatconv(data, heads, concat):
  ei, n, x = data
  torch.manual_seed(1)
  tm = pyg_nn.GATConv(x.shape[1], 8, heads=heads, concat=concat)
  fm = nnf.GATConv(x.shape[1], 8, heads=heads, concat=concat, rngs=nnx.Rngs(0))
  _compare(tm, fm, graph.message_passing_matrix(ei, n, add_self_loops=True), ei, x)


@pytest.mark.parametrize("requires_grad", [True, False])
def test_agnnconv(data, requires_grad):
  ei, n, x = data
  tm = pyg_nn.AGNNConv(requires_grad=requires_grad)
  fm = nnf.AGNNConv(requires_grad=requires_grad)
  _compare(tm, fm, graph.message_passing_matrix(ei, n, add_self_loops=True), ei, x)


@pytest.mark.parametrize(
  "heads,concat,beta,root,bias",
  [
    (1, True, False, True, True),
    (4, True, True, True, True),
    (2, False, False, True, True),
    (2, True, False, False, True),
    (2, True, False, True, False),
  ],
)
def test_transformerconv(data, heads, concat, beta, root, bias):
  ei, n, x = data
  torch.manual_seed(2)
  tm = pyg_nn.TransformerConv(
    x.shape[1], 8, heads=heads, concat=concat, beta=beta, root_weight=root, bias=bias
  )
  fm = nnf.TransformerConv(
    x.shape[1],
    8,
    heads=heads,
    concat=concat,
    beta=beta,
    root_weight=root,
    use_bias=bias,
    rngs=nnx.Rngs(0),
  )
  # TransformerConv adds no self-loops: the mask is the edge list as given.
  _compare(tm, fm, graph.message_passing_matrix(ei, n), ei, x)


def _edge_attr(ei, width=3, seed=5):
  return np.random.default_rng(seed).normal(size=(ei.shape[1], width)).astype(np.float32)


@pytest.mark.parametrize("heads,concat", [(2, True), (3, False)])
def test_gatconv_edge_dim(data, heads, concat):
  ei, n, x = data
  torch.manual_seed(3)
  tm = pyg_nn.GATConv(x.shape[1], 8, heads=heads, concat=concat, edge_dim=3)
  fm = nnf.GATConv(x.shape[1], 8, heads=heads, concat=concat, edge_dim=3, rngs=nnx.Rngs(0))
  _compare(tm, fm, graph.message_passing_matrix(ei, n, add_self_loops=True), ei, x, _edge_attr(ei))


@pytest.mark.parametrize(
  "heads,concat,share,edge_dim",
  [(1, True, False, None), (4, True, False, None), (2, False, True, None), (2, True, False, 3)],
)
def test_gatv2conv(data, heads, concat, share, edge_dim):
  ei, n, x = data
  torch.manual_seed(4)
  tm = pyg_nn.GATv2Conv(
    x.shape[1], 8, heads=heads, concat=concat, share_weights=share, edge_dim=edge_dim
  )
  fm = nnf.GATv2Conv(
    x.shape[1],
    8,
    heads=heads,
    concat=concat,
    share_weights=share,
    edge_dim=edge_dim,
    rngs=nnx.Rngs(0),
  )
  _compare(
    tm,
    fm,
    graph.message_passing_matrix(ei, n, add_self_loops=True),
    ei,
    x,
    None if edge_dim is None else _edge_attr(ei),
  )


@pytest.mark.parametrize(
  "aggr,normalize,root", [("mean", False, True), ("add", True, True), ("max", False, False)]
)
def test_sageconv(data, aggr, normalize, root):
  ei, n, x = data
  torch.manual_seed(5)
  tm = pyg_nn.SAGEConv(x.shape[1], 8, aggr=aggr, normalize=normalize, root_weight=root)
  fm = nnf.SAGEConv(
    x.shape[1], 8, aggr=aggr, normalize=normalize, root_weight=root, rngs=nnx.Rngs(0)
  )
  _compare(tm, fm, graph.message_passing_matrix(ei, n), ei, x)


@pytest.mark.parametrize("train_eps", [False, True])
def test_ginconv(data, train_eps):
  ei, n, x = data
  torch.manual_seed(6)
  mlp = pyg_nn.MLP([x.shape[1], 16, 8], norm=None)
  tm = pyg_nn.GINConv(mlp, eps=0.3, train_eps=train_eps)
  fm = nnf.GINConv(nnf.MLP([x.shape[1], 16, 8], rngs=nnx.Rngs(0)), eps=0.3, train_eps=train_eps)
  _compare(tm, fm, graph.message_passing_matrix(ei, n), ei, x)


def test_transformerconv_edge_dim(data):
  ei, n, x = data
  torch.manual_seed(7)
  tm = pyg_nn.TransformerConv(x.shape[1], 8, heads=2, edge_dim=3)
  fm = nnf.TransformerConv(x.shape[1], 8, heads=2, edge_dim=3, rngs=nnx.Rngs(0))
  _compare(tm, fm, graph.message_passing_matrix(ei, n), ei, x, _edge_attr(ei))


def test_batched_gin_pooling_matches_pyg_batch():
  """A padded batch (nn.batch) against PyG's Batch: GINConv + global add/mean/max pooling."""
  from torch_geometric.data import Batch, Data

  from jaxsparse_tc.nn.batch import Budget, Graph, batch_graphs
  from jaxsparse_tc.nn.pool import global_add_pool, global_max_pool, global_mean_pool

  rng = np.random.default_rng(8)
  graphs = []
  for _ in range(6):
    k = int(rng.integers(2, 20))
    ei = rng.integers(0, k, (2, 3 * k))
    graphs.append(Graph(ei, k, x=rng.normal(size=(k, 5)).astype(np.float32), y=0))
  torch.manual_seed(9)
  tm = pyg_nn.GINConv(pyg_nn.MLP([5, 16, 8], norm=None))
  fm = nnf.GINConv(nnf.MLP([5, 16, 8], rngs=nnx.Rngs(0)))
  _randomize_biases(tm)
  copy_torch_to_flax(tm, fm)
  tb = Batch.from_data_list(
    [
      Data(
        x=torch.from_numpy(g.x),
        edge_index=torch.from_numpy(g.edge_index.astype(np.int64)),
        num_nodes=g.num_nodes,
      )
      for g in graphs
    ]
  )
  with torch.no_grad():
    h = tm(tb.x, tb.edge_index)
    ref = (
      torch.cat(
        [
          pyg_nn.global_add_pool(h, tb.batch),
          pyg_nn.global_mean_pool(h, tb.batch),
          pyg_nn.global_max_pool(h, tb.batch),
        ],
        -1,
      )
      .numpy()
      .astype(np.float64)
    )
  b = batch_graphs(graphs, Budget.for_dataset(graphs, 6))
  hb = fm(b.A, b.x)
  got = np.concatenate(
    [global_add_pool(hb, b), global_mean_pool(hb, b), global_max_pool(hb, b)], -1
  )[: len(graphs)]
  np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * np.abs(ref).max())
