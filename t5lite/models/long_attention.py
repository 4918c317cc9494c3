"""LongT5's encoder self-attention (Guo et al. 2022): local windows and transient global tokens.

Local: a token sees the tokens of its example within `local_radius` on either side. It is computed
blockwise, as Hugging Face's LongT5 and flaxformer compute it, never as a (q, k) array over the
row: the row is cut into blocks of B = local_radius + 1 queries, and each block's queries score
the 3B keys of the block before, their own and the one after, which hold every query's window:

    keys     | block n-1 | block n | block n+1 |      -> scores (b, blocks, h, B, 3B)
    queries              | block n |

so that time and memory grow with the length times 3B. The mask keeps |i - j| <= local_radius,
one example and real keys; T5's relative bias depends on j - i alone, so one (h, B, 3B) slice of
it serves every block.

Transient global (TGlobal): besides its window, a token sees one global token per
`global_block_size` tokens of its example: the sum of the block's inputs to the layer (normalized
already), through a layer norm of the layer's own, projected by the layer's key and value
weights. A second table (the side bias) holds T5's bucketed bias of the distance in blocks. Blocks
start at each example's first token; an example's last partial block (its orphans) joins the
block before it, and an example shorter than one block has no global token (flaxformer's
`adopt_orphan_tokens`, Hugging Face's `_make_global_fixed_block_ids`). A row of length l has
l // global_block_size global slots, numbered through its examples in order: packed examples
never share one, and an unpacked row's blocks are Hugging Face's.

Precision: scores, both biases, the softmax and the global sums are float32 whatever the compute
dtype (the global sums are normalized from float32); the softmax weights are cast back to it for
the value matmul, as in the dense path.
"""

import dataclasses
import functools
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.attention import HEADS, Attention, AttentionLayout
from t5lite.models.config import ModelConfig
from t5lite.models.layers import Norm, constrain
from t5lite.models.positions import BucketedBias


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=['examples', 'global_slots', 'global_examples'],
                   meta_fields=['local_radius'])
@dataclasses.dataclass(frozen=True)
class LongLayout:
  """Who may attend to whom in a LongT5 encoder, per token; built once per stack."""
  examples: jax.Array  # (b, l) int32: the example (segment) of each token, -1 on padding
  global_slots: jax.Array | None  # (b, l) int32: the global token a token is summed into, or -1
  global_examples: jax.Array | None  # (b, g) int32: the example of each global token, -1 unused
  local_radius: int


@functools.partial(jax.tree_util.register_dataclass, data_fields=['local', 'side'],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LongBias:
  """T5's relative bias in the blocked shapes the scores have; built once per stack."""
  local: jax.Array  # (1, 1, h, B, 3B) float32: query i of a block, key j of its three blocks
  side: jax.Array | None  # (b, blocks, h, B, g) float32: query to global token


class LongSizes(NamedTuple):
  """What a LongT5 encoder layer computes over `length` tokens, as FLOP counts and memory
  estimates read it."""
  scored: int  # keys each query scores: its 3 blocks and the global tokens
  held: int  # key (and value) positions held: each token 3 times (the 3-block copies), globals
  global_tokens: int


def sizes(cfg: ModelConfig, length: int) -> LongSizes:
  """E.g. radius 127 and global blocks of 16 over 4,096 tokens: 384 + 256 keys scored."""
  block = cfg.local_radius + 1
  global_tokens = (length // cfg.global_block_size
                   if cfg.encoder_attention == 'transient_global' else 0)
  return LongSizes(3 * block + global_tokens, 3 * -(-length // block) * block + global_tokens,
                   global_tokens)


def long_layout(valid: jax.Array, segment_ids: jax.Array | None, cfg: ModelConfig) -> LongLayout:
  """The layout of rows of tokens: valid (b, l) False on padding, packed rows' segment ids."""
  examples = jnp.where(valid, 0 if segment_ids is None else segment_ids, -1).astype(jnp.int32)
  slots = global_examples = None
  if cfg.encoder_attention == 'transient_global':
    slots, global_examples = global_blocks(examples, cfg.global_block_size)
  return LongLayout(examples, slots, global_examples, cfg.local_radius)


def global_blocks(examples: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
  """examples (b, l) -> each token's global slot (b, l) (-1: none) and each slot's example (b, g).

  E.g. block_size 2, examples [1, 1, 1, 2, 2, 2, 2, -1]: slots [0, 0, 0, 1, 1, 2, 2, -1] (the third
  token of example 1 is an orphan and joins its block) and slot examples [1, 2, 2, -1].
  """
  length = examples.shape[1]
  index = jnp.arange(length)
  change = examples[:, 1:] != examples[:, :-1]  # (b, l - 1)
  edge = jnp.ones_like(examples[:, :1], bool)
  first = jax.lax.cummax(jnp.where(jnp.concatenate([edge, change], 1), index, 0), axis=1)
  last = jax.lax.cummin(jnp.where(jnp.concatenate([change, edge], 1), index, length - 1), axis=1,
                        reverse=True)
  valid = examples >= 0
  position = index - first  # within the example
  full_blocks = (last - first + 1) // block_size  # of the token's example
  # complete blocks up to each token, its own example's among them
  completed = jnp.cumsum(valid & (position % block_size == block_size - 1), axis=1)
  earlier = completed - (position + 1) // block_size  # complete blocks of earlier examples
  slots = earlier + jnp.minimum(position // block_size, full_blocks - 1)
  slots = jnp.where(valid & (full_blocks > 0), slots, -1).astype(jnp.int32)
  owner = slots[:, :, None] == jnp.arange(length // block_size)  # (b, l, g)
  global_examples = jnp.max(jnp.where(owner, examples[:, :, None], -1), axis=1,
                            initial=-1)  # (b, g)
  return slots, global_examples.astype(jnp.int32)


def long_bias(layout: LongLayout, local: BucketedBias, side: BucketedBias | None) -> LongBias:
  """The local bias from T5's table (`local`) and, for TGlobal, the side bias from its own."""
  block = layout.local_radius + 1
  # queries at positions B..2B-1 of their three blocks, keys at 0..3B-1: (1, h, B, 3B)
  local_bias = local.dense(block, 3 * block, query_offset=block)[:, None]  # (1, 1, h, B, 3B)
  if side is None:
    return LongBias(local_bias, None)
  # distance in blocks from each token's own to each global token: (b, l, g) -> (b, n, B, g)
  relative = jnp.arange(layout.global_examples.shape[1]) - layout.global_slots[:, :, None]
  return LongBias(local_bias, side_bias(_blocks(relative, block, axis=1), side))


def side_bias(relative: jax.Array, side: BucketedBias) -> jax.Array:
  """relative (b, n, B, g) distances in blocks -> (b, n, h, B, g) float32 bias of the side table.

  A one-hot matmul, whose table gradient is a matmul too (no gather's scatter-add: the same on
  every run, as positions.BucketedBias.dense), a block of queries at a time and made again for
  the backward pass: the one-hot (b, B, g, buckets) is buckets / heads times the bias.
  """
  table = side.table.astype(jnp.float32)

  @jax.checkpoint
  def block_bias(block_relative):  # (b, B, g) -> (b, h, B, g)
    one_hot = jax.nn.one_hot(side.buckets(block_relative), side.buckets.num_buckets,
                             dtype=jnp.float32)  # (b, B, g, buckets)
    # (b, B, g, buckets) x (buckets, h) -> (b, h, B, g)
    return jnp.einsum('bqgn,nh->bhqg', one_hot, table, precision=jax.lax.Precision.HIGHEST)

  return jnp.moveaxis(jax.lax.map(block_bias, jnp.moveaxis(relative, 1, 0)), 0, 1)


def global_sums(x: jax.Array, layout: LongLayout) -> jax.Array:
  """x (b, l, d) summed per global token -> (b, g, d) float32 (zeros where a slot is unused)."""
  one_hot = jax.nn.one_hot(layout.global_slots, layout.global_examples.shape[1],
                           dtype=x.dtype)  # (b, l, g); slot -1 is all zeros
  return jnp.einsum('bld,blg->bgd', x, one_hot, preferred_element_type=jnp.float32)


def blockwise_attention(query: jax.Array, key: jax.Array, value: jax.Array, layout: LongLayout,
                        bias: LongBias, side_key: jax.Array | None = None,
                        side_value: jax.Array | None = None) -> jax.Array:
  """Unscaled softmax(q.k + bias) v over each query's window, and over the global tokens' side
  keys and values (b, g, h, d) when given; query, key, value (b, l, h, d) -> (b, l, h, d).

  A query that sees nothing (padding) gets uniform weights, as in the dense path.
  """
  length = query.shape[1]
  block = layout.local_radius + 1
  query = _blocks(query, block, axis=1)  # (b, n, B, h, d)
  key, value = (_three_blocks(_blocks(x, block, axis=1)) for x in (key, value))  # (b, n, 3B, h, d)
  # (b, n, B, h, d) x (b, n, 3B, h, d) -> (b, n, h, B, 3B)
  logits = jnp.einsum('bnqhd,bnkhd->bnhqk', query, key, preferred_element_type=jnp.float32)
  logits = logits + bias.local
  visible = _local_visible(layout.examples, block)[:, :, None]  # (b, n, 1, B, 3B)
  if side_key is not None:
    # (b, n, B, h, d) x (b, g, h, d) -> (b, n, h, B, g)
    side_logits = jnp.einsum('bnqhd,bghd->bnhqg', query, side_key,
                             preferred_element_type=jnp.float32) + bias.side
    side_visible = ((layout.examples[:, :, None] == layout.global_examples[:, None, :])
                    & (layout.global_examples[:, None, :] >= 0))  # (b, l, g)
    side_visible = _blocks(side_visible, block, axis=1)[:, :, None]  # (b, n, 1, B, g)
    logits = jnp.concatenate([logits, side_logits], axis=-1)  # (b, n, h, B, 3B + g)
    visible = jnp.concatenate([visible, side_visible], axis=-1)
  logits = jnp.where(visible, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  # (b, n, h, B, 3B) x (b, n, 3B, h, d) -> (b, n, B, h, d)
  out = jnp.einsum('bnhqk,bnkhd->bnqhd', weights[..., :3 * block], value)
  if side_value is not None:
    # (b, n, h, B, g) x (b, g, h, d) -> (b, n, B, h, d)
    out = out + jnp.einsum('bnhqg,bghd->bnqhd', weights[..., 3 * block:], side_value)
  out = out.reshape(out.shape[0], -1, *out.shape[3:])  # (b, n, B, h, d) -> (b, n * B, h, d)
  return out[:, :length]


def _blocks(x: jax.Array, block: int, axis: int) -> jax.Array:
  """x with `axis` padded to a multiple of block (zeros, False, or -1 for ints) and split into
  (blocks, block): e.g. (b, l, h, d) -> (b, n, B, h, d) along axis 1."""
  pad = -x.shape[axis] % block
  fill = -1 if jnp.issubdtype(x.dtype, jnp.integer) else 0
  x = jnp.pad(x, [(0, pad if a == axis else 0) for a in range(x.ndim)], constant_values=fill)
  return x.reshape(*x.shape[:axis], -1, block, *x.shape[axis + 1:])


def _three_blocks(x: jax.Array) -> jax.Array:
  """(b, n, B, ...) -> (b, n, 3B, ...): each block with the one before and the one after (none
  beyond the row's ends: zeros, or -1 for ints)."""
  fill = -1 if jnp.issubdtype(x.dtype, jnp.integer) else 0
  padded = jnp.pad(x, [(0, 0), (1, 1)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
  num_blocks = x.shape[1]
  return jnp.concatenate([padded[:, i:i + num_blocks] for i in range(3)], axis=2)


def _local_visible(examples: jax.Array, block: int) -> jax.Array:
  """(b, l) examples -> (b, n, B, 3B): a query sees a key of its example (not padding) at most
  block - 1 = local_radius away."""
  query_examples = _blocks(examples, block, axis=1)  # (b, n, B)
  key_examples = _three_blocks(query_examples)  # (b, n, 3B)
  offset = jnp.arange(3 * block)[None, :] - jnp.arange(block, 2 * block)[:, None]  # (B, 3B): j - i
  same = query_examples[..., :, None] == key_examples[..., None, :]  # (b, n, B, 3B)
  return same & (key_examples[..., None, :] >= 0) & (jnp.abs(offset) < block)


class LongAttention(Attention):
  """An encoder layer's LongT5 self-attention: Attention's projections, attending blockwise to a
  `LongLayout` with a `LongBias`; TGlobal adds the layer norm of its global tokens."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    super().__init__(cfg, rngs=rngs)
    self.global_norm = (Norm(cfg, rngs=rngs) if cfg.encoder_attention == 'transient_global'
                        else None)

  def attend(self, x: jax.Array, key: jax.Array, value: jax.Array, *,
             mask: LongLayout | AttentionLayout, bias: LongBias | BucketedBias,
             positions: jax.Array | None = None) -> jax.Array:
    """x (b, l, d), the layer's normalized input, attends to its keys and values (b, l, h, kv)
    and to its global tokens -> (b, l, d). A local encoder under model.attention=flash gets the
    kernel's layout with its window instead of a LongLayout: Attention's path."""
    if isinstance(mask, AttentionLayout):
      return super().attend(x, key, value, mask=mask, bias=bias)
    del positions  # T5's relative bias, not RoPE
    query = constrain(self.q(x), HEADS)  # (b, l, d) -> (b, l, h, kv)
    side_key = side_value = None
    if self.global_norm is not None:
      side_key, side_value = self.keys_values(self.global_norm(global_sums(x, mask)))
    out = blockwise_attention(query, key, value, mask, bias, side_key, side_value)
    return self.o(constrain(out, HEADS))  # (b, l, h, kv) -> (b, l, d)
