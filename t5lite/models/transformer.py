"""The three model families: encoder-decoder (T5, Vaswani), encoder-only (BERT), decoder-only (GPT).

All are built from one `ModelConfig` and share one call: `logits = model(batch,
deterministic=True)`, where `batch` holds int32 arrays named as seqio's feature converters name
them (`encoder_input_tokens`, `decoder_input_tokens`, and for packed data `*_segment_ids`,
`*_positions`). Logits are float32 (batch, length, vocab_size). With `deterministic=False`
dropout draws from the model's own `dropout` stream (seeded from the build rngs; a train step
calls `nnx.reseed(model, dropout=key)`), or from `rngs=nnx.Rngs(dropout=key)` if given.

Masks: encoder keys that are padding (token 0) are hidden from every query, in self- and
cross-attention. Decoders use causal masking alone: with right padding it already hides every pad
from every real token, and `decoder_input_tokens` starts with the pad id (T5's start token), so a
mask from it would hide the start token. With segment ids, attention stays inside one segment.
"""

from collections.abc import Mapping
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.attention import Attention, attention_mask
from t5lite.models.config import ModelConfig
from t5lite.models.layers import Dense, Embed, MLP, Norm, constrain
from t5lite.models.positions import RelativePositionBias, sinusoidal_positions

CHECKPOINT_POLICIES = {
    'full': None,  # save nothing: recompute the whole layer in the backward pass
    # keep the projections' outputs, recompute attention scores and elementwise ops
    'save_dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
EMBED = ('batch', 'length', 'embed')


class Features(NamedTuple):
  """The token features of one side (encoder or decoder) of a batch."""
  tokens: jax.Array  # (b, l) int32, 0 is padding
  segment_ids: jax.Array | None = None  # (b, l) packed example index, 0 on padding
  positions: jax.Array | None = None  # (b, l) position within the packed example

  @classmethod
  def from_batch(cls, batch: Mapping[str, jax.Array], side: str) -> 'Features':
    """side 'encoder' reads encoder_input_tokens, encoder_segment_ids, encoder_positions."""
    return cls(batch[f'{side}_input_tokens'], batch.get(f'{side}_segment_ids'),
               batch.get(f'{side}_positions'))

  def absolute_positions(self) -> jax.Array:
    """The positions feature of packed data, else 0, 1, ... for every row."""
    if self.positions is not None:
      return self.positions
    return jnp.broadcast_to(jnp.arange(self.tokens.shape[1]), self.tokens.shape)  # (b, l)


class LayerInputs(NamedTuple):
  """What every layer of a stack reads besides the hidden states; computed once per stack."""
  mask: jax.Array  # (b|1, 1, l, l) self-attention mask
  bias: jax.Array | None  # (1, h, l, l) T5 relative position bias
  positions: jax.Array | None  # (b, l) for RoPE
  encoded: jax.Array | None = None  # (b, m, d) encoder output, for cross-attention
  cross_mask: jax.Array | None = None  # (b, 1, l, m)


class Block(nnx.Module):
  """One layer: self-attention, cross-attention (decoder of an encoder-decoder), MLP.

  Each sublayer is residual; pre-norm normalizes its input (T5, GPT-2), post-norm the sum
  (Vaswani, BERT).
  """

  def __init__(self, cfg: ModelConfig, *, cross_attention: bool, rngs: nnx.Rngs):
    self.pre_norm = cfg.norm_position == 'pre'
    self.self_attention = Attention(cfg, rngs=rngs)
    self.self_attention_norm = Norm(cfg, rngs=rngs)
    if cross_attention:
      self.cross_attention = Attention(cfg, rngs=rngs)
      self.cross_attention_norm = Norm(cfg, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)
    self.mlp_norm = Norm(cfg, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout)

  def _residual(self, x, norm, sublayer, deterministic, rngs):
    if self.pre_norm:
      return x + self.dropout(sublayer(norm(x)), deterministic=deterministic, rngs=rngs)
    return norm(x + self.dropout(sublayer(x), deterministic=deterministic, rngs=rngs))

  def __call__(self, x: jax.Array, inputs: LayerInputs, key: jax.Array | None, *,
               deterministic: bool) -> jax.Array:
    """x (b, l, d) -> (b, l, d); key seeds this layer's dropout."""
    rngs = None if key is None else nnx.Rngs(dropout=key)

    def self_attention(y):
      return self.self_attention(y, y, mask=inputs.mask, bias=inputs.bias,
                                 positions=inputs.positions)

    def cross_attention(y):
      return self.cross_attention(y, inputs.encoded, mask=inputs.cross_mask)

    def mlp(y):
      return self.mlp(y, deterministic=deterministic, rngs=rngs)

    x = self._residual(x, self.self_attention_norm, self_attention, deterministic, rngs)
    if inputs.encoded is not None:
      x = self._residual(x, self.cross_attention_norm, cross_attention, deterministic, rngs)
    x = self._residual(x, self.mlp_norm, mlp, deterministic, rngs)
    return constrain(x, EMBED)


def make_layers(cfg: ModelConfig, num_layers: int, *, cross_attention: bool, rngs: nnx.Rngs):
  """A list of Blocks, or one Block whose params have a leading 'layers' axis (scan_layers)."""
  if not cfg.scan_layers:
    return nnx.List([Block(cfg, cross_attention=cross_attention, rngs=rngs)
                     for _ in range(num_layers)])

  @nnx.split_rngs(splits=num_layers)
  @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'layers'})
  def create(rngs):
    return Block(cfg, cross_attention=cross_attention, rngs=rngs)

  return create(rngs)


class Stack(nnx.Module):
  """Embedded tokens through absolute positions, the layers and (pre-norm) a final norm."""

  def __init__(self, cfg: ModelConfig, num_layers: int, *, causal: bool, cross_attention: bool,
               rngs: nnx.Rngs):
    self.cfg, self.num_layers, self.causal = cfg, num_layers, causal
    if cfg.position == 't5_relative':
      self.relative_bias = RelativePositionBias(cfg, bidirectional=not causal, rngs=rngs)
    if cfg.position == 'learned':
      self.position_embedding = Embed(cfg.max_length, cfg.d_model, (None, 'embed'), std=0.02,
                                      cfg=cfg, rngs=rngs)
    self.layers = make_layers(cfg, num_layers, cross_attention=cross_attention, rngs=rngs)
    if cfg.norm_position == 'pre':
      self.final_norm = Norm(cfg, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout)

  def __call__(self, x: jax.Array, features: Features, *, encoded: jax.Array | None = None,
               encoder: Features | None = None, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    """x (b, l, d) embedded tokens -> (b, l, d); encoded/encoder feed cross-attention."""
    length = x.shape[1]
    absolute = self._absolute_positions(features)
    if absolute is not None:
      x = x + absolute.astype(x.dtype)
    x = constrain(self.dropout(x, deterministic=deterministic, rngs=rngs), EMBED)
    inputs = LayerInputs(
        mask=attention_mask(length, None if self.causal else features.tokens > 0,
                            query_segment_ids=features.segment_ids,
                            key_segment_ids=features.segment_ids, causal=self.causal),
        bias=self.relative_bias(length, length) if self.cfg.position == 't5_relative' else None,
        positions=features.absolute_positions() if self.cfg.position == 'rope' else None)
    if encoded is not None:
      inputs = inputs._replace(encoded=encoded, cross_mask=attention_mask(
          length, encoder.tokens > 0, query_segment_ids=features.segment_ids,
          key_segment_ids=encoder.segment_ids))
    use_dropout = not deterministic and self.cfg.dropout > 0
    keys = jax.random.split(rngs.dropout(), self.num_layers) if use_dropout else None
    x = self._apply_layers(x, inputs, keys, deterministic)
    if self.cfg.norm_position == 'pre':
      x = self.dropout(self.final_norm(x), deterministic=deterministic, rngs=rngs)
    return x

  def _absolute_positions(self, features: Features) -> jax.Array | None:
    """The sinusoidal or learned encoding to add to the embeddings; None for relative/RoPE."""
    if self.cfg.position == 'sinusoidal':
      return sinusoidal_positions(features.absolute_positions(), self.cfg.d_model)
    if self.cfg.position == 'learned':
      if features.tokens.shape[1] > self.cfg.max_length:
        raise ValueError(f'sequence length {features.tokens.shape[1]} exceeds model.max_length='
                         f'{self.cfg.max_length} of the learned position table')
      return self.position_embedding(features.absolute_positions())
    return None

  def _apply_layers(self, x, inputs, keys, deterministic):
    """Runs the layers in order, scanned or unrolled, each under the remat policy."""
    def apply(block, y, key):
      return block(y, inputs, key, deterministic=deterministic)

    if self.cfg.remat_policy != 'none':
      apply = nnx.remat(apply, policy=CHECKPOINT_POLICIES[self.cfg.remat_policy])
    if self.cfg.scan_layers:
      def body(y, block, key):
        return apply(block, y, key)

      scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=nnx.Carry,
                      transform_metadata={nnx.PARTITION_NAME: 'layers'})
      return scan(x, self.layers, keys)
    for i, block in enumerate(self.layers):
      x = apply(block, x, None if keys is None else keys[i])
    return x


def output_logits(cfg: ModelConfig, embed: Embed, lm_head: Dense | None, x: jax.Array) -> jax.Array:
  """Float32 vocabulary logits: the tied embedding with T5's d_model**-0.5 rescaling, or lm_head."""
  if cfg.tie_embeddings:
    logits = embed.attend(x * cfg.d_model**-0.5)  # (b, l, d) -> (b, l, v)
  else:
    logits = lm_head(x)  # (b, l, d) -> (b, l, v)
  return constrain(logits.astype(jnp.float32), ('batch', 'length', 'vocab'))


def _shared_parts(cfg: ModelConfig, rngs: nnx.Rngs) -> tuple[Embed, Dense | None, nnx.Rngs]:
  """The token embedding, the untied lm head (or None) and the dropout RNG stream."""
  embed = Embed(cfg.vocab_size, cfg.d_model, ('vocab', 'embed'), std=1.0, cfg=cfg, rngs=rngs)
  lm_head = None if cfg.tie_embeddings else Dense(
      (cfg.d_model,), (cfg.vocab_size,), ('embed', 'vocab'), std=cfg.d_model**-0.5, cfg=cfg,
      rngs=rngs)
  return embed, lm_head, nnx.Rngs(dropout=rngs.dropout())


class EncoderDecoder(nnx.Module):
  """T5 (and Vaswani et al., BART): a bidirectional encoder read by a causal decoder."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    # one embedding table for both stacks (and the tied lm head)
    self.embed, self.lm_head, self.rngs = _shared_parts(cfg, rngs)
    self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                         rngs=rngs)
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=True,
                         rngs=rngs)

  def encode(self, encoder: Features, *, deterministic: bool = True,
             rngs: nnx.Rngs | None = None) -> jax.Array:
    """Encoder tokens -> (b, m, d) encoded states."""
    return self.encoder(self.embed(encoder.tokens), encoder, deterministic=deterministic,
                        rngs=self.rngs if rngs is None else rngs)

  def decode(self, encoded: jax.Array, encoder: Features, decoder: Features, *,
             deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
    """Decoder input tokens (shifted right) attending to `encoded` -> (b, l, vocab) logits."""
    x = self.decoder(self.embed(decoder.tokens), decoder, encoded=encoded, encoder=encoder,
                     deterministic=deterministic, rngs=self.rngs if rngs is None else rngs)
    return output_logits(self.cfg, self.embed, self.lm_head, x)

  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    encoder = Features.from_batch(batch, 'encoder')
    encoded = self.encode(encoder, deterministic=deterministic, rngs=rngs)
    return self.decode(encoded, encoder, Features.from_batch(batch, 'decoder'),
                       deterministic=deterministic, rngs=rngs)


class EncoderOnly(nnx.Module):
  """BERT-like: a bidirectional stack with per-token vocabulary logits (the MLM head)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed, self.lm_head, self.rngs = _shared_parts(cfg, rngs)
    self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                         rngs=rngs)

  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    rngs = self.rngs if rngs is None else rngs
    encoder = Features.from_batch(batch, 'encoder')
    x = self.encoder(self.embed(encoder.tokens), encoder, deterministic=deterministic, rngs=rngs)
    return output_logits(self.cfg, self.embed, self.lm_head, x)


class DecoderOnly(nnx.Module):
  """GPT-like: one causal stack over `decoder_input_tokens`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed, self.lm_head, self.rngs = _shared_parts(cfg, rngs)
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=False,
                         rngs=rngs)

  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    rngs = self.rngs if rngs is None else rngs
    decoder = Features.from_batch(batch, 'decoder')
    x = self.decoder(self.embed(decoder.tokens), decoder, deterministic=deterministic, rngs=rngs)
    return output_logits(self.cfg, self.embed, self.lm_head, x)


MODELS = {'encoder_decoder': EncoderDecoder, 'encoder': EncoderOnly, 'decoder': DecoderOnly}


def build(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
  """The model `cfg.arch` names, initialized from `rngs.params`; `nnx.eval_shape` it for shapes."""
  if cfg.attention == 'cudnn' and jax.default_backend() != 'gpu':
    raise ValueError(f"model.attention='cudnn' needs a GPU (backend is {jax.default_backend()}); "
                     "use 'xla' or 'einsum'")
  return MODELS[cfg.arch](cfg, rngs=rngs)
