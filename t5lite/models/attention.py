"""Multi-head attention with one mask/bias interface, and the masks built from batch features.

Every architecture uses the Mesh TensorFlow convention: logits are q.k with no 1/sqrt(d_kv), the
factor being folded into the query kernel's initializer (std (d_model * d_kv)**-0.5). Position
information enters as an additive bias (T5's relative bias) or as rotated q and k (RoPE).
`cfg.attention` picks the kernel: 'xla' or 'cudnn' through `jax.nn.dot_product_attention`,
'einsum', the plain formula, or 'flash' (models/flash_attention.py), which reads segment ids and
T5's bias table instead of (q, k) arrays: for it a stack builds an `attention_layout` and a
`BucketedBias` where the others get an `attention_mask` and a dense bias. Rows of one example
each (no segment ids: pretraining's rows) need no (b, q, k) mask at all: for 'xla' and 'cudnn' a
stack builds `padded_rows`, sequence lengths and a causal flag, and cuDNN keeps T5's bias at
(1, heads, q, k), summing its gradient over the batch itself. They agree to float rounding.
Decoding from a cache always takes the dense path ('xla' for 'flash'). 'auto' is a kernel of
the devices, `kernel_for`'s choice: make_run's for its mesh, else the default backend's.
"""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig
from t5lite.models.layers import Dense, constrain, mesh_spec
from t5lite.models.positions import BucketedBias, apply_rope

HEADS = ('batch', 'length', 'heads', 'kv')  # logical axes of per-head activations


def attention_mask(query_length: int, key_valid: jax.Array | None = None, *,
                   query_segment_ids: jax.Array | None = None,
                   key_segment_ids: jax.Array | None = None, causal: bool = False,
                   prefix: jax.Array | None = None, window: int | None = None) -> jax.Array:
  """A (b or 1, 1, q, k) boolean mask: True where a query may attend to a key.

  key_valid (b, k) hides padding; segment ids (b, q) and (b, k) keep packed examples apart;
  causal hides later keys. E.g. query segments [1, 1, 2] and key segments [1, 1, 2, 0] with
  key_valid [1, 1, 1, 0]: row 0 is [T, T, F, F] and row 2 is [F, F, T, F]. A prefix LM's
  `prefix` (b, q) (seqio's decoder_causal_attention) lets its positions see each other
  whatever the order: prefix [1, 1, 0] makes causal row 0 [T, T, F]. A local `window` hides
  keys more than that many positions away (LongT5's local attention): window 1 makes row 0
  [T, T, F, F].
  """
  mask = jnp.ones((1, 1, query_length, 1), bool)
  if key_valid is not None:
    mask = mask & key_valid[:, None, None, :]  # (b, k) -> (b, 1, 1, k)
  if query_segment_ids is not None and key_segment_ids is not None:
    same = query_segment_ids[:, :, None] == key_segment_ids[:, None, :]  # (b, q, k)
    mask = mask & same[:, None]  # (b, q, k) -> (b, 1, q, k)
  if causal:
    visible = jnp.tril(jnp.ones((query_length, query_length), bool))  # (q, k=q)
    if prefix is not None:
      prefix = prefix.astype(bool)
      visible = visible | (prefix[:, :, None] & prefix[:, None, :])[:, None]  # (b, 1, q, k)
    mask = mask & visible
  if window is not None:
    key_length = query_length if key_valid is None else key_valid.shape[1]
    distance = jnp.arange(key_length)[None, :] - jnp.arange(query_length)[:, None]  # (q, k)
    mask = mask & (jnp.abs(distance) <= window)
  return mask


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=['query_segments', 'key_segments', 'prefix'],
                   meta_fields=['causal', 'window'])
@dataclasses.dataclass(frozen=True)
class AttentionLayout:
  """Who may attend to whom as ids per position, the flash kernel's form of `attention_mask`.

  A query sees the keys of its segment (a key in segment -1: no query), and if causal, none after
  it unless both are in the prefix, and with a window none further than `window` positions.
  Causal layouts are self-attention with one set of ids.
  """
  query_segments: jax.Array  # (b|1, q) int32
  key_segments: jax.Array  # (b|1, k) int32
  prefix: jax.Array | None  # (b, q) prefix LM: nonzero where attention is bidirectional
  causal: bool
  window: int | None = None  # |query position - key position| <= window (local attention)


def attention_layout(query_length: int, key_valid: jax.Array | None = None, *,
                     query_segment_ids: jax.Array | None = None,
                     key_segment_ids: jax.Array | None = None, causal: bool = False,
                     prefix: jax.Array | None = None, window: int | None = None
                     ) -> AttentionLayout:
  """`attention_mask`'s arguments as an AttentionLayout, which the same rules make the same mask.

  E.g. key_valid [1, 1, 1, 0] and segments [1, 1, 2, 0]: key segments [1, 1, 2, -1]. Without
  segment ids every query and key is in segment 0 (a (1, length) row).
  """
  if query_segment_ids is not None and key_segment_ids is not None:
    query_ids, key_ids = query_segment_ids, key_segment_ids
  else:
    key_length = query_length if key_valid is None else key_valid.shape[1]
    query_ids = jnp.zeros((1, query_length), jnp.int32)
    key_ids = query_ids if causal else jnp.zeros((1, key_length), jnp.int32)
  if key_valid is not None:
    if causal:
      raise ValueError('a causal layout hides keys by segment, not by key_valid')
    key_ids = jnp.where(key_valid, key_ids, -1)
  return AttentionLayout(query_ids, key_ids, prefix, causal, window)


@functools.partial(jax.tree_util.register_dataclass, data_fields=['key_lengths'],
                   meta_fields=['causal'])
@dataclasses.dataclass(frozen=True)
class PaddedRows:
  """Who may attend to whom where each row is one example, padded at its end: each row's count
  of real keys and a causal flag, what cuDNN takes in place of a mask (and XLA builds one from).
  """
  key_lengths: jax.Array | None  # (b,) int32; None: every key is real (a decoder's, causal)
  causal: bool


def padded_rows(query_length: int, key_valid: jax.Array | None = None, *,
                query_segment_ids: jax.Array | None = None,
                key_segment_ids: jax.Array | None = None, causal: bool = False,
                prefix: jax.Array | None = None, window: int | None = None) -> PaddedRows:
  """`attention_mask`'s arguments for rows of one example (no segment ids, no prefix, no window)
  as PaddedRows: key_valid [1, 1, 1, 0] is 3 keys. A row's keys are those up to its last valid
  one."""
  del query_length  # every query of a row is the row's
  if (query_segment_ids is not None or key_segment_ids is not None or prefix is not None
      or window is not None):
    raise ValueError('padded rows are one example each: no segment ids, no prefix, no window')
  if key_valid is None:
    return PaddedRows(None, causal)
  positions = jnp.arange(1, key_valid.shape[1] + 1, dtype=jnp.int32)
  return PaddedRows(jnp.max(jnp.where(key_valid, positions, 0), axis=1), causal)


def kernel_for(attention: str, dtype: str, platform: str | None = None,
               platform_version: str = '') -> str:
  """The kernel 'auto' means on `platform` (a jax platform: 'gpu', 'tpu', 'cpu'; None: JAX's
  default backend): cuDNN's fused attention on NVIDIA GPUs in 16 bits (it takes no float32),
  else XLA's, on TPUs too until a TPU has run the flash kernel (which compiles for them: see
  docs/tpu.md). Others are themselves."""
  if attention != 'auto':
    return attention
  if platform is None:
    backend = jax.extend.backend.get_backend()
    platform, platform_version = backend.platform, backend.platform_version
  nvidia = platform in ('gpu', 'cuda') and 'rocm' not in platform_version.lower()
  return 'cudnn' if nvidia and dtype in ('bfloat16', 'float16') else 'xla'


def flash(query: jax.Array, key: jax.Array, value: jax.Array, layout: AttentionLayout,
          bias: BucketedBias | None) -> jax.Array:
  """The flash kernel on each device's shard (batch and heads), as a kernel is not partitioned
  by XLA: under a mesh, shard_map with lengths whole."""
  # Pallas, imported by the runs that use it: 0.1 s of every other command's start-up
  from t5lite.models import flash_attention as kernel  # pylint: disable=import-outside-toplevel
  batch = query.shape[0]
  ids = {'query_segments': jnp.broadcast_to(layout.query_segments, (batch, query.shape[1])),
         'key_segments': jnp.broadcast_to(layout.key_segments, (batch, key.shape[1])),
         'prefix': layout.prefix, 'table': None if bias is None else bias.table}

  def attend(query, key, value, ids):
    return kernel.flash_attention(query, key, value, causal=layout.causal, window=layout.window,
                                  buckets=None if bias is None else bias.buckets, **ids)

  heads = mesh_spec(('batch', None, 'heads', 'kv'))
  if heads is None:
    return attend(query, key, value, ids)
  rows = mesh_spec(('batch', None))
  specs = {'query_segments': rows, 'key_segments': rows, 'prefix': rows,
           'table': mesh_spec(('relpos_buckets', 'heads'))}
  return jax.shard_map(attend, in_specs=(heads, heads, heads, specs), out_specs=heads,
                       check_vma=False)(query, key, value, ids)


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                          mask: jax.Array | AttentionLayout,
                          bias: jax.Array | BucketedBias | None,
                          implementation: str) -> jax.Array:
  """Unscaled softmax(q.k + bias) v over masked keys; softmax in float32.

  query (b, q, h, d), key and value (b, k, h, d), mask (b|1, 1, q, k) or PaddedRows, bias
  (b|1, h, q, k) -> (b, q, h, d); or an AttentionLayout and BucketedBias for the flash kernel.
  Fully masked rows get uniform weights rather than NaN, as in XLA's kernel.
  """
  if isinstance(mask, AttentionLayout):
    return flash(query, key, value, mask, bias)
  if implementation == 'flash':  # a dense mask: decoding from a cache
    implementation = 'xla'
  if isinstance(mask, PaddedRows):
    if implementation == 'einsum':
      mask = _dense(mask, query.shape[1], key.shape[1])
    else:
      return _lengths_attention(query, key, value, mask, bias, implementation)
  mask = jnp.broadcast_to(mask, (mask.shape[0], 1, query.shape[1], key.shape[1]))  # (b|1, 1, q, k)
  if bias is not None:
    bias = bias.astype(query.dtype)  # T5X keeps the bias in the compute dtype too
  if implementation != 'einsum':
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=1.0,
        implementation=None if implementation == 'xla' else implementation)
  # (b, q, h, d) x (b, k, h, d) -> (b, h, q, k)
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key, preferred_element_type=jnp.float32)
  if bias is not None:
    logits = logits + bias
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  # (b, h, q, k) x (b, k, h, d) -> (b, q, h, d)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, value)


def _lengths_attention(query, key, value, rows: PaddedRows, bias, implementation):
  """XLA's or cuDNN's kernel on rows of one example: lengths and a causal flag for a mask, so
  that cuDNN reads the (1, h, q, k) bias as it is and writes its gradient at that size. A row of
  no real keys attends its first (cuDNN is not asked about zero keys; its output is never read)."""
  lengths = rows.key_lengths
  if lengths is not None and implementation == 'cudnn':
    lengths = jnp.maximum(lengths, 1)
  return jax.nn.dot_product_attention(
      query, key, value, bias=None if bias is None else bias.astype(query.dtype), scale=1.0,
      is_causal=rows.causal, key_value_seq_lengths=lengths,
      implementation=None if implementation == 'xla' else implementation)


def _dense(rows: PaddedRows, query_length: int, key_length: int) -> jax.Array:
  """PaddedRows as the (b|1, 1, q, k) boolean mask `attention_mask` makes."""
  key_valid = None
  if rows.key_lengths is not None:
    key_valid = jnp.arange(key_length)[None, :] < rows.key_lengths[:, None]  # (b, k)
  return attention_mask(query_length, key_valid, causal=rows.causal)


class Attention(nnx.Module):
  """Projections to heads, attention, projection back; self- or cross-attention by the caller.

  In two halves, `keys_values(memory)` then `attend(x, key, value)`, so that decoding can cache
  keys and values: a decoder's self-attention ones one step at a time, cross-attention's once
  from the encoder output.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, h, kv = cfg.d_model, cfg.num_heads, cfg.d_kv

    def project_in(std):
      return Dense((d,), (h, kv), ('embed', 'heads', 'kv'), std=std, cfg=cfg, rngs=rngs)

    self.q = project_in((d * kv)**-0.5)  # folds the missing 1/sqrt(d_kv) into the init
    self.k = project_in(d**-0.5)
    self.v = project_in(d**-0.5)
    self.o = Dense((h, kv), (d,), ('heads', 'kv', 'embed'), std=(h * kv)**-0.5, cfg=cfg,
                   rngs=rngs)
    # 'auto' that make_run did not resolve for its mesh: the default backend's kernel
    self.implementation = kernel_for(cfg.attention, cfg.dtype)

  def keys_values(self, memory: jax.Array, positions: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """memory (b, k, d) -> keys and values (b, k, h, kv), keys rotated by positions (RoPE)."""
    key = constrain(self.k(memory), HEADS)  # (b, k, d) -> (b, k, h, kv)
    value = constrain(self.v(memory), HEADS)
    if positions is not None:
      key = apply_rope(key, positions)
    return key, value

  def attend(self, x: jax.Array, key: jax.Array, value: jax.Array, *, mask: jax.Array,
             bias: jax.Array | None = None, positions: jax.Array | None = None) -> jax.Array:
    """x (b, q, d) attends to keys and values (b, k, h, kv) -> (b, q, d); positions (b, q)
    rotate the queries (RoPE) as they rotated the keys."""
    query = constrain(self.q(x), HEADS)  # (b, q, d) -> (b, q, h, kv)
    if positions is not None:
      query = apply_rope(query, positions)
    out = dot_product_attention(query, key, value, mask=mask, bias=bias,
                                implementation=self.implementation)
    return self.o(constrain(out, HEADS))  # (b, q, h, kv) -> (b, q, d)
