"""Multi-head attention with one mask/bias interface, and the masks built from batch features.

Every architecture uses the Mesh TensorFlow convention: logits are q.k with no 1/sqrt(d_kv), the
factor being folded into the query kernel's initializer (std (d_model * d_kv)**-0.5). Position
information enters as an additive bias (T5's relative bias) or as rotated q and k (RoPE).
`cfg.attention` picks the kernel: 'xla' or 'cudnn' through `jax.nn.dot_product_attention`, or
'einsum', the plain formula; they agree to float rounding.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig
from t5lite.models.layers import Dense, constrain
from t5lite.models.positions import apply_rope

HEADS = ('batch', 'length', 'heads', 'kv')  # logical axes of per-head activations


def attention_mask(query_length: int, key_valid: jax.Array | None = None, *,
                   query_segment_ids: jax.Array | None = None,
                   key_segment_ids: jax.Array | None = None, causal: bool = False,
                   prefix: jax.Array | None = None) -> jax.Array:
  """A (b or 1, 1, q, k) boolean mask: True where a query may attend to a key.

  key_valid (b, k) hides padding; segment ids (b, q) and (b, k) keep packed examples apart;
  causal hides later keys. E.g. query segments [1, 1, 2] and key segments [1, 1, 2, 0] with
  key_valid [1, 1, 1, 0]: row 0 is [T, T, F, F] and row 2 is [F, F, T, F]. A prefix LM's
  `prefix` (b, q) (seqio's decoder_causal_attention) lets its positions see each other
  whatever the order: prefix [1, 1, 0] makes causal row 0 [T, T, F].
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
  return mask


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                          mask: jax.Array, bias: jax.Array | None,
                          implementation: str) -> jax.Array:
  """Unscaled softmax(q.k + bias) v over masked keys; softmax in float32.

  query (b, q, h, d), key and value (b, k, h, d), mask (b|1, 1, q, k), bias (b|1, h, q, k)
  -> (b, q, h, d). Fully masked rows get uniform weights rather than NaN, as in XLA's kernel.
  """
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
    self.implementation = cfg.attention

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
