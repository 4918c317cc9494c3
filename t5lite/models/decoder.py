"""model.arch='decoder': GPT-like decoder-only models (and prefix LMs), and GPT2LMHeadModel both
ways.

GPT-2 is our pre-LN decoder with LayerNorm, biases, learned positions and a tied head. Two factors
move into HF's weights: attention's 1/sqrt(d_kv), which ours folds into the query weights (HF's
query part of c_attn carries sqrt(d_kv), as BERT's tables do), and the tied head's d_model**-0.5,
which GPT-2 lacks (HF's ln_f weight and bias carry it: logits are ours, HF's last hidden state is
ours times d_model**-0.5). A prefix LM exports as well, but HF attends causally over its prefix,
as `decoding.generate` does.

Token ids: as training shifts targets right, `decoding.generate` puts the start token 0 before
each prompt. It is config.json's bos_token_id, so HF's `generate()` without inputs starts from it,
and the exported tokenizer puts it before every text (`hf_mapping.CAUSAL_TEXT`). It is also our
pad id, but config.json names no pad_token_id (nor does OpenAI's GPT-2): HF would infer from it
an attention mask that hides the start token. Batches go to HF left-padded with their
attention_mask, as HF decodes them. EOS 1 ends a row; HF fills the rows that ended with EOS where
ours hold 0, unless `generate()` is given pad_token_id=0 too.
"""

from collections.abc import Mapping
from typing import Any

from flax import nnx
import jax
import numpy as np

from t5lite.models import architecture, hf_mapping
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import FEED_FORWARD_PROJ, HfModel, Row
from t5lite.models.transformer import DecodeCache, Features, LanguageModel, Stack, shared_parts
from t5lite.token_ids import EOS_ID, PAD_ID


class DecoderOnly(LanguageModel):
  """GPT-like: one causal stack over `decoder_input_tokens`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed, self.lm_head, self.rngs = shared_parts(cfg, rngs)
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=False,
                         rngs=rngs)

  def hidden_states(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
                    rngs: nnx.Rngs | None = None) -> jax.Array:
    """The batch -> the decoder's final (b, l, d) hidden states."""
    decoder = Features.from_batch(batch, 'decoder')
    return self.decoder(self.embed(decoder.tokens), decoder, deterministic=deterministic,
                        rngs=self.rngs if rngs is None else rngs)

  def init_cache(self, start: jax.Array, length: int) -> DecodeCache:
    """A cache for decoding `length` tokens, prompts included; start (b,) is the position of each
    row's start token, after the left padding of its prompt."""
    return DecodeCache(self.decoder.init_layer_caches(start.shape[0], length), start=start)


def shapes(cfg: ModelConfig, inputs_length: int, targets_length: int) -> Shapes:
  """Everything over one row of inputs and targets, the prefix-LM concatenation (inputs_length 0
  for a plain language model)."""
  length = inputs_length + targets_length
  return Shapes((StackShape(cfg, cfg.num_decoder_layers, length, causal=True),),
                logits_length=length)


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_decoder_layers')
  architecture.refuse_long_encoder(cfg)
  architecture.refuse_encoder_heads(cfg)


GPT2_FIELDS = dict(position='learned', norm='layer', norm_position='pre', use_bias=True,
                   embed_norm=False, tie_embeddings=True)
# GPT2Config fields whose other values change what the model computes, and the values we compute
GPT2_FIXED = dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                  add_cross_attention=False, tie_word_embeddings=True)


def hf_check(cfg: ModelConfig) -> None:
  hf_mapping.check_fields(cfg, 'GPT-2', GPT2_FIELDS)
  hf_mapping.check_ungated_full_width(cfg, 'GPT-2')


def hf_table(cfg: ModelConfig) -> list[Row]:
  """Every tensor of GPT2LMHeadModel (its lm_head is tied to transformer.wte). Conv1D layers;
  c_attn fuses q, k and v."""
  rows = [Row(('embed', 'embedding'), 'transformer.wte.weight', 0),
          Row(('decoder', 'position_embedding', 'embedding'), 'transformer.wpe.weight', 0)]
  for i in range(cfg.num_decoder_layers):
    ours, theirs = ('decoder', 'layers', i), f'transformer.h.{i}'
    rows += hf_mapping.layer_norm((*ours, 'self_attention_norm'), f'{theirs}.ln_1')
    for p in 'qkv':
      rows += hf_mapping.linear((*ours, 'self_attention', p), f'{theirs}.attn.c_attn',
                                scale=cfg.d_kv**0.5 if p == 'q' else 1.0, conv1d=True)
    rows += hf_mapping.linear((*ours, 'self_attention', 'o'), f'{theirs}.attn.c_proj', 2,
                              conv1d=True)
    rows += hf_mapping.layer_norm((*ours, 'mlp_norm'), f'{theirs}.ln_2')
    rows += hf_mapping.linear((*ours, 'mlp', 'wi'), f'{theirs}.mlp.c_fc', conv1d=True)
    rows += hf_mapping.linear((*ours, 'mlp', 'wo'), f'{theirs}.mlp.c_proj', conv1d=True)
  return rows + hf_mapping.layer_norm(('decoder', 'final_norm'), 'transformer.ln_f',
                                      cfg.d_model**-0.5)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  return {
      'vocab_size': cfg.vocab_size, 'n_embd': cfg.d_model, 'n_layer': cfg.num_decoder_layers,
      'n_head': cfg.num_heads, 'n_inner': cfg.d_ff, 'n_positions': cfg.max_length,
      'activation_function': FEED_FORWARD_PROJ[cfg.activation],
      'layer_norm_epsilon': cfg.norm_eps, 'resid_pdrop': cfg.dropout, 'embd_pdrop': cfg.dropout,
      'attn_pdrop': 0.0, **GPT2_FIXED, 'use_cache': True,
      'bos_token_id': PAD_ID, 'eos_token_id': EOS_ID, 'dtype': 'float32',  # PAD_ID: start token
  }


def hf_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
            ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Our ModelConfig fields for an HF GPT-2 config. A GPT2Model checkpoint (OpenAI's) names its
  tensors without the 'transformer.' prefix; attention dropout, which ours lacks, is dropped."""
  activation = hf_mapping.check_hf_config(
      config, 'GPT-2', ('vocab_size', 'n_embd', 'n_layer', 'n_head', 'n_positions'), GPT2_FIXED,
      default_activation='gelu_new')
  if 'transformer.wte.weight' not in tensors:
    tensors = {f'transformer.{name}': value for name, value in tensors.items()}
  fields = dict(
      vocab_size=config['vocab_size'], d_model=config['n_embd'],
      d_ff=config.get('n_inner') or 4 * config['n_embd'], num_heads=config['n_head'],
      d_kv=config['n_embd'] // config['n_head'], num_encoder_layers=0,
      num_decoder_layers=config['n_layer'], activation=activation,
      norm_eps=config.get('layer_norm_epsilon', 1e-5), max_length=config['n_positions'],
      dropout=config.get('resid_pdrop', 0.1), **GPT2_FIELDS)
  return fields, tensors


FAMILY = Family(
    arch='decoder', model=DecoderOnly, sides=('decoder',), objective=None, stacks=('decoder',),
    shapes=shapes, check=check, prompt='decoder',
    hf=(HfModel('GPT-2', 'GPT2LMHeadModel', 'gpt2', check=hf_check, config=hf_config,
                table=hf_table, text=hf_mapping.CAUSAL_TEXT, load=hf_load,
                data=lambda cfg: dict(objective='causal_lm', inputs_length=0,
                                      targets_length=cfg.max_length)),))
