"""Several processes (hosts) in one JAX distributed runtime (`jax.distributed.initialize`): which
shards of a mesh axis this process holds, the agreement of the build's small global metadata
across processes, global arrays from this process's shards, and data-parallel batches.

A ShardedMatrix built by `shard_coo_local` holds, in each process, only the shards of its own
devices; what every shard's layout must agree on (row blocks, padded sizes, halo size, the
exchange) is reduced across processes here as small integer vectors (an element-wise maximum
through `multihost_utils.process_allgather`), and the halo's send lists (which rows each shard
sends to each other) go to their senders by one `all_to_all` on the mesh itself."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class BuildScope:
  """The shards one build makes (`shards`, consecutive positions along the mesh axis, of
  `num_shards`) and whether other processes build the rest (`multiprocess`): then every
  process's build calls `agree_max` in the same order."""

  shards: range
  num_shards: int
  multiprocess: bool = False

  @property
  def whole(self) -> bool:
    return len(self.shards) == self.num_shards

  def agree_max(self, values) -> np.ndarray:
    """The element-wise maximum over processes of int values (same shape everywhere), int64."""
    v = np.asarray(values, np.int64)
    if not self.multiprocess:
      return v
    if v.size and (v.min() < -_INT32_MAX or v.max() > _INT32_MAX):
      raise ValueError(
        f"the build's metadata holds a value past int32 ({int(v.min())} .. {int(v.max())}): "
        "shards this large cannot be built"
      )
    gathered = multihost_utils.process_allgather(v.astype(np.int32))
    return np.asarray(gathered, np.int64).reshape((-1,) + v.shape).max(axis=0)

  def agree_all(self, flags) -> np.ndarray:
    """The element-wise AND over processes of booleans."""
    return -self.agree_max(-np.asarray(flags, np.int64)) > 0


def whole_scope(num_shards: int) -> BuildScope:
  return BuildScope(range(num_shards), num_shards)


def local_shards(mesh: Mesh | None = None, axis: str | None = None) -> range:
  """The positions along the mesh axis `axis` (default: the first of `mesh`, default
  `make_mesh()`) that hold a device of this process: consecutive (each process's rows are one
  contiguous range), at least one; all of them in a single-process run."""
  if mesh is None:
    from jaxsparse_tc._src.distributed.mesh import make_mesh

    mesh = make_mesh()
  axis = mesh.axis_names[0] if axis is None else axis
  if axis not in mesh.axis_names:
    raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
  devs = np.moveaxis(np.asarray(mesh.devices), mesh.axis_names.index(axis), 0)
  devs = devs.reshape(devs.shape[0], -1)
  here = jax.process_index()
  mine = [p for p in range(devs.shape[0]) if any(d.process_index == here for d in devs[p])]
  if not mine:
    raise ValueError(
      f"process {here} has no device on the mesh axis {axis!r} ({devs.shape[0]} shards): every "
      "process of the run builds its own shards, so each needs devices on the mesh"
    )
  if mine != list(range(mine[0], mine[-1] + 1)):
    raise ValueError(
      f"the devices of process {here} sit at shards {mine} of the mesh axis {axis!r}, not "
      "consecutive ones: build the mesh over jax.devices() in their order (make_mesh() does), so "
      "that each process holds one contiguous block of rows"
    )
  return range(mine[0], mine[-1] + 1)


def process_scope(mesh: Mesh, axis: str) -> BuildScope:
  P = int(mesh.shape[axis])
  return BuildScope(local_shards(mesh, axis), P, jax.process_count() > 1)


def local_row_range(
  num_nodes: int, mesh: Mesh | None = None, axis_name: str | None = None, *, bounds=None
):
  """(start, stop): the rows this process loads for `shard_coo_local`. With `bounds` (global row
  blocks [P + 1]): its shards' blocks. Else the rows cut evenly by count over the shards of the
  mesh axis (shard p's share: rows p*n//P .. (p+1)*n//P), this process's shards' shares
  together; shard_coo_local then balances this process's own shards by nonzeros."""
  from jaxsparse_tc._src.distributed.mesh import make_mesh
  from jaxsparse_tc._src.distributed.partition import check_bounds

  mesh = make_mesh() if mesh is None else mesh
  axis = mesh.axis_names[0] if axis_name is None else axis_name
  if axis not in mesh.axis_names:
    raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
  n = int(num_nodes)
  if n < 0:
    raise ValueError(f"num_nodes must be >= 0; got {num_nodes}")
  shards = local_shards(mesh, axis)
  P = int(mesh.shape[axis])
  if bounds is not None:
    b = check_bounds(bounds, n, P)
    return int(b[shards.start]), int(b[shards.stop])
  return shards.start * n // P, shards.stop * n // P


def global_array(local: np.ndarray, mesh: Mesh, spec: PartitionSpec, dim: int, scope: BuildScope):
  """The global array whose axis `dim` is cut into scope.num_shards blocks along `spec`, from
  this process's blocks (`local`: the blocks of scope.shards, one after the other on `dim`)."""
  sharding = NamedSharding(mesh, spec)
  if scope.whole:
    return jax.device_put(local, sharding)
  k = local.shape[dim] // len(scope.shards)
  total = scope.num_shards * k
  shape = local.shape[:dim] + (total,) + local.shape[dim + 1 :]
  offset = scope.shards.start * k

  def block(index):
    index = list(index)
    start, stop, _ = index[dim].indices(total)
    index[dim] = slice(start - offset, stop - offset)
    return local[tuple(index)]

  return jax.make_array_from_callback(shape, sharding, block)


def transpose_send_lists(recv_rows: np.ndarray, mesh: Mesh, axis: str, scope: BuildScope, halo):
  """The halo's send lists of this process's shards from their receive lists: recv_rows
  [len(shards), P * c] (row p: at q * c + j the local row of shard q that p reads j-th) to
  send [len(shards), P * c] (row q: at p * c + j that same row), by one all_to_all on the mesh."""
  from jaxsparse_tc._src.distributed.ops import shard_map_compat

  P = scope.num_shards
  spec = PartitionSpec(axis)
  recv = global_array(np.ascontiguousarray(recv_rows, np.int32), mesh, spec, 0, scope)

  def body(x):  # [1, P * c]: chunk q goes to shard q; what shard p sent lands in chunk p
    y = jax.lax.all_to_all(x.reshape(P, halo), axis, 0, 0, tiled=True)
    return y.reshape(1, P * halo)

  send = jax.jit(shard_map_compat(body, mesh, spec, spec))(recv)
  out = np.zeros_like(recv_rows, dtype=np.int32)
  for s in send.addressable_shards:
    p = s.index[0].indices(P)[0]
    out[p - scope.shards.start] = np.asarray(s.data)[0]
  return out


def stack_batches(batches, mesh: Mesh, axis_name: str | None = None):
  """Data parallelism over a mesh axis: this process's batches (a sequence of equal pytrees,
  one per shard of the axis that holds one of its devices, in mesh order; e.g. the padded
  `sampling.SampledBatch`es) stacked into global arrays [P, ...], sharded along the axis. A
  `shard_map` over the mesh then gives each device its own batch (leading axis 1), and a
  `lax.pmean` over the axis averages the gradients of all processes."""
  axis = mesh.axis_names[0] if axis_name is None else axis_name
  if axis not in mesh.axis_names:
    raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
  scope = process_scope(mesh, axis)
  batches = list(batches)
  if len(batches) != len(scope.shards):
    raise ValueError(
      f"stack_batches: this process holds shards {scope.shards.start} .. "
      f"{scope.shards.stop - 1} of the mesh axis {axis!r}, so it takes {len(scope.shards)} "
      f"batches (one per shard); got {len(batches)}"
    )
  flat = [jax.tree_util.tree_flatten(b) for b in batches]
  leaves0, tree = flat[0]
  for j, (leaves, t) in enumerate(flat):
    if t != tree:
      raise ValueError(f"stack_batches: batch {j}'s structure differs from batch 0's: {t}")
    for i, (leaf, first) in enumerate(zip(leaves, leaves0)):
      if np.shape(leaf) != np.shape(first):
        raise ValueError(
          f"stack_batches: leaf {i} of batch {j} has shape {np.shape(leaf)}, batch 0's "
          f"{np.shape(first)}: the batches must have equal shapes (pad them)"
        )
  stacked = [np.stack([np.asarray(f[0][i]) for f in flat]) for i in range(len(leaves0))]
  spec = PartitionSpec(axis)
  return jax.tree_util.tree_unflatten(
    tree, [global_array(a, mesh, spec, 0, scope) for a in stacked]
  )
