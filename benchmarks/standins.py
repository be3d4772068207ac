"""Stand-ins for dense-community graphs, calibrated to their block statistics.

The TU IMDB sets (imdb-binary, imdb-multi of ../shared/data) are disjoint unions of movie
collaboration ego-networks: each member graph has an ego joined to everyone (every one of their
graphs has such a node) and is the union of a few cliques (the movies, each holding the ego),
actors sometimes in two of them; nodes are numbered graph by graph, in no order inside a graph.
`dense_communities` draws that: ego-network sizes from a shifted log-normal, a movie count per
ego-network, each actor in one movie and with probability `overlap` in a second, then a fraction
`noise` of the edges rewired to random far nodes (large collaboration graphs are not a disjoint
union: the far edges are what spreads a window's columns). Degree alone does not fix what the
tensor-core kernels see (a degree-matched "communities" graph predicted a win a real dense
graph did not give), so the presets below are fitted to the real graphs' nonzeros per 8x8 block,
distinct columns per 8-row window and row-length spread (benchmarks/block_stats_table.py prints
them side by side; tests/test_benchmark_graphs.py holds them to it).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import scipy.sparse as sp


@dataclasses.dataclass(frozen=True)
class EgoShape:
  """The shape of one class of ego-networks: sizes `min_size + lognormal(log(median_excess),
  sigma)` (capped at `max_size`), movies of about `cast` actors besides the ego on average, their
  casts uneven (an actor picks a movie with probability proportional to a Gamma(`cast_shape`)
  weight: 1 is exponential, larger is more even), each actor in a second movie with probability
  `overlap`, a network's movie count Poisson around (size - 1) / cast, its mean scaled by a
  Gamma(`movie_shape`) factor of mean 1 where `movie_shape` > 0 (smaller: more networks that are
  one clique and more of many small movies), and a fraction `noise` of edges rewired to random
  nodes."""

  min_size: int
  median_excess: float
  sigma: float
  cast: float
  overlap: float
  cast_shape: float = 1.0
  movie_shape: float = 0.0
  noise: float = 0.0
  max_size: int = 4096


# Fitted by hand against block_stats_table's figures (caller's order and affinity order).
PRESETS = {
  # imdb-binary: 19.8k nodes in 1000 ego-networks (12..136 nodes, median 17), 193k edges.
  "imdb": EgoShape(
    min_size=12,
    median_excess=5.0,
    sigma=1.1,
    cast=4.0,
    overlap=0.2,
    cast_shape=4.0,
    movie_shape=2.0,
    max_size=136,
  ),
  # imdb-multi: 19.5k nodes in 1500 ego-networks (7..89 nodes, median 10), 198k edges; over
  # half of them a single movie.
  "imdbm": EgoShape(
    min_size=7,
    median_excess=3.5,
    sigma=1.1,
    cast=4.0,
    overlap=0.25,
    cast_shape=1.0,
    movie_shape=1.0,
    max_size=89,
  ),
  # The held-back large collaboration graph (24.6M edges): 36 nonzeros per block, ~113 columns
  # per window. Networks of ~65 nodes, mostly one or two movies, 6% of edges rewired far.
  "large": EgoShape(
    min_size=40,
    median_excess=25.0,
    sigma=0.6,
    cast=60.0,
    overlap=0.5,
    cast_shape=4.0,
    movie_shape=2.0,
    noise=0.06,
  ),
}


def _sizes(shape: EgoShape, count: int, rng) -> np.ndarray:
  excess = rng.lognormal(np.log(shape.median_excess), shape.sigma, count)
  return np.minimum(shape.min_size + np.floor(excess).astype(np.int64), shape.max_size)


def _ego_memberships(shape: EgoShape, sizes: np.ndarray, rng):
  """(node, movie) pairs of the ego-networks of `sizes` numbered consecutively, nodes shuffled
  inside each network; the ego is in every movie of its network."""
  nets = sizes.size
  first = np.zeros(nets + 1, np.int64)
  np.cumsum(sizes, out=first[1:])
  n = int(first[-1])
  # Movies per network: about (size - 1) / cast, at least one.
  mean_movies = np.maximum(sizes - 1, 0) / shape.cast
  if shape.movie_shape > 0:
    mean_movies = mean_movies * rng.gamma(shape.movie_shape, 1.0 / shape.movie_shape, nets)
  movies = np.maximum(1, rng.poisson(mean_movies))
  movies = np.minimum(movies, np.maximum(sizes - 1, 1))
  movie0 = np.zeros(nets + 1, np.int64)
  np.cumsum(movies, out=movie0[1:])
  net_of = np.repeat(np.arange(nets), sizes)
  local = np.arange(n) - first[net_of]
  actors = local > 0  # local 0 is the ego
  a_net = net_of[actors]
  # An actor's movie: by Gamma weights, through the cumulative weights of its network's movies.
  weight = np.cumsum(rng.gamma(shape.cast_shape, 1.0, int(movie0[-1])))
  before = np.r_[0.0, weight][movie0]
  span = before[1:] - before[:-1]

  def pick():
    u = before[a_net] + rng.random(a_net.size) * span[a_net]
    movie = np.searchsorted(weight, u, side="right")
    return np.minimum(movie, movie0[a_net + 1] - 1)  # rounding at a network's last movie

  node_ids = np.arange(n)[actors]
  extra = rng.random(a_net.size) < shape.overlap
  node = np.concatenate([node_ids, node_ids[extra]])
  movie = np.concatenate([pick(), pick()[extra]])
  ego_movies = np.arange(movie0[-1])
  ego_net = np.repeat(np.arange(nets), movies)
  node = np.concatenate([node, first[ego_net]])
  movie = np.concatenate([movie, ego_movies])
  # Shuffle node ids inside each network (the TU files list a network's nodes in no order).
  key = net_of + rng.random(n)
  perm = np.empty(n, np.int64)
  perm[np.argsort(key, kind="stable")] = np.arange(n)
  return perm[node], movie, n


def _clique_edges(node: np.ndarray, movie: np.ndarray):
  """Both directions of every pair of distinct nodes sharing a movie (with duplicates)."""
  order = np.argsort(movie, kind="stable")
  node, movie = node[order], movie[order]
  starts = np.flatnonzero(np.r_[True, movie[1:] != movie[:-1]])
  counts = np.diff(np.r_[starts, movie.size])
  size_of = np.repeat(counts, counts)  # each membership's movie size
  start_of = np.repeat(starts, counts)
  src = np.repeat(np.arange(node.size), size_of)
  offset = np.arange(src.size) - np.repeat(np.cumsum(size_of) - size_of, size_of)
  dst = start_of[src] + offset
  r, c = node[src], node[dst]
  keep = r != c
  return r[keep], c[keep]


def dense_communities(
  edges: int, shape: EgoShape | str = "imdb", seed: int = 0, net_order: str = "listed"
) -> sp.csr_matrix:
  """A symmetric graph of dense ego-networks (`shape`: an EgoShape or a PRESETS name) with about
  `edges` stored nonzeros (both directions; within a few percent), no self loops, values uniform
  in [0.5, 1.5). Networks are numbered consecutively as the TU files list them
  (`net_order="listed"`); `"random"` permutes all node ids (only a reordering finds the blocks).
  Deterministic for its arguments; ~0.5 s per million edges (22 s for 24.6M on a shared 2-core
  machine), host memory ~150 bytes per edge at the peak."""
  if isinstance(shape, str):
    if shape not in PRESETS:
      raise ValueError(f"dense_communities: shape must be one of {sorted(PRESETS)}; got {shape!r}")
    shape = PRESETS[shape]
  if edges < 1000:
    raise ValueError(f"dense_communities: edges must be at least 1000; got {edges}")
  if net_order not in ("listed", "random"):
    raise ValueError(
      f"dense_communities: net_order must be 'listed' or 'random'; got {net_order!r}"
    )
  rng = np.random.default_rng(seed)
  # Edges per network grow as size^2: a rough count from a pilot draw of sizes (a network of
  # more movies than (1 + size / cast) is sparser), drawn again twice as large while short.
  pilot = _sizes(shape, 4096, rng).astype(np.float64)
  per_net = float(np.mean(pilot * (pilot - 1))) * min(1.0, 2.0 / (1.0 + pilot.mean() / shape.cast))
  count = int(1.3 * edges / max(per_net, 1.0)) + 16
  while True:
    sizes = _sizes(shape, count, rng)
    node, movie, n = _ego_memberships(shape, sizes, rng)
    r, c = _clique_edges(node, movie)
    key = r * n + c
    key.sort()  # sort + neighbour test: numpy's unique (hashing) is several times slower here
    key = key[np.r_[True, key[1:] != key[:-1]]]
    if key.size >= edges or count > 64 * edges:
      break
    count *= 2
  # Keep the whole networks, in order, whose edge count is nearest `edges` (the noise rewiring
  # keeps the count).
  r, c = key // n, key % n
  first = np.zeros(sizes.size + 1, np.int64)
  np.cumsum(sizes, out=first[1:])
  per_net = np.bincount(np.searchsorted(first, r, side="right") - 1, minlength=sizes.size)
  nets = int(np.argmin(np.abs(np.cumsum(per_net) - edges))) + 1
  n = int(first[nets])
  keep = r < n
  r, c = r[keep], c[keep]
  if shape.noise > 0:
    # Rewire one direction of a fraction of the pairs to random far nodes, then symmetrize.
    upper = r < c
    r, c = r[upper], c[upper]
    far = rng.random(r.size) < shape.noise
    c = c.copy()
    c[far] = rng.integers(0, n, int(far.sum()))
    ok = r != c
    r, c = np.concatenate([r[ok], c[ok]]), np.concatenate([c[ok], r[ok]])
  if net_order == "random":
    perm = rng.permutation(n)
    r, c = perm[r], perm[c]
  m = sp.coo_matrix((np.ones(r.size, np.float32), (r, c)), shape=(n, n)).tocsr()
  m.sum_duplicates()
  m.sort_indices()
  m.data = rng.uniform(0.5, 1.5, m.nnz).astype(np.float32)
  return m


_SUFFIX = {"k": 10**3, "M": 10**6}
DENSE_NAME = re.compile(r"dense(\d+(?:\.\d+)?)([kM])-(" + "|".join(PRESETS) + r")(-rand)?")


def parse_dense_name(name: str):
  """(edges, preset, net_order) of a name `dense{E}{k|M}-{preset}[-rand]` (e.g. dense200k-imdb,
  dense24.6M-large, dense4M-imdbm-rand), or None for any other name."""
  hit = DENSE_NAME.fullmatch(name)
  if not hit:
    return None
  edges = int(round(float(hit.group(1)) * _SUFFIX[hit.group(2)]))
  return edges, hit.group(3), "random" if hit.group(4) else "listed"


def dense_graph(name: str):
  """The stand-in of a `dense...` name (parse_dense_name), or None for any other name."""
  parsed = parse_dense_name(name)
  if parsed is None:
    return None
  edges, preset, order = parsed
  return dense_communities(edges, preset, net_order=order)
