"""What every flash attention kernel computes per tile, written once for both backends.

A tile is a block of queries (rows) by a block of keys (columns). Who sees whom, which tiles a
block of queries (or keys) reads at all, and how the inputs are padded to whole tiles are the
same rules for the Triton kernels (flash_triton.py) and the Mosaic ones (flash_mosaic.py); the
dense `attention.attention_mask` is the reference they are tested against.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from t5lite.models.positions import RelativeBuckets

MASKED = float(jnp.finfo(jnp.float32).min)  # the logit of a hidden key, as the einsum path's


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes (powers of two): queries and keys of the forward and of the backward kernels."""
  q: int = 128
  k: int = 64
  backward_q: int = 64
  backward_k: int = 64


@dataclasses.dataclass(frozen=True)
class Static:
  """Everything the kernels are specialised on."""
  query_length: int
  key_length: int
  causal: bool
  has_prefix: bool
  window: int | None  # a query at i sees keys j with |i - j| <= window only
  buckets: RelativeBuckets | None
  blocks: Blocks
  interpret: bool


def visible(static: Static, q_positions, k_positions, q_ids, k_ids) -> jax.Array:
  """Whether each query sees each key (broadcast shapes): the same segment and, if causal, not
  a later key unless both are in the prefix, and within the window. q_ids and k_ids are
  (segments, prefix flags)."""
  seen = q_ids[0] == k_ids[0]
  if static.causal:
    in_order = k_positions <= q_positions
    if static.has_prefix:
      in_order = in_order | ((q_ids[1] != 0) & (k_ids[1] != 0))
    seen = seen & in_order
  if static.window is not None:
    seen = seen & (jnp.abs(k_positions - q_positions) <= static.window)
  return seen


def key_blocks(static: Static, q_block, bq: int, bk: int, count: int):
  """[first, end) of the key blocks that query block q_block reads, of `count`: causal, none
  past its diagonal's; in a window, those that reach within it. The others hold no visible key."""
  first, end = 0, count
  if static.causal and not static.has_prefix:
    end = jax.lax.div((q_block + 1) * bq + bk - 1, bk)
  if static.window is not None:
    first = jax.lax.div(jnp.maximum(q_block * bq - static.window, 0), bk)
    end = jnp.minimum(end, jax.lax.div((q_block + 1) * bq - 1 + static.window, bk) + 1)
  return first, jnp.minimum(end, count)


def query_blocks(static: Static, k_block, bq: int, bk: int, count: int):
  """[first, end) of the query blocks that read key block k_block: `key_blocks`' tiles seen
  from the keys' side."""
  first, end = 0, count
  if static.causal and not static.has_prefix:
    first = jax.lax.div(k_block * bk, bq)
  if static.window is not None:
    first = jnp.maximum(first, jax.lax.div(jnp.maximum(k_block * bk - static.window, 0), bq))
    end = jnp.minimum(end, jax.lax.div((k_block + 1) * bk - 1 + static.window, bq) + 1)
  return first, end


def most_blocks(static: Static, block: int, other: int, count: int) -> int:
  """The most blocks of `other` (of `count`) that one block of `block` reads: all of them, or
  those a window of 2 * window + block positions can touch."""
  if static.window is None:
    return count
  return min(count, pl.cdiv(block + 2 * static.window, other) + 1)


def padded(x: jax.Array, length: int, axis: int = 1, fill=0) -> jax.Array:
  """x padded along axis to length with fill."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad, constant_values=fill)


def lengths(static: Static) -> tuple[int, int]:
  """The query and key lengths rounded up to every block size (all powers of two)."""
  blocks = static.blocks
  multiple = max(blocks.q, blocks.k, blocks.backward_q, blocks.backward_k)
  return (pl.cdiv(static.query_length, multiple) * multiple,
          pl.cdiv(static.key_length, multiple) * multiple)


def padded_ids(static: Static, query_segments, key_segments, prefix) -> tuple[jax.Array, ...]:
  """(q segments, k segments, q prefix, k prefix), int32 and padded: queries past the length in
  segment -2 (they see nothing and are cut off), keys past it in -1 (and excluded by position)."""
  q_length, k_length = lengths(static)
  k_prefix = prefix if static.has_prefix else jnp.zeros_like(key_segments)
  return (padded(query_segments.astype(jnp.int32), q_length, fill=-2),
          padded(key_segments.astype(jnp.int32), k_length, fill=-1),
          padded(prefix.astype(jnp.int32), q_length),
          padded(k_prefix.astype(jnp.int32), k_length))


def dot(a: jax.Array, b: jax.Array, contract: tuple[int, int] = (1, 0)) -> jax.Array:
  """a . b contracting a's axis contract[0] with b's contract[1] (both 2-D), in float32:
  (1, 0) is a @ b, (1, 1) a @ b.T, (0, 0) a.T @ b. Float32 operands at full precision (not
  TF32 or one bfloat16 pass)."""
  dims = (((contract[0],), (contract[1],)), ((), ()))
  precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32,
                             precision=precision)
