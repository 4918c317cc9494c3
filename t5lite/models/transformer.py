"""What every model family is built from: batch features, the layer stack, shared embeddings, heads.

The families (encoder_decoder.py, encoder.py, decoder.py, electra.py) are built from one
`ModelConfig`; the language models among them share one call: `logits = model(batch,
deterministic=True)`, where `batch` holds int32 arrays named as seqio's feature converters name
them (`encoder_input_tokens`, `decoder_input_tokens`, and for packed data `*_segment_ids`,
`*_positions`). Logits are float32 (batch, length, vocab_size); the call is
`model.lm_logits(model.hidden_states(batch))`, halves that a chunked loss uses apart. With
`deterministic=False` dropout draws from the model's own `dropout` stream (seeded from the build
rngs; a train step calls `nnx.reseed(model, dropout=key)`), or from `rngs=nnx.Rngs(dropout=key)`
if given.

Masks: encoder keys that are padding (token 0) are hidden from every query, in self- and
cross-attention. Decoders use causal masking alone: with right padding it already hides every pad
from every real token, and `decoder_input_tokens` starts with the pad id (T5's start token), so a
mask from it would hide the start token. With segment ids, attention stays inside one segment.
A prefix LM's `decoder_causal_attention` (seqio's; `Features.bidirectional`) makes attention
bidirectional over its prefix.
"""

from collections.abc import Callable, Mapping
import dataclasses
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.attention import (Attention, AttentionLayout, PaddedRows, attention_layout,
                                     attention_mask, padded_rows)
from t5lite.models.config import ModelConfig
from t5lite.models.experts import LayerGroup, SparseMLP, is_sparse
from t5lite.models.layers import ACTIVATION_FUNCTIONS, Dense, Embed, MLP, Norm, constrain, param
from t5lite.models.positions import BucketedBias, RelativePositionBias, sinusoidal_positions

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
  # (b, l) prefix LM: 1 where attention is bidirectional (seqio's `*_causal_attention` feature)
  bidirectional: jax.Array | None = None
  token_types: jax.Array | None = None  # (b, l) BERT's segment A (0) or B (1), next_sentence only

  @classmethod
  def from_batch(cls, batch: Mapping[str, jax.Array], side: str) -> 'Features':
    """side 'encoder' reads encoder_input_tokens, encoder_segment_ids, encoder_positions."""
    return cls(batch[f'{side}_input_tokens'], batch.get(f'{side}_segment_ids'),
               batch.get(f'{side}_positions'), batch.get(f'{side}_causal_attention'),
               batch.get(f'{side}_token_types'))

  def absolute_positions(self) -> jax.Array:
    """The positions feature of packed data, else 0, 1, ... for every row."""
    if self.positions is not None:
      return self.positions
    return jnp.broadcast_to(jnp.arange(self.tokens.shape[1]), self.tokens.shape)  # (b, l)


class LayerInputs(NamedTuple):
  """What every layer of a stack reads besides the hidden states; computed once per stack."""
  mask: jax.Array | AttentionLayout | PaddedRows  # (b|1, 1, l, l) mask, flash's ids, or lengths
  bias: jax.Array | BucketedBias | None  # (1, h, l, l) T5 relative position bias, or its table
  positions: jax.Array | None  # (b, l) for RoPE
  encoded: jax.Array | None = None  # (b, m, d) encoder output, for cross-attention
  cross_mask: jax.Array | AttentionLayout | PaddedRows | None = None  # (b|1, 1, l|1, m)
  index: jax.Array | None = None  # decoding: cache position of the first of the l tokens
  # The bias a table gives at these positions (a layer's own table: UMT5), or None
  bias_of: Callable[[RelativePositionBias], jax.Array | BucketedBias] | None = None


class LayerCache(NamedTuple):
  """One decoder layer's keys and values while decoding, batch-major: (b, length, h, kv) per
  layer, or (b, layers, length, h, kv) for all layers at once when they are scanned."""
  key: jax.Array  # self-attention over the cache positions, written as tokens are decoded
  value: jax.Array
  cross_key: jax.Array | None = None  # cross-attention over the encoder output, computed once
  cross_value: jax.Array | None = None


class DecodeCache(NamedTuple):
  """What a decoding step reads besides its new tokens; `Stack.apply_with_cache` takes it and
  returns it.

  A plain pytree passed in and returned, not mutable variables inside the modules (Flax's
  `nnx.Cache`, linen's 'cache' collection): the model stays a pure function of (params, tokens,
  cache), the cache is an ordinary `while_loop` carry under `jit`, and as every leaf is
  batch-major, beam search copies and reorders hypotheses with one `jnp.take` per leaf.
  """
  layers: tuple[LayerCache, ...] | LayerCache  # per layer, or stacked on axis 1 (scan_layers)
  # (b,) int32 cache position of each row's start token. Decoder-only prompts are left-padded
  # to a common length: the padding before `start` is hidden and positions count from it.
  start: jax.Array
  encoder_valid: jax.Array | None = None  # (b, m) bool, False on encoder padding

  @property
  def length(self) -> int:
    """The number of positions: prompt and decoded tokens together."""
    layer = self.layers if isinstance(self.layers, LayerCache) else self.layers[0]
    return layer.key.shape[-3]


class Block(nnx.Module):
  """One layer: self-attention, cross-attention (decoder of an encoder-decoder), MLP (or, sparse,
  experts: models/experts.py).

  Each sublayer is residual; pre-norm normalizes its input (T5, GPT-2), post-norm the sum
  (Vaswani, BERT).
  """

  def __init__(self, cfg: ModelConfig, *, cross_attention: bool, rngs: nnx.Rngs,
               sparse: bool = False, causal: bool = False):
    self.pre_norm = cfg.norm_position == 'pre'
    # UMT5: the self-attention's own bias table (`causal` decides its buckets)
    self.relative_bias = (RelativePositionBias(cfg, bidirectional=not causal, rngs=rngs)
                          if cfg.relative_bias_per_layer else None)
    self.self_attention = Attention(cfg, rngs=rngs)
    self.self_attention_norm = Norm(cfg, rngs=rngs)
    if cross_attention:
      self.cross_attention = Attention(cfg, rngs=rngs)
      self.cross_attention_norm = Norm(cfg, rngs=rngs)
    self.mlp = SparseMLP(cfg, rngs=rngs) if sparse else MLP(cfg, rngs=rngs)
    self.mlp_norm = Norm(cfg, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout)

  def _sublayer_input(self, x, norm):
    return norm(x) if self.pre_norm else x

  def _residual(self, x, y, norm, deterministic, rngs):
    """x plus the sublayer's output y (dropped out); post-norm normalizes the sum."""
    y = self.dropout(y, deterministic=deterministic, rngs=rngs)
    return x + y if self.pre_norm else norm(x + y)

  def __call__(self, x: jax.Array, inputs: LayerInputs, key: jax.Array | None, *,
               deterministic: bool, cache: LayerCache | None = None):
    """x (b, l, d) -> (b, l, d); key seeds this layer's dropout.

    Decoding, with a cache: x holds the tokens at cache positions inputs.index, ...; their
    self-attention keys and values are written there, they attend to the whole cache (the mask
    hides positions not written yet) and the result is (x, cache).
    """
    rngs = None if key is None else nnx.Rngs(dropout=key)
    y = self._sublayer_input(x, self.self_attention_norm)
    key_value = self.self_attention.keys_values(y, inputs.positions)  # 2 x (b, l, h, kv)
    if cache is not None:
      cache = cache._replace(key=_write(cache.key, key_value[0], inputs.index),
                             value=_write(cache.value, key_value[1], inputs.index))
      key_value = cache.key, cache.value  # 2 x (b, length, h, kv)
    bias = inputs.bias if self.relative_bias is None else inputs.bias_of(self.relative_bias)
    y = self.self_attention.attend(y, *key_value, mask=inputs.mask, bias=bias,
                                   positions=inputs.positions)
    x = self._residual(x, y, self.self_attention_norm, deterministic, rngs)
    if inputs.cross_mask is not None:
      y = self._sublayer_input(x, self.cross_attention_norm)
      key_value = (self.cross_attention.keys_values(inputs.encoded) if cache is None
                   else (cache.cross_key, cache.cross_value))  # 2 x (b, m, h, kv)
      y = self.cross_attention.attend(y, *key_value, mask=inputs.cross_mask)
      x = self._residual(x, y, self.cross_attention_norm, deterministic, rngs)
    y = self.mlp(self._sublayer_input(x, self.mlp_norm), deterministic=deterministic, rngs=rngs)
    x = constrain(self._residual(x, y, self.mlp_norm, deterministic, rngs), EMBED)
    return x if cache is None else (x, cache)


def _write(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """cache (b, length, ...) with new (b, l, ...) at positions index, ..., index + l - 1."""
  return jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), index, axis=1)


def make_layers(cfg: ModelConfig, num_layers: int, *, cross_attention: bool, rngs: nnx.Rngs,
                sparse_step: int = 0, causal: bool = False):
  """A list of Blocks, or one Block whose params have a leading 'layers' axis (scan_layers); with
  experts every sparse_step layers, scanned, one LayerGroup of sparse_step Blocks."""
  def block(i, rngs):
    return Block(cfg, cross_attention=cross_attention, rngs=rngs,
                 sparse=is_sparse(i, sparse_step), causal=causal)

  if not cfg.scan_layers:
    return nnx.List([block(i, rngs) for i in range(num_layers)])

  @nnx.split_rngs(splits=num_layers // (sparse_step or 1))
  @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'layers'})
  def create(rngs):
    return LayerGroup([block(j, rngs) for j in range(sparse_step)]) if sparse_step else block(
        0, rngs)

  return create(rngs)


class Stack(nnx.Module):
  """Embedded tokens through absolute positions (and token types, and BERT's embedding norm),
  the layers and (pre-norm) a final norm.

  With `embed_width` other than cfg.d_model, the embeddings are that wide and a dense layer
  projects them to the layers' width (ELECTRA's generator, narrower than the embeddings it
  shares with the discriminator)."""

  def __init__(self, cfg: ModelConfig, num_layers: int, *, causal: bool, cross_attention: bool,
               rngs: nnx.Rngs, embed_width: int | None = None, sparse_step: int = 0):
    self.cfg, self.num_layers, self.causal = cfg, num_layers, causal
    embed_cfg = cfg if embed_width is None else dataclasses.replace(cfg, d_model=embed_width)
    if cfg.position == 't5_relative' and not cfg.relative_bias_per_layer:
      self.relative_bias = RelativePositionBias(cfg, bidirectional=not causal, rngs=rngs)
    if cfg.position == 'learned':
      self.position_embedding = Embed(cfg.max_length, embed_cfg.d_model, (None, 'embed'),
                                      std=0.02, cfg=cfg, rngs=rngs)
    if cfg.next_sentence:
      self.type_embedding = Embed(2, embed_cfg.d_model, (None, 'embed'), std=0.02, cfg=cfg,
                                  rngs=rngs)
    if cfg.embed_norm:
      self.embed_norm = Norm(embed_cfg, rngs=rngs)
    self.embed_projection = None if embed_cfg.d_model == cfg.d_model else Dense(
        (embed_cfg.d_model,), (cfg.d_model,), ('embed', 'mlp'), std=embed_cfg.d_model**-0.5,
        cfg=cfg, rngs=rngs)
    self.layers = make_layers(cfg, num_layers, cross_attention=cross_attention, rngs=rngs,
                              sparse_step=sparse_step, causal=causal)
    if cfg.norm_position == 'pre':
      self.final_norm = Norm(cfg, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout)

  def __call__(self, x: jax.Array, features: Features, *, encoded: jax.Array | None = None,
               encoder: Features | None = None, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    """x (b, l, d) embedded tokens -> (b, l, d); encoded/encoder feed cross-attention."""
    length = x.shape[1]
    x = self._embed_extras(x, features.absolute_positions(), features.token_types)
    x = constrain(self.dropout(x, deterministic=deterministic, rngs=rngs), EMBED)
    if self.embed_projection is not None:
      x = constrain(self.embed_projection(x), EMBED)
    flash = self.cfg.attention == 'flash'  # ids and the bias table, not (q, k) arrays
    # rows of one example: lengths and a causal flag, no (q, k) mask
    one_example_rows = features.segment_ids is None and features.bidirectional is None
    mask = (attention_layout if flash else padded_rows
            if one_example_rows and self.cfg.attention in ('auto', 'xla', 'cudnn')
            else attention_mask)

    def bias_of(table: RelativePositionBias) -> jax.Array | BucketedBias:
      return table.bucketed() if flash else table(length, length)

    inputs = LayerInputs(
        bias_of=bias_of, bias=self._stack_bias(bias_of),
        mask=mask(length, None if self.causal else features.tokens > 0,
                  query_segment_ids=features.segment_ids, key_segment_ids=features.segment_ids,
                  causal=self.causal, prefix=features.bidirectional),
        positions=features.absolute_positions() if self.cfg.position == 'rope' else None)
    if encoded is not None:
      inputs = inputs._replace(encoded=encoded, cross_mask=mask(
          length, encoder.tokens > 0, query_segment_ids=features.segment_ids,
          key_segment_ids=encoder.segment_ids))
    use_dropout = not deterministic and self.cfg.differs_in_training
    keys = jax.random.split(rngs.dropout(), self.num_layers) if use_dropout else None
    x = self._apply_layers(x, inputs, keys, deterministic)
    if self.cfg.norm_position == 'pre':
      x = self.dropout(self.final_norm(x), deterministic=deterministic, rngs=rngs)
    return x

  def apply_with_cache(self, x: jax.Array, index: jax.Array, cache: DecodeCache
                       ) -> tuple[jax.Array, DecodeCache]:
    """x (b, l, d): embedded tokens at cache positions index, ..., index + l - 1 -> (b, l, d)
    and the cache holding their keys and values. The bias and positions are those of the full
    forward pass at these positions, so decoding step by step computes what it computes."""
    length = x.shape[1]
    slots = index + jnp.arange(length)  # (l,) cache positions of the new tokens
    positions = jnp.maximum(slots[None, :] - cache.start[:, None], 0)  # (b, l); padding at 0
    x = constrain(self._embed_extras(x, positions), EMBED)
    keys = jnp.arange(cache.length)
    # A token sees its own row's keys from the start token up to itself: (b, l, length).
    visible = (keys >= cache.start[:, None, None]) & (keys <= slots[:, None])

    def bias_of(table: RelativePositionBias) -> jax.Array:
      return table(length, cache.length, index)

    inputs = LayerInputs(
        mask=visible[:, None],  # (b, l, length) -> (b, 1, l, length)
        bias=self._stack_bias(bias_of), bias_of=bias_of,
        positions=positions if self.cfg.position == 'rope' else None,
        cross_mask=(None if cache.encoder_valid is None
                    else cache.encoder_valid[:, None, None, :]),  # (b, m) -> (b, 1, 1, m)
        index=index)
    if self.cfg.scan_layers:
      def body(y, block, layer):
        return block(y, inputs, None, deterministic=True, cache=layer)

      scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 1), out_axes=(nnx.Carry, 1),
                      transform_metadata={nnx.PARTITION_NAME: 'layers'})
      x, layers = scan(x, self.layers, cache.layers)
    else:
      layers = []
      for block, layer in zip(self.layers, cache.layers):
        x, layer = block(x, inputs, None, deterministic=True, cache=layer)
        layers.append(layer)
      layers = tuple(layers)
    if self.cfg.norm_position == 'pre':
      x = self.final_norm(x)
    return x, cache._replace(layers=layers)

  def _stack_bias(self, bias_of) -> jax.Array | BucketedBias | None:
    """The bias of the stack's one table, which all its layers share; None without one."""
    return bias_of(self.relative_bias) if hasattr(self, 'relative_bias') else None

  def init_layer_caches(self, batch_size: int, length: int, encoded: jax.Array | None = None
                        ) -> tuple[LayerCache, ...] | LayerCache:
    """Empty self-attention keys and values for `length` positions, and cross-attention's
    computed from `encoded` (b, m, d) when given."""
    def layer_cache(block):
      if isinstance(block, LayerGroup):  # (b, sparse_step, length, h, kv) per leaf
        return jax.tree.map(lambda *caches: jnp.stack(caches, axis=1),
                            *map(layer_cache, block.blocks))
      empty = jnp.zeros((batch_size, length, self.cfg.num_heads, self.cfg.d_kv), self.cfg.dtype)
      if encoded is None:
        return LayerCache(empty, empty)
      return LayerCache(empty, empty, *block.cross_attention.keys_values(encoded))

    if self.cfg.scan_layers:
      return nnx.vmap(layer_cache, in_axes=0, out_axes=1,
                      transform_metadata={nnx.PARTITION_NAME: 'layers'})(self.layers)
    return tuple(layer_cache(block) for block in self.layers)

  def _embed_extras(self, x: jax.Array, positions: jax.Array,
                    token_types: jax.Array | None = None) -> jax.Array:
    """x plus the sinusoidal or learned encoding of positions (b, l) (nothing for relative or
    RoPE) and of BERT's token types (type 0 if not given), then the embedding norm if any."""
    if self.cfg.position == 'sinusoidal':
      x = x + sinusoidal_positions(positions, x.shape[-1]).astype(x.dtype)
    if self.cfg.position == 'learned':
      if positions.shape[1] > self.cfg.max_length:
        raise ValueError(f'sequence length {positions.shape[1]} exceeds model.max_length='
                         f'{self.cfg.max_length} of the learned position table')
      x = x + self.position_embedding(positions).astype(x.dtype)
    if self.cfg.next_sentence:
      x = x + self.type_embedding(jnp.zeros_like(positions) if token_types is None
                                  else token_types).astype(x.dtype)
    return self.embed_norm(x) if self.cfg.embed_norm else x

  def _apply_layers(self, x, inputs, keys, deterministic):
    """Runs the layers in order, scanned or unrolled, each under the remat policy."""
    def apply(block, y, key):
      return block(y, inputs, key, deterministic=deterministic)

    if self.cfg.remat_policy != 'none':
      apply = nnx.remat(apply, policy=CHECKPOINT_POLICIES[self.cfg.remat_policy])
    if self.cfg.scan_layers:
      def body(y, block, key):
        return apply(block, y, key)

      if keys is not None and isinstance(self.layers, LayerGroup):
        # (layers, ...) -> (groups, sparse_step, ...)
        keys = keys.reshape(-1, len(self.layers.blocks), *keys.shape[1:])

      scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=nnx.Carry,
                      unroll=self.cfg.scan_unroll,
                      transform_metadata={nnx.PARTITION_NAME: 'layers'})
      return scan(x, self.layers, keys)
    for i, block in enumerate(self.layers):
      x = apply(block, x, None if keys is None else keys[i])
    return x


class MlmTransform(nnx.Module):
  """BERT's and RoBERTa's MLM head before the output projection (`model.mlm_transform`): dense,
  activation, norm; and the bias per vocabulary entry that a tied projection lacks (an untied lm
  head has its own). ELECTRA's generator reads `d_in`-wide hidden states with `activation`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, d_in: int | None = None,
               activation: str | None = None):
    d_in = d_in or cfg.d_model
    self.dense = Dense((d_in,), (cfg.d_model,), ('embed', 'mlp'), std=d_in**-0.5, cfg=cfg,
                       rngs=rngs)
    if activation is None:
      activation = ('gelu_erf' if cfg.mlm_transform == 'roberta'
                    else cfg.activation.removeprefix('gated-'))
    self.act = ACTIVATION_FUNCTIONS[activation]
    self.norm = Norm(cfg, rngs=rngs)
    self.output_bias = (param(rngs, jax.nn.initializers.zeros, (cfg.vocab_size,), ('vocab',), cfg)
                        if cfg.use_bias and cfg.tie_embeddings else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.norm(self.act(self.dense(x)))  # (b, l, d) -> (b, l, d)


def output_logits(cfg: ModelConfig, embed: Embed, lm_head: Dense | None, x: jax.Array,
                  mlm_transform: MlmTransform | None = None) -> jax.Array:
  """Float32 vocabulary logits: the tied embedding with T5's d_model**-0.5 rescaling, or lm_head;
  with `mlm_transform`, of the transformed x, plus its output bias."""
  if mlm_transform is not None:
    x = mlm_transform(x)
  if cfg.tie_embeddings:
    logits = embed.attend(x * cfg.d_model**-0.5)  # (b, l, d) -> (b, l, v)
  else:
    logits = lm_head(x)  # (b, l, d) -> (b, l, v)
  if mlm_transform is not None and mlm_transform.output_bias is not None:
    logits = logits + mlm_transform.output_bias[...]
  return constrain(logits.astype(jnp.float32), ('batch', 'length', 'vocab'))


def shared_parts(cfg: ModelConfig, rngs: nnx.Rngs) -> tuple[Embed, Dense | None, nnx.Rngs]:
  """The token embedding, the untied lm head (or None) and the dropout RNG stream."""
  embed = Embed(cfg.vocab_size, cfg.d_model, ('vocab', 'embed'), std=1.0, cfg=cfg, rngs=rngs)
  lm_head = None if cfg.tie_embeddings else Dense(
      (cfg.d_model,), (cfg.vocab_size,), ('embed', 'vocab'), std=cfg.d_model**-0.5, cfg=cfg,
      rngs=rngs)
  return embed, lm_head, nnx.Rngs(dropout=rngs.dropout())


class LanguageModel(nnx.Module):
  """The call the language models share, `logits = model(batch)`, split at the final hidden states
  (each family's `hidden_states`) so that a loss can project them chunk by chunk with `lm_logits`
  (`train.loss_chunks`) instead of holding every (b, l, vocab) logit at once."""

  def lm_logits(self, x: jax.Array) -> jax.Array:
    """(b, l, d) final hidden states -> (b, l, vocab) float32 logits."""
    return output_logits(self.cfg, self.embed, self.lm_head, x)

  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    return self.lm_logits(self.hidden_states(batch, deterministic=deterministic, rngs=rngs))


def next_token_logits(model: LanguageModel, tokens: jax.Array, index: jax.Array,
                      cache: DecodeCache) -> tuple[jax.Array, DecodeCache]:
  """tokens (b, l) at cache positions index, ..., index + l - 1 through `model.decoder` ->
  float32 logits (b, vocab) of the token after the last one, and the cache with their keys and
  values written."""
  x, cache = model.decoder.apply_with_cache(model.embed(tokens), index, cache)
  return model.lm_logits(x[:, -1:])[:, 0], cache
