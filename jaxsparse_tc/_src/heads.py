"""The head axis every primitive carries, and vmap folded into it.

Primitives see dense operands as [H_i, ...] with H_i in {1, H}: 1 broadcasts over the heads.
A vmapped operand's batch axis is merged into that head axis, so a batch never becomes a
Python loop: the kernels run all heads in one launch.
"""

from __future__ import annotations

import jax.numpy as jnp


def num_heads(*head_sizes: int) -> int:
  h = max(head_sizes)
  if any(s not in (1, h) for s in head_sizes):
    raise ValueError(f"head counts {head_sizes} do not broadcast")
  return h


def merge_batch_into_heads(operands, dims, size):
  """Folds a vmap axis into the leading head axis of each operand.

  Returns the new operands (head axis B*H, or 1 where an unbatched operand broadcasts) and H.
  """
  mapped = [d is not None for d in dims]
  moved = [jnp.moveaxis(x, d, 0) if m else x for x, d, m in zip(operands, dims, mapped)]
  heads = num_heads(*(x.shape[1] if m else x.shape[0] for x, m in zip(moved, mapped)))
  merged = []
  for x, m in zip(moved, mapped):
    if not m:
      if x.shape[0] == 1:
        merged.append(x)
        continue
      x = jnp.broadcast_to(x[None], (size,) + x.shape)
    elif x.shape[1] != heads:
      x = jnp.broadcast_to(x, (size, heads) + x.shape[2:])
    merged.append(x.reshape((size * heads,) + x.shape[2:]))
  return merged, heads


def sum_to_heads(x, head_count: int):
  """Reduces a [H, ...] cotangent to an operand that had `head_count` (1 or H) heads."""
  if head_count == 1 and x.shape[0] != 1:
    return jnp.sum(x, axis=0, keepdims=True)
  return x
