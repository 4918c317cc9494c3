"""model.arch='encoder_decoder': T5 (and Vaswani et al., BART), a bidirectional encoder read by a
causal decoder, and T5ForConditionalGeneration both ways.

Hugging Face keeps T5's relative attention bias only in block 0 of each stack, as we keep one
table per stack. Tied heads: T5 v1.0 ties the lm head to the shared embedding and rescales by
d_model**-0.5 (`tie_word_embeddings: true`). v1.1 has its own lm head and no rescaling.
transformers 5.x may tie an unscaled head to the embedding (`scale_decoder_outputs: false`); such
a checkpoint imports as an untied head holding a copy of the embedding, which computes the same
logits.
"""

from collections.abc import Mapping
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models import architecture, hf_mapping
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import FEED_FORWARD_PROJ, HfModel, Row
from t5lite.models.transformer import DecodeCache, Features, LanguageModel, Stack, shared_parts


class EncoderDecoder(LanguageModel):
  """T5 (and Vaswani et al., BART): a bidirectional encoder read by a causal decoder."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    # one embedding table for both stacks (and the tied lm head)
    self.embed, self.lm_head, self.rngs = shared_parts(cfg, rngs)
    self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                         rngs=rngs)
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=True,
                         rngs=rngs)

  def encode(self, encoder: Features, *, deterministic: bool = True,
             rngs: nnx.Rngs | None = None) -> jax.Array:
    """Encoder tokens -> (b, m, d) encoded states."""
    return self.encoder(self.embed(encoder.tokens), encoder, deterministic=deterministic,
                        rngs=self.rngs if rngs is None else rngs)

  def decoder_logits(self, encoded: jax.Array, encoder: Features, decoder: Features, *,
                     deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
    """Decoder input tokens (shifted right) attending to `encoded` -> (b, l, vocab) logits."""
    return self.lm_logits(self.decoder_hidden_states(encoded, encoder, decoder,
                                                     deterministic=deterministic, rngs=rngs))

  def decoder_hidden_states(self, encoded: jax.Array, encoder: Features, decoder: Features, *,
                            deterministic: bool = True, rngs: nnx.Rngs | None = None
                            ) -> jax.Array:
    """As `decoder_logits`, up to the decoder's final (b, l, d) hidden states."""
    return self.decoder(self.embed(decoder.tokens), decoder, encoded=encoded, encoder=encoder,
                        deterministic=deterministic, rngs=self.rngs if rngs is None else rngs)

  def hidden_states(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
                    rngs: nnx.Rngs | None = None) -> jax.Array:
    """The batch -> the decoder's final (b, l, d) hidden states."""
    encoder = Features.from_batch(batch, 'encoder')
    encoded = self.encode(encoder, deterministic=deterministic, rngs=rngs)
    return self.decoder_hidden_states(encoded, encoder, Features.from_batch(batch, 'decoder'),
                                      deterministic=deterministic, rngs=rngs)

  def init_cache(self, encoder_tokens: jax.Array, length: int) -> DecodeCache:
    """A cache for decoding `length` tokens (start token included) from encoder_tokens (b, m),
    which are encoded once here into the cross-attention keys and values."""
    encoded = self.encode(Features(encoder_tokens))
    batch_size = encoder_tokens.shape[0]
    return DecodeCache(self.decoder.init_layer_caches(batch_size, length, encoded),
                       start=jnp.zeros((batch_size,), jnp.int32),
                       encoder_valid=encoder_tokens > 0)


def shapes(cfg: ModelConfig, inputs_length: int, targets_length: int) -> Shapes:
  """The encoder over the inputs; the decoder (causal self-attention, cross-attention to all
  inputs) and the lm head over the targets."""
  return Shapes((StackShape(cfg, cfg.num_encoder_layers, inputs_length, causal=False),
                 StackShape(cfg, cfg.num_decoder_layers, targets_length, causal=True,
                            cross_length=inputs_length)),
                logits_length=targets_length)


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_encoder_layers', 'num_decoder_layers')
  architecture.refuse_next_sentence(cfg)


T5_FIELDS = dict(position='t5_relative', norm='rms', norm_position='pre', use_bias=False)


def hf_check(cfg: ModelConfig) -> None:
  hf_mapping.check_fields(cfg, 'T5', T5_FIELDS)


def hf_table(cfg: ModelConfig) -> list[Row]:
  """Every tensor of T5ForConditionalGeneration."""
  rows = [Row(('embed', 'embedding'), 'shared.weight', 0)]
  if not cfg.tie_embeddings:
    rows.append(Row(('lm_head', 'kernel'), 'lm_head.weight', 1))
  mlp = ('wi_0', 'wi_1', 'wo') if cfg.is_gated else ('wi', 'wo')
  stacks = (('encoder', cfg.num_encoder_layers, (('self_attention', 'SelfAttention'),)),
            ('decoder', cfg.num_decoder_layers, (('self_attention', 'SelfAttention'),
                                                 ('cross_attention', 'EncDecAttention'))))
  for stack, num_layers, attentions in stacks:
    rows += [Row((stack, 'final_norm', 'scale'), f'{stack}.final_layer_norm.weight', 0),
             Row((stack, 'relative_bias', 'embedding'),
                 f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight', 0)]
    for i in range(num_layers):
      ours, theirs = (stack, 'layers', i), f'{stack}.block.{i}.layer'
      for j, (attention, hf_attention) in enumerate(attentions):
        rows += [Row((*ours, attention, p, 'kernel'), f'{theirs}.{j}.{hf_attention}.{p}.weight',
                     2 if p == 'o' else 1) for p in 'qkvo']
        rows.append(Row((*ours, f'{attention}_norm', 'scale'), f'{theirs}.{j}.layer_norm.weight',
                        0))
      j = len(attentions)
      rows += [Row((*ours, 'mlp', w, 'kernel'), f'{theirs}.{j}.DenseReluDense.{w}.weight', 1)
               for w in mlp]
      rows.append(Row((*ours, 'mlp_norm', 'scale'), f'{theirs}.{j}.layer_norm.weight', 0))
  return rows


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  return {
      'vocab_size': cfg.vocab_size, 'd_model': cfg.d_model, 'd_kv': cfg.d_kv, 'd_ff': cfg.d_ff,
      'num_heads': cfg.num_heads, 'num_layers': cfg.num_encoder_layers,
      'num_decoder_layers': cfg.num_decoder_layers,
      'relative_attention_num_buckets': cfg.relative_buckets,
      'relative_attention_max_distance': cfg.relative_max_distance,
      'feed_forward_proj': FEED_FORWARD_PROJ[cfg.activation],
      'layer_norm_epsilon': cfg.norm_eps, 'dropout_rate': cfg.dropout, 'initializer_factor': 1.0,
      'tie_word_embeddings': cfg.tie_embeddings, 'is_encoder_decoder': True, 'use_cache': True,
      'pad_token_id': 0, 'eos_token_id': 1, 'decoder_start_token_id': 0, 'dtype': 'float32',
  }


def hf_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
            ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Our ModelConfig fields for an HF T5 config; an unscaled tied head imports as untied, a copy
  of the embedding."""
  required = ('vocab_size', 'd_model', 'd_ff', 'num_heads', 'd_kv', 'num_layers')
  absent = [key for key in required if key not in config]
  if absent:
    raise ValueError(f'T5 config.json misses {", ".join(absent)}')
  activations = {v: k for k, v in FEED_FORWARD_PROJ.items()}
  proj = config.get('feed_forward_proj', 'relu')
  if proj not in activations:
    raise ValueError(f'unsupported T5 feed_forward_proj={proj!r}; expected one of '
                     f'{", ".join(activations)}')
  scaled = config.get('scale_decoder_outputs', config.get('tie_word_embeddings', True))
  if scaled and 'lm_head.weight' in tensors and not np.array_equal(
      tensors['lm_head.weight'], tensors.get('shared.weight')):
    raise ValueError('checkpoint rescales logits by d_model**-0.5 but has its own lm_head; '
                     'only tied+scaled (v1.0) or untied+unscaled (v1.1) heads are supported')
  if not scaled and 'lm_head.weight' not in tensors:  # HF tied an unscaled head
    tensors = {**tensors, 'lm_head.weight': tensors.get('shared.weight')}
  fields = dict(
      vocab_size=config['vocab_size'], d_model=config['d_model'], d_ff=config['d_ff'],
      num_heads=config['num_heads'], d_kv=config['d_kv'], num_encoder_layers=config['num_layers'],
      num_decoder_layers=config.get('num_decoder_layers') or config['num_layers'],
      activation=activations[proj], norm='rms', norm_position='pre',
      norm_eps=config.get('layer_norm_epsilon', 1e-6), position='t5_relative',
      relative_buckets=config.get('relative_attention_num_buckets', 32),
      relative_max_distance=config.get('relative_attention_max_distance', 128),
      tie_embeddings=bool(scaled), use_bias=False, dropout=config.get('dropout_rate', 0.0))
  return fields, tensors


FAMILY = Family(
    arch='encoder_decoder', model=EncoderDecoder, sides=('encoder', 'decoder'), objective=None,
    stacks=('encoder', 'decoder'), shapes=shapes, check=check, prompt='encoder',
    hf=(HfModel('T5', 'T5ForConditionalGeneration', 't5', check=hf_check, config=hf_config,
                table=hf_table, load=hf_load),))
