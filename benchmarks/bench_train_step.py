"""End to end: one training step (forward + backward + optax Adam update) of 2-layer GNNs.

Models (float32, no dropout so that every implementation does the same work):
- GCN: in -> 128 -> classes, ReLU (Kipf & Welling), A = D^-1/2 (A+I) D^-1/2 precomputed.
- GAT: in -> 8 heads x 16 (concat, 128) -> ELU -> 1 head -> classes, self-loops precomputed.
Loss: softmax cross-entropy over all nodes; Adam with weight decay 5e-4.

Implementations, same GPU, same graph, same run:
- `lib`: this library's Flax modules (jaxsparse_tc.nn.flax GCN / GAT) under jax.jit: SpMM,
  edge_softmax and SDDMM on the library's CUDA kernels (the row kernels on these sparse graphs).
- `xla`: the same model written with XLA gathers + jax.ops.segment_sum / segment_max over
  row-sorted (CSR order) edges, `indices_are_sorted=True`, no gradient through the softmax's
  stabilizing max; the same parameters and the same order of operations (GCN propagates the
  narrower width, x first at equal widths, as jaxsparse_tc.nn does). Graphs are jit arguments
  (not constants) for both.
- `pyg`: torch_geometric GCNConv (cached normalization) / GATConv (add_self_loops=False on the
  pre-looped edge list) with torch.optim.Adam, edge_index input; `pyg_csr`: GCNConv on a
  torch.sparse CSR adj_t (cuSPARSE). Timed with CUDA events. Skipped if not importable.
`loss_err`: relative difference of the first loss between lib and xla (same parameters).
`*_ms`: wall time per step (block_until_ready medians); `*_dev_ms`: the step's GPU time alone
(common.time_jax_device), which on a small graph differs from the wall time by the host's
dispatch.
Graphs: the largest real graph available (common.real_graph_names()) and R-MAT 2^20 nodes,
16 edges per node (quick: R-MAT 2^14, 8 per node).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave room for PyG

import numpy as np

from benchmarks import common

COLUMNS = [
  "graph",
  "nodes",
  "edges",
  "model",
  "lib_ms",
  "xla_ms",
  "pyg_ms",
  "pyg_csr_ms",
  "x_vs_xla",
  "x_vs_pyg",
  "lib_dev_ms",
  "xla_dev_ms",
  "dev_vs_xla",
  "loss_err",
]

HIDDEN, HEADS = 128, 8


def _graph_inputs(name, g, rng):
  """Features, labels and the edge list (messages source -> target; g[i, j]: j -> i)."""
  n = g.shape[0]
  if name in common.real_graph_names() and name == "cora":
    from jaxsparse_tc.datasets import load_cora

    ds = load_cora(normalize_features=True)
    x, y, c = ds.features, ds.labels, ds.num_classes
  else:
    x = rng.standard_normal((n, 128)).astype(np.float32)
    c = 16
    y = rng.integers(0, c, n).astype(np.int32)
  csr = g.tocsr()
  csr.sort_indices()
  targets = np.repeat(np.arange(n), np.diff(csr.indptr))
  edge_index = np.stack([csr.indices.astype(np.int64), targets.astype(np.int64)])
  return x, y, c, edge_index


def _sorted_edges(A):
  """A's (rows, cols, values) in row-major (CSR) order, for the segment_sum model."""
  import jax.numpy as jnp

  rows, cols = np.asarray(A.rows), np.asarray(A.cols)
  order = np.lexsort((cols, rows))
  return (
    jnp.asarray(rows[order]),
    jnp.asarray(cols[order]),
    jnp.asarray(np.asarray(A.values)[order]),
  )


def _jax_steps(model_name, x, y, c, edge_index, n):
  """(lib_step, xla_step, lib_args, xla_args, loss_fns): jax.jit-compiled training steps."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from jaxsparse_tc.nn import flax as nnf
  from jaxsparse_tc.nn import graph

  rngs = nnx.Rngs(0)
  f = x.shape[1]
  if model_name == "gcn":
    A = graph.gcn_norm(edge_index, n)
    model = nnf.GCN(f, HIDDEN, c, dropout=0.0, rngs=rngs)
  else:
    A = graph.message_passing_matrix(edge_index, n, self_loops=True)
    model = nnf.GAT(f, HIDDEN // HEADS, c, heads=HEADS, dropout=0.0, rngs=rngs)
  model.eval()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def xla_forward(m, x, edges):
    rows, cols, vals = edges
    seg = lambda d: jax.ops.segment_sum(d, rows, n, indices_are_sorted=True)  # noqa: E731
    if model_name == "gcn":

      def conv(layer, h):  # the library's order: the narrower width is propagated (ties: h)
        w = layer.lin.kernel[...]
        if w.shape[0] <= w.shape[1]:
          return seg(vals[:, None] * h[cols]) @ w + layer.bias[...]
        h = h @ w
        return seg(vals[:, None] * h[cols]) + layer.bias[...]

      return conv(m.conv2, jax.nn.relu(conv(m.conv1, x)))

    def conv(layer, h, concat):
      heads = layer.heads
      h = (h @ layer.lin.kernel[...]).reshape(n, heads, -1)  # [n, H, C]
      a_src = jnp.einsum("nhc,hc->nh", h, layer.att_src[...])
      a_dst = jnp.einsum("nhc,hc->nh", h, layer.att_dst[...])
      e = jax.nn.leaky_relu(a_dst[rows] + a_src[cols], 0.2)  # [E, H]
      # the max only stabilizes exp: no gradient through it (as careful hand-written code does)
      mx = jax.lax.stop_gradient(jax.ops.segment_max(e, rows, n, indices_are_sorted=True))
      p = jnp.exp(e - mx[rows])
      alpha = p / seg(p)[rows]
      out = seg(alpha[:, :, None] * h[cols])  # [n, H, C]
      out = out.reshape(n, -1) if concat else out.mean(1)
      return out + layer.bias[...]

    return conv(m.conv2, jax.nn.elu(conv(m.conv1, x, True)), False)

  def lib_forward(m, x, A):
    return m(A, x)

  tx = optax.chain(optax.add_decayed_weights(5e-4), optax.adam(0.01))
  opt_state = tx.init(params)

  def make(forward):
    def loss_fn(params, x, y, g):
      logits = forward(nnx.merge(graphdef, params, rest), x, g)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(params, opt_state, x, y, g):  # the graph is an argument, not a constant
      loss, grads = jax.value_and_grad(loss_fn)(params, x, y, g)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    return step, jax.jit(loss_fn)

  lib_step, lib_loss = make(lib_forward)
  xla_step, xla_loss = make(xla_forward)
  args = (params, opt_state, jnp.asarray(x), jnp.asarray(y))
  return (lib_step, xla_step, args + (A,), args + (_sorted_edges(A),), (lib_loss, xla_loss))


def _time_jax(step, args, repeat):
  try:
    return common.time_fn(step, *args, warmup=2, repeat=repeat)
  except Exception as e:  # noqa: BLE001 - out of memory or a peer that cannot run this size
    msg = str(e).split("\n")[0][:100]
    print(f"    failed: {msg}", flush=True)
    return "OOM" if "RESOURCE_EXHAUSTED" in str(e) or "memory" in str(e).lower() else "fail"


def _device_ms(step, args, wall_ms):
  """The step's GPU time (common.time_jax_device: queued behind a matmul, so the host's dispatch
  is hidden), where the wall time is known and under 100 ms; None otherwise (CPU: no queue)."""
  import jax

  if not isinstance(wall_ms, float) or wall_ms > 100 or jax.devices()[0].platform != "gpu":
    return None
  return common.time_jax_device(step, args, 1)[0] / 1e3


def _pyg_times(model_name, x, y, c, edge_index, n, repeat):
  """{'pyg_ms': ..., 'pyg_csr_ms': ...} or {} when torch_geometric / CUDA is missing."""
  try:
    import torch
    import torch_geometric.nn as pyg_nn
    from torch_geometric.utils import add_self_loops
  except Exception:  # noqa: BLE001 - PyG is an optional peer
    return {}
  if not torch.cuda.is_available():
    return {}
  dev = torch.device("cuda")
  tx = torch.from_numpy(x).to(dev)
  ty = torch.from_numpy(y.astype(np.int64)).to(dev)
  ei = torch.from_numpy(edge_index).to(dev)
  f = x.shape[1]
  out = {}
  torch.manual_seed(0)

  class GCN(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1 = pyg_nn.GCNConv(f, HIDDEN, cached=True)
      self.conv2 = pyg_nn.GCNConv(HIDDEN, c, cached=True)

    def forward(self, x, g):
      return self.conv2(torch.relu(self.conv1(x, g)), g)

  class GAT(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1 = pyg_nn.GATConv(f, HIDDEN // HEADS, heads=HEADS, add_self_loops=False)
      self.conv2 = pyg_nn.GATConv(HIDDEN, c, heads=1, concat=False, add_self_loops=False)

    def forward(self, x, g):
      return self.conv2(torch.nn.functional.elu(self.conv1(x, g)), g)

  variants = {"pyg_ms": ei}
  if model_name == "gat":
    variants = {"pyg_ms": add_self_loops(ei, num_nodes=n)[0]}
  else:
    # adj_t: rows = targets (PyG's transposed-adjacency convention), cuSPARSE via torch.sparse
    adj = (
      torch.sparse_coo_tensor(
        torch.stack([ei[1], ei[0]]), torch.ones(ei.shape[1], device=dev), (n, n)
      )
      .coalesce()
      .to_sparse_csr()
    )
    variants["pyg_csr_ms"] = adj
  for key, g in variants.items():
    model = (GCN() if model_name == "gcn" else GAT()).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def step():
      opt.zero_grad(set_to_none=True)
      loss = torch.nn.functional.cross_entropy(model(tx, g), ty)
      loss.backward()
      opt.step()

    try:
      out[key] = common.time_torch(step, warmup=2, repeat=repeat)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory
      print(f"    {key} failed: {str(e).splitlines()[0][:100]}", flush=True)
      out[key] = "OOM" if "out of memory" in str(e).lower() else "fail"
    del model, opt
    torch.cuda.empty_cache()
  del tx, ty, ei, variants
  torch.cuda.empty_cache()
  return out


def _graphs(quick):
  names = common.real_graph_names()
  graphs = {}
  if names:  # the largest real graph
    sizes = {nm: common.package_graph(nm) for nm in names}
    big = max(sizes, key=lambda nm: sizes[nm].nnz)
    graphs[big] = sizes[big]
  if quick:
    graphs["rmat14-d8"] = common.rmat(14, 8)
  else:
    graphs["rmat20-d16"] = common.rmat(20, 16)
  return graphs


def run(quick: bool = False) -> list[dict]:
  import jax

  rng = np.random.default_rng(0)
  rows = []
  for name, g in _graphs(quick).items():
    n = g.shape[0]
    x, y, c, edge_index = _graph_inputs(name, g, rng)
    repeat = 10 if g.nnz > 2_000_000 else 30
    for model_name in ("gcn", "gat"):
      print(f"  {name} {model_name}", flush=True)
      row = dict(graph=name, nodes=n, edges=int(edge_index.shape[1]), model=model_name)
      # PyG first, then free its cache: JAX (no preallocation) then grows into the memory.
      row.update(_pyg_times(model_name, x, y, c, edge_index, n, repeat))
      lib_step, xla_step, largs, xargs, (lib_loss, xla_loss) = _jax_steps(
        model_name, x, y, c, edge_index, n
      )
      row["lib_ms"] = _time_jax(lib_step, largs, repeat)
      try:
        l1 = float(lib_loss(largs[0], *largs[2:]))
        l2 = float(xla_loss(xargs[0], *xargs[2:]))
        row["loss_err"] = f"{abs(l1 - l2) / abs(l2):.1e}"
      except Exception as e:  # noqa: BLE001
        print(f"    loss check failed: {str(e).splitlines()[0][:100]}", flush=True)
      row["xla_ms"] = _time_jax(xla_step, xargs, repeat)
      # Wall time per step (above) is the measure; on a small graph it is the host's
      # dispatch for both. The device time shows the kernels' share.
      row["lib_dev_ms"] = _device_ms(lib_step, largs, row["lib_ms"])
      row["xla_dev_ms"] = _device_ms(xla_step, xargs, row["xla_ms"])
      if row["lib_dev_ms"] and row["xla_dev_ms"]:
        row["dev_vs_xla"] = row["xla_dev_ms"] / row["lib_dev_ms"]
      del lib_step, xla_step, largs, xargs
      jax.clear_caches()
      lib = row["lib_ms"]
      if isinstance(lib, float):
        if isinstance(row["xla_ms"], float):
          row["x_vs_xla"] = row["xla_ms"] / lib
        pygs = [row[k] for k in ("pyg_ms", "pyg_csr_ms") if isinstance(row.get(k), float)]
        if pygs:
          row["x_vs_pyg"] = min(pygs) / lib  # against PyG's faster variant
      print("   ", {k: row.get(k) for k in COLUMNS[4:]}, flush=True)
      rows.append(row)
  return rows


def summary(rows: list[dict]) -> list[dict]:
  out = []
  for model in ("gcn", "gat"):
    sel = [r for r in rows if r["model"] == model]
    out.append(
      {
        "model": model,
        "graphs": len(sel),
        "geomean_vs_xla": common.geomean([r.get("x_vs_xla") for r in sel]),
        "geomean_vs_pyg": common.geomean([r.get("x_vs_pyg") for r in sel]),
        "min_vs_xla": min((r["x_vs_xla"] for r in sel if "x_vs_xla" in r), default=None),
        "min_vs_pyg": min((r["x_vs_pyg"] for r in sel if "x_vs_pyg" in r), default=None),
        "target_vs_xla": 2.0,
        "target_vs_pyg": 1.5,
      }
    )
  return out


if __name__ == "__main__":
  common.main(sys.modules[__name__])
