"""Position information: T5's relative position bias, sinusoidal and learned tables, RoPE.

T5 adds a learned per-head bias to the attention logits, indexed by a bucketed query-key distance;
the others are absolute encodings added to the embeddings (sinusoidal, learned) or rotations of
queries and keys (RoPE). Absolute ones read the `*_positions` feature of packed data so that each
segment restarts at 0.
"""

import dataclasses
import functools
import math

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig
from t5lite.models.layers import param


@functools.cache
def bucket_thresholds(num_buckets: int, max_distance: int) -> tuple[int, ...]:
  """The smallest distance of each logarithmic bucket of one direction, in integers.

  T5 puts a distance d >= max_exact = num_buckets // 2 in bucket
  max_exact + floor(log(d / max_exact) / log(max_distance / max_exact) * (num_buckets - max_exact))
  (capped at num_buckets - 1), so d reaches bucket max_exact + k exactly when
  (d / max_exact) ** m >= (max_distance / max_exact) ** k with m = num_buckets - max_exact, i.e.
  d**m * max_exact**k >= max_distance**k * max_exact**m: integers, decided without a float `log`
  (whose last bit differs between backends at distances that land on a boundary, such as 16, 32
  and 64 for 32 buckets and 128). E.g. 16 buckets, 128: (12, 16, 23, 32, 46, 64, 91).
  """
  max_exact = num_buckets // 2
  m = num_buckets - max_exact
  thresholds = []
  for k in range(1, m):
    low, high = max_exact, max(max_distance, max_exact)  # high always qualifies
    while low < high:  # the smallest qualifying distance, by bisection
      middle = (low + high) // 2
      if middle**m * max_exact**k >= max_distance**k * max_exact**m:
        high = middle
      else:
        low = middle + 1
    thresholds.append(low)
  return tuple(thresholds)


def relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
  """Mesh TensorFlow's bucketing of `memory_position - query_position` into [0, num_buckets).

  Half the buckets (per direction when bidirectional) hold exact distances, the rest grow
  logarithmically up to max_distance; beyond it all distances share the last bucket. Causal
  stacks put every future position in bucket 0. E.g. bidirectional, 32 buckets, 128:
  -1 -> 1, 1 -> 17, 8 -> 24, 200 -> 31. Integer comparisons with `bucket_thresholds`, the same
  bits on every backend and in every kernel (tests/models/test_positions.py checks them against
  transformers' for every distance up to 65,536).
  """
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets = buckets + (relative_position > 0).astype(relative_position.dtype) * num_buckets
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  logarithmic = num_buckets // 2  # max_exact, plus one per threshold reached
  for threshold in bucket_thresholds(num_buckets, max_distance):
    logarithmic = logarithmic + (distance >= threshold).astype(distance.dtype)
  return buckets + jnp.where(distance < num_buckets // 2, distance, logarithmic)


@dataclasses.dataclass(frozen=True)
class RelativeBuckets:
  """A stack's bucketing of distances: `relative_position_bucket` with its settings."""
  bidirectional: bool
  num_buckets: int
  max_distance: int

  def __call__(self, relative_position: jax.Array) -> jax.Array:
    return relative_position_bucket(relative_position, bidirectional=self.bidirectional,
                                    num_buckets=self.num_buckets, max_distance=self.max_distance)


@functools.partial(jax.tree_util.register_dataclass, data_fields=['table'],
                   meta_fields=['buckets'])
@dataclasses.dataclass(frozen=True)
class BucketedBias:
  """T5's bias as its table and bucketing: what the flash kernel reads (models/flash_attention.py
  computes each (q, k) entry itself), and what `dense` expands for the other kernels."""
  table: jax.Array  # (buckets, heads)
  buckets: RelativeBuckets

  def dense(self, query_length: int, key_length: int,
            query_offset: int | jax.Array = 0) -> jax.Array:
    """Float32 bias of shape (1, heads, query_length, key_length): queries at positions
    query_offset, query_offset + 1, ... (a decoding step's place in its cache), keys at 0, 1, ..."""
    query_positions = query_offset + jnp.arange(query_length)
    relative = jnp.arange(key_length)[None, :] - query_positions[:, None]  # (q, k)
    # A one-hot matmul, not a gather: a gather's gradient is a scatter-add, which XLA's GPU
    # backend sums with atomics in no fixed order, so that runs (and resumes) differed in the
    # table's last bits on an H100. HIGHEST keeps float32 matmuls off TF32: each value exact.
    one_hot = jax.nn.one_hot(self.buckets(relative), self.buckets.num_buckets,
                             dtype=jnp.float32)  # (q, k, buckets)
    return jnp.einsum('qkn,nh->hqk', one_hot, self.table.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)[None]  # (1, h, q, k)


class RelativePositionBias(nnx.Module):
  """T5's per-head bias table, computed once per stack and shared by all its layers."""

  def __init__(self, cfg: ModelConfig, *, bidirectional: bool, rngs: nnx.Rngs):
    self.buckets = RelativeBuckets(bidirectional, cfg.relative_buckets, cfg.relative_max_distance)
    self.embedding = param(rngs, jax.nn.initializers.normal(cfg.d_model**-0.5),
                           (cfg.relative_buckets, cfg.num_heads), ('relpos_buckets', 'heads'), cfg)

  def __call__(self, query_length: int, key_length: int,
               query_offset: int | jax.Array = 0) -> jax.Array:
    """The dense (1, heads, q, k) float32 bias (BucketedBias.dense)."""
    return self.bucketed().dense(query_length, key_length, query_offset)

  def bucketed(self) -> BucketedBias:
    return BucketedBias(self.embedding[...], self.buckets)


def sinusoidal_positions(positions: jax.Array, features: int) -> jax.Array:
  """Vaswani et al.'s fixed encoding, sines in the first half of features and cosines in the second.

  positions: (b, l) integers -> (b, l, features) float32.
  """
  half = features // 2
  inv_timescale = jnp.exp(-math.log(10_000.0) * jnp.arange(half) / max(half - 1, 1))  # (half,)
  angles = positions.astype(jnp.float32)[..., None] * inv_timescale  # (b, l, 1) * (half,)
  encoding = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # (b, l, 2 * half)
  return jnp.pad(encoding, ((0, 0), (0, 0), (0, features - 2 * half)))  # odd features: one zero


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
  """Rotates each (i, i + d/2) pair of a head's features by position * base**(-2i/d) (GPT-NeoX).

  x: (b, l, h, d), positions: (b, l) -> (b, l, h, d) in x's dtype.
  """
  half = x.shape[-1] // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)  # (d/2,)
  angles = positions.astype(jnp.float32)[..., None, None] * inv_freq  # (b, l, 1, 1) * (d/2,)
  sin, cos = jnp.sin(angles), jnp.cos(angles)  # (b, l, 1, d/2)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # (b, l, h, d) -> 2 x (b, l, h, d/2)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)
