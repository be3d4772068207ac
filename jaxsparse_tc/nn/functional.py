"""The layers' math as pure functions of arrays, shared by the Flax and Equinox modules.

Every function takes a message-passing matrix `A` (rows = targets, columns = sources; see
`jaxsparse_tc.nn.graph`) and node features `x` [n, f], plus the layer's parameters as arrays.
Weights are stored [in, out] (`x @ kernel`). `attn_dropout`, where taken, is None (no dropout)
or a function applied to the attention coefficients ([H, nnz], format order).

Only the library's operators touch the graph: `spmm`, `sddmm`, `edge_softmax`,
`sparse_attention`. Gathers by `A.rows` / `A.cols` build per-edge logits from per-node scores.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

import jaxsparse_tc as jst
from jaxsparse_tc.sparse_matrix import SparseMatrix

Dropout = Optional[Callable[[jax.Array], jax.Array]]


def _edge_softmax(S: SparseMatrix) -> SparseMatrix:
  return jst.edge_softmax(S)


def _split_heads(h: jax.Array, heads: int) -> jax.Array:
  """[n, H*C] -> [H, n, C]."""
  n = h.shape[0]
  return jnp.transpose(h.reshape(n, heads, -1), (1, 0, 2))


def _merge_heads(out: jax.Array, concat: bool) -> jax.Array:
  """[H, n, C] -> [n, H*C] (concat) or [n, C] (mean over heads)."""
  if concat:
    h, n, c = out.shape
    return jnp.transpose(out, (1, 0, 2)).reshape(n, h * c)
  return jnp.mean(out, axis=0)


def gcn_conv(A: SparseMatrix, x, kernel, bias=None):
  """GCN (Kipf & Welling): A @ (x @ kernel) + bias, A = D^-1/2 (A+I) D^-1/2 (`graph.gcn_norm`).

  The smaller of the two feature widths is the one propagated (same result, cheaper SpMM); at
  equal widths x is propagated first, so that where x needs no gradient (input features) the
  backward needs no SpMM at all: the gradient of `kernel` is (A x)^T g.
  """
  x = jnp.asarray(x)
  if kernel.shape[0] <= kernel.shape[1]:
    out = jst.spmm(A, x) @ kernel
  else:
    out = jst.spmm(A, x @ kernel)
  return out if bias is None else out + bias


def gat_conv(A: SparseMatrix, x, kernel, att_src, att_dst, bias=None, *, heads: int,
             concat: bool = True, negative_slope: float = 0.2, attn_dropout: Dropout = None):
  """GAT (Velickovic et al.), PyG's GATConv: multi-head additive attention over A's edges.

  h = x @ kernel viewed [n, H, C]; e_ij = leaky_relu(<att_dst_h, h_i> + <att_src_h, h_j>) for
  each edge j -> i (A[i, j] != 0); alpha = row softmax of e (edge_softmax); out_i = sum_j
  alpha_ij h_j, heads concatenated [n, H*C] or averaged [n, C]; plus bias. att_src, att_dst:
  [H, C]. A's pattern should hold self-loops (`message_passing_matrix(..., self_loops=True)`);
  its values are ignored.
  """
  h = _split_heads(jnp.asarray(x) @ kernel, heads)                 # [H, n, C]
  a_src = jnp.einsum("hnc,hc->hn", h, att_src)                     # [H, n]
  a_dst = jnp.einsum("hnc,hc->hn", h, att_dst)
  logits = a_dst[:, A.rows] + a_src[:, A.cols]                     # [H, nnz]
  logits = jax.nn.leaky_relu(logits, negative_slope)
  S = _edge_softmax(A.with_values(logits))
  if attn_dropout is not None:
    S = S.with_values(attn_dropout(S.values))
  out = _merge_heads(jst.spmm(S, h.astype(S.dtype)), concat)
  return out if bias is None else out + bias


def agnn_conv(A: SparseMatrix, x, beta):
  """AGNN (Thekumparampil et al.), PyG's AGNNConv: out_i = sum_j softmax_j(beta cos(x_i, x_j)) x_j.

  Cosine similarities come from one SDDMM of the L2-normalized features; `beta` is a scalar
  (a parameter or a constant). A's pattern should hold self-loops; its values are ignored.
  """
  x = jnp.asarray(x)
  norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
  xn = x / jnp.maximum(norm, 1e-12)
  cos = jst.sddmm(A, xn, xn)
  S = _edge_softmax(cos.with_values(jnp.asarray(beta, cos.dtype) * cos.values))
  return jst.spmm(S, x)


def multihead_attention(A: SparseMatrix, q, k, v, *, scale: float, bias=None,
                        attn_dropout: Dropout = None):
  """softmax_row(mask_A(scale q k^T + bias)) @ v for q, k, v [H, n, C] -> [H, n, C].

  Without dropout this is the fused `sparse_attention`; with dropout on the coefficients (or
  in a build without `sparse_attention`) it is sddmm -> edge_softmax -> dropout -> spmm.
  """
  if attn_dropout is None and hasattr(jst, "sparse_attention"):
    return jst.sparse_attention(A, q, k, v, scale=scale, bias=bias)
  logits = jst.sddmm(A, q, k).values * scale
  if bias is not None:
    logits = logits + bias
  S = _edge_softmax(A.with_values(logits))
  if attn_dropout is not None:
    S = S.with_values(attn_dropout(S.values))
  return jst.spmm(S, v)


def transformer_conv(A: SparseMatrix, x, query, key, value, skip=None, beta_kernel=None, *,
                     heads: int, concat: bool = True, attn_dropout: Dropout = None):
  """Graph transformer convolution (Shi et al.), PyG's TransformerConv.

  `query`, `key`, `value`: (kernel [f, H*C], bias [H*C] or None) pairs. alpha_ij = row softmax over
  A's edges j -> i of <q_i, k_j> / sqrt(C); out_i = sum_j alpha_ij v_j, heads concatenated or
  averaged. `skip` = (kernel, bias or None) adds the root weight x_i @ W_skip (+ b); with
  `beta_kernel` [3 * out, 1] the skip is gated: b = sigmoid([out, r, out - r] @ beta_kernel),
  out = b r + (1 - b) out. A's values are ignored (its pattern is the attention mask).
  """
  x = jnp.asarray(x)
  lin = lambda p: x @ p[0] if p[1] is None else x @ p[0] + p[1]  # noqa: E731
  q, k, v = (_split_heads(lin(p), heads) for p in (query, key, value))
  scale = 1.0 / math.sqrt(q.shape[-1])
  out = _merge_heads(multihead_attention(A, q, k, v, scale=scale, attn_dropout=attn_dropout),
                     concat)
  if skip is not None:
    r = lin(skip)
    if beta_kernel is not None:
      gate = jax.nn.sigmoid(jnp.concatenate([out, r, out - r], axis=-1) @ beta_kernel)
      out = gate * r + (1 - gate) * out
    else:
      out = out + r
  return out
