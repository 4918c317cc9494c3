"""model.arch='encoder_decoder': T5 (and Vaswani et al., BART, LongT5), a bidirectional encoder
read by a causal decoder; T5ForConditionalGeneration (ByT5's too), MT5ForConditionalGeneration,
UMT5ForConditionalGeneration, with learned positions BartForConditionalGeneration, and with a
LongT5 encoder (`model.encoder_attention`) LongT5ForConditionalGeneration, both ways.

Hugging Face keeps T5's relative attention bias only in block 0 of each stack, as we keep one
table per stack (LongT5 too, with TGlobal's side bias table, while each of its encoder layers
has its own layer norm of the global tokens); UMT5 has one in every layer
(`model.relative_bias_per_layer`). Tied heads: T5 v1.0 ties the lm head to the shared embedding
and rescales by d_model**-0.5 (`tie_word_embeddings: true`). v1.1 has its own lm head and no
rescaling. transformers 5.x may tie an unscaled head to the embedding (`scale_decoder_outputs:
false`); such a checkpoint imports as an untied head holding a copy of the embedding, which
computes the same logits.

mT5 is T5 v1.1 with a 250,112-id vocabulary: the same weights, exported as MT5 where
`model.hf_model_type='mt5'` (MT5ForConditionalGeneration never rescales: only an untied head).
transformers 5.23's UMT5ForConditionalGeneration rescales the decoder's output by d_model**-0.5
before its lm head whatever config.json says (UMT5Config forces tie_word_embeddings): an untied
head is exported times sqrt(d_model) and imported divided by it, so that its logits are ours; a
checkpoint without its own lm_head is a tied, rescaled (v1.0) head.

BART is BERT's layers in both stacks. HF's position p reads row p + 2 of its tables: the 2 rows
before ours are written as zeros and dropped on import. BART's tied head has no d_model**-0.5
and post-LN no final norm: the last decoder layer's final_layer_norm, read by the head alone,
carries ours (weight and bias), and final_logits_bias is zeros. A checkpoint that multiplies its
embeddings by sqrt(d_model) (`scale_embedding`) imports with the factor in our embedding, and out
of that norm, since the tied head reads it too. Token ids are T5's: the decoder starts from 0,
the pad id, and ends with EOS 1, nothing forced, so HF's `generate()` decodes as ours.
"""

from collections.abc import Mapping
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models import architecture, experts, hf_mapping, switch
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import FEED_FORWARD_PROJ, HfModel, Row
from t5lite.models.transformer import DecodeCache, Features, LanguageModel, Stack, shared_parts
from t5lite.token_ids import EOS_ID, PAD_ID


class EncoderDecoder(LanguageModel):
  """T5 (and Vaswani et al., BART): a bidirectional encoder read by a causal decoder."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    # one embedding table for both stacks (and the tied lm head)
    self.embed, self.lm_head, self.rngs = shared_parts(cfg, rngs)
    steps = experts.sparse_steps(cfg)  # the Switch Transformer's experts, every step layers
    self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                         rngs=rngs, sparse_step=steps['encoder'])
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=True,
                         rngs=rngs, sparse_step=steps['decoder'])

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
  """The encoder (dense or LongT5's) over the inputs; the decoder (causal self-attention,
  cross-attention to all inputs) and the lm head over the targets."""
  steps = experts.sparse_steps(cfg)
  return Shapes((StackShape(cfg, cfg.num_encoder_layers, inputs_length, causal=False,
                            sparse_layers=experts.num_sparse(cfg.num_encoder_layers,
                                                             steps['encoder']),
                            long_inputs=cfg.encoder_attention != 'dense'),
                 StackShape(cfg, cfg.num_decoder_layers, targets_length, causal=True,
                            cross_length=inputs_length,
                            sparse_layers=experts.num_sparse(cfg.num_decoder_layers,
                                                             steps['decoder']))),
                logits_length=targets_length)


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_encoder_layers', 'num_decoder_layers')
  architecture.refuse_encoder_heads(cfg)
  experts.check(cfg, {'encoder': cfg.num_encoder_layers, 'decoder': cfg.num_decoder_layers})


T5_FIELDS = dict(position='t5_relative', norm='rms', norm_position='pre', use_bias=False)
DENSE_T5_FIELDS = dict(T5_FIELDS, encoder_attention='dense')  # LongT5's is another class


def t5_check(cfg: ModelConfig) -> None:
  hf_mapping.check_fields(cfg, 'T5', {**DENSE_T5_FIELDS, 'relative_bias_per_layer': False})


def mt5_check(cfg: ModelConfig) -> None:
  hf_mapping.check_fields(cfg, 'MT5', {**DENSE_T5_FIELDS, 'relative_bias_per_layer': False,
                                       'tie_embeddings': False})


def umt5_check(cfg: ModelConfig) -> None:
  hf_mapping.check_fields(cfg, 'UMT5', DENSE_T5_FIELDS)


def t5_table(cfg: ModelConfig, head_scale: float = 1.0,
             encoder_attention: str = 'SelfAttention') -> list[Row]:
  """Every tensor of T5ForConditionalGeneration (and MT5's, UMT5's: a bias table in every layer
  where relative_bias_per_layer; LongT5's: its encoder's attention so named); HF's untied head
  carries `head_scale` over ours."""
  rows = [Row(('embed', 'embedding'), 'shared.weight', 0)]
  if not cfg.tie_embeddings:
    rows.append(Row(('lm_head', 'kernel'), 'lm_head.weight', 1, head_scale))
  mlp = ('wi_0', 'wi_1', 'wo') if cfg.is_gated else ('wi', 'wo')
  stacks = (('encoder', cfg.num_encoder_layers, (('self_attention', encoder_attention),)),
            ('decoder', cfg.num_decoder_layers, (('self_attention', 'SelfAttention'),
                                                 ('cross_attention', 'EncDecAttention'))))
  for stack, num_layers, attentions in stacks:
    rows.append(Row((stack, 'final_norm', 'scale'), f'{stack}.final_layer_norm.weight', 0))
    bias = f'layer.0.{attentions[0][1]}.relative_attention_bias.weight'
    if not cfg.relative_bias_per_layer:
      rows.append(Row((stack, 'relative_bias', 'embedding'), f'{stack}.block.0.{bias}', 0))
    for i in range(num_layers):
      ours, theirs = (stack, 'layers', i), f'{stack}.block.{i}.layer'
      if cfg.relative_bias_per_layer:
        rows.append(Row((*ours, 'relative_bias', 'embedding'), f'{stack}.block.{i}.{bias}', 0))
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


def t5_config(cfg: ModelConfig) -> dict[str, Any]:
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


def umt5_table(cfg: ModelConfig) -> list[Row]:
  """UMT5's tensors: transformers rescales its head's input by d_model**-0.5, its untied head
  carries sqrt(d_model) over ours."""
  return t5_table(cfg, head_scale=cfg.d_model**0.5)


def mt5_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """MT5 never rescales its head: T5's fields as if untied (a tied head imports as a copy)."""
  fields, tensors = t5_load({**config, 'tie_word_embeddings': False}, tensors)
  return {**fields, 'hf_model_type': 'mt5'}, tensors


def umt5_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
              ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """UMT5 always rescales (module docstring): its own lm_head, unlike the embedding, is an
  untied head; without one the head is tied."""
  head, shared = tensors.get('lm_head.weight'), tensors.get('shared.weight')
  untied = head is not None and not np.array_equal(head, shared)
  fields, tensors = t5_load({**config, 'tie_word_embeddings': not untied}, tensors)
  return {**fields, 'relative_bias_per_layer': True}, tensors


def t5_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
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
  for stack in ('encoder', 'decoder'):  # transformers 5 unties them where the head is untied
    embedding = tensors.get(f'{stack}.embed_tokens.weight')
    if embedding is not None and not np.array_equal(embedding, tensors.get('shared.weight')):
      raise ValueError(f'checkpoint has its own {stack}.embed_tokens.weight, not shared.weight; '
                       'only one embedding shared by both stacks is supported')
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


# How LongT5 pretrained (Guo et al. 2022), and an imported one continues: 4,096 inputs and 910
# targets (span corruption's for 4,096 inputs) of PEGASUS's principal sentences, 20% at most
LONGT5_PRETRAINING = dict(objective='principal_sentences', noise_density=0.2, inputs_length=4096,
                          targets_length=910)
# LongT5's encoder attention: ours -> Hugging Face's encoder_attention_type and its layer's name
LONGT5_ATTENTIONS = {'local': ('local', 'LocalSelfAttention'),
                     'transient_global': ('transient-global', 'TransientGlobalSelfAttention')}


def longt5_check(cfg: ModelConfig) -> None:
  hf_mapping.check_fields(cfg, 'LongT5', T5_FIELDS)


def longt5_table(cfg: ModelConfig) -> list[Row]:
  """Every tensor of LongT5ForConditionalGeneration: T5's, and TGlobal's side bias table (block 0,
  as the local one) and each layer's layer norm of the global tokens."""
  name = LONGT5_ATTENTIONS[cfg.encoder_attention][1]
  rows = t5_table(cfg, encoder_attention=name)
  if cfg.encoder_attention == 'transient_global':
    rows.append(Row(('encoder', 'global_bias', 'embedding'),
                    f'encoder.block.0.layer.0.{name}.global_relative_attention_bias.weight', 0))
    rows += [Row(('encoder', 'layers', i, 'self_attention', 'global_norm', 'scale'),
                 f'encoder.block.{i}.layer.0.{name}.global_input_layer_norm.weight', 0)
             for i in range(cfg.num_encoder_layers)]
  return rows


def longt5_config(cfg: ModelConfig) -> dict[str, Any]:
  return {**t5_config(cfg), 'encoder_attention_type': LONGT5_ATTENTIONS[cfg.encoder_attention][0],
          'local_radius': cfg.local_radius, 'global_block_size': cfg.global_block_size}


def longt5_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
                ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """T5's fields and LongT5's encoder attention, its radius and global block size."""
  kind = config.get('encoder_attention_type', 'local')  # LongT5Config's default
  ours = {theirs: name for name, (theirs, _) in LONGT5_ATTENTIONS.items()}
  if kind not in ours:
    raise ValueError(f'unsupported LongT5 encoder_attention_type={kind!r}; expected one of '
                     f'{", ".join(ours)}')
  fields, tensors = t5_load(config, tensors)
  return dict(fields, encoder_attention=ours[kind], local_radius=config.get('local_radius', 127),
              global_block_size=config.get('global_block_size', 16)), tensors


BART_NORM_EPS = 1e-5  # HF's nn.LayerNorm default, which BartConfig does not set
BART_POSITION_OFFSET = 2  # HF's position p reads row p + 2
BART_PROJECTIONS = {'q': 'q_proj', 'k': 'k_proj', 'v': 'v_proj', 'o': 'out_proj'}
# config.json fields that must have these values: a tied head, and fairseq's pre-LN options, which
# old config.json files carry and transformers ignores (a checkpoint trained with them set does not
# compute in HF's BART what it was trained to)
BART_FIXED = dict(tie_word_embeddings=True, normalize_before=False, add_final_layer_norm=False)
BART_REQUIRED = ('vocab_size', 'd_model', 'max_position_embeddings', 'encoder_layers',
                 'decoder_layers', 'encoder_attention_heads', 'decoder_attention_heads',
                 'encoder_ffn_dim', 'decoder_ffn_dim')


def bart_check(cfg: ModelConfig) -> None:
  hf_mapping.check_bert_layers(cfg, 'BART', norm_eps=BART_NORM_EPS)


def bart_table(cfg: ModelConfig) -> list[Row]:
  """Every tensor of BartForConditionalGeneration but final_logits_bias (`bart_zero_logits_bias`);
  its lm_head is tied to model.shared."""
  rows = [Row(('embed', 'embedding'), 'model.shared.weight', 0)]
  stacks = (('encoder', cfg.num_encoder_layers, {'self_attention': 'self_attn'}),
            ('decoder', cfg.num_decoder_layers, {'self_attention': 'self_attn',
                                                 'cross_attention': 'encoder_attn'}))
  for stack, num_layers, attentions in stacks:
    rows += [Row((stack, 'position_embedding', 'embedding'),
                 f'model.{stack}.embed_positions.weight', 0, leading_rows=BART_POSITION_OFFSET),
             *hf_mapping.layer_norm((stack, 'embed_norm'), f'model.{stack}.layernorm_embedding')]
    for i in range(num_layers):
      ours, theirs = (stack, 'layers', i), f'model.{stack}.layers.{i}'
      for attention, hf_attention in attentions.items():
        rows += hf_mapping.scaled_attention(
            (*ours, attention),
            {p: f'{theirs}.{hf_attention}.{name}' for p, name in BART_PROJECTIONS.items()},
            cfg.d_kv)
        rows += hf_mapping.layer_norm((*ours, f'{attention}_norm'),
                                      f'{theirs}.{hf_attention}_layer_norm')
      rows += hf_mapping.linear((*ours, 'mlp', 'wi'), f'{theirs}.fc1')
      rows += hf_mapping.linear((*ours, 'mlp', 'wo'), f'{theirs}.fc2')
      head_input = stack == 'decoder' and i == num_layers - 1  # carries the head's factor
      rows += hf_mapping.layer_norm((*ours, 'mlp_norm'), f'{theirs}.final_layer_norm',
                                    cfg.d_model**-0.5 if head_input else 1.0)
  return rows


def bart_config(cfg: ModelConfig) -> dict[str, Any]:
  return {
      'vocab_size': cfg.vocab_size, 'd_model': cfg.d_model,
      'max_position_embeddings': cfg.max_length,
      'encoder_layers': cfg.num_encoder_layers, 'decoder_layers': cfg.num_decoder_layers,
      'encoder_attention_heads': cfg.num_heads, 'decoder_attention_heads': cfg.num_heads,
      'encoder_ffn_dim': cfg.d_ff, 'decoder_ffn_dim': cfg.d_ff,
      'activation_function': FEED_FORWARD_PROJ[cfg.activation], 'dropout': cfg.dropout,
      'activation_dropout': cfg.dropout, 'attention_dropout': 0.0, 'encoder_layerdrop': 0.0,
      'decoder_layerdrop': 0.0, 'scale_embedding': False, 'tie_word_embeddings': True,
      'is_encoder_decoder': True, 'use_cache': True, 'pad_token_id': PAD_ID, 'bos_token_id': None,
      'eos_token_id': EOS_ID, 'decoder_start_token_id': PAD_ID, 'forced_bos_token_id': None,
      'forced_eos_token_id': None, 'dtype': 'float32',
  }


def bart_zero_logits_bias(cfg: ModelConfig) -> dict[str, np.ndarray]:
  return {'final_logits_bias': np.zeros((1, cfg.vocab_size), np.float32)}


def bart_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
              ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Our ModelConfig fields for an HF BART config. A BartModel checkpoint (no 'model.' prefix)
  imports too; attention dropout, which ours lacks, is dropped."""
  activation = _check_bart_config(config)
  if 'model.shared.weight' not in tensors:
    tensors = {f'model.{name}': value for name, value in tensors.items()}
  if np.any(tensors.get('final_logits_bias', 0)):
    raise ValueError("unsupported BART final_logits_bias other than zeros; ours has no such bias")
  if config.get('scale_embedding', False):
    tensors = _fold_embedding_scale(config, tensors)
  fields = dict(
      vocab_size=config['vocab_size'], d_model=config['d_model'], d_ff=config['encoder_ffn_dim'],
      num_heads=config['encoder_attention_heads'],
      d_kv=config['d_model'] // config['encoder_attention_heads'],
      num_encoder_layers=config['encoder_layers'], num_decoder_layers=config['decoder_layers'],
      activation=activation,
      max_length=config['max_position_embeddings'], dropout=config.get('dropout', 0.1),
      **hf_mapping.BERT_LAYERS, norm_eps=BART_NORM_EPS)
  return fields, tensors


def _check_bart_config(config: dict[str, Any]) -> str:
  """Refuses in one line a BART config.json that is not a model of ours; returns our activation."""
  activation = hf_mapping.check_hf_config(config, 'BART', BART_REQUIRED, BART_FIXED,
                                          default_activation='gelu')
  for part in ('attention_heads', 'ffn_dim'):
    encoder, decoder = config[f'encoder_{part}'], config[f'decoder_{part}']
    if encoder != decoder:
      raise ValueError(f'unsupported BART encoder_{part}={encoder} with decoder_{part}={decoder}; '
                       'our stacks share num_heads and d_ff')
  return activation


def _fold_embedding_scale(config: dict[str, Any], tensors: dict[str, np.ndarray]
                          ) -> dict[str, np.ndarray]:
  """The tensors of a BART that scales its embeddings by sqrt(d_model), as those of one that does
  not: the factor moves into the embedding and, as the tied head reads it too, out of the last
  decoder layer's final_layer_norm."""
  factor = config['d_model']**0.5
  last = f'model.decoder.layers.{config["decoder_layers"] - 1}.final_layer_norm'
  factors = {'model.shared.weight': factor, f'{last}.weight': 1 / factor,
             f'{last}.bias': 1 / factor}
  return {**tensors, **{name: np.asarray(tensors[name], np.float32) * f
                        for name, f in factors.items() if name in tensors}}


T5 = HfModel('T5', 'T5ForConditionalGeneration', 't5', check=t5_check, config=t5_config,
             table=t5_table, text=hf_mapping.T5_TEXT, load=t5_load,
             fits=lambda cfg: not cfg.relative_bias_per_layer)
FAMILY = Family(
    arch='encoder_decoder', model=EncoderDecoder, sides=('encoder', 'decoder'), objective=None,
    stacks=('encoder', 'decoder'), shapes=shapes, check=check, prompt='encoder', experts=True,
    hf=(switch.hf_model(T5),  # with sparse experts
        HfModel('BART', 'BartForConditionalGeneration', 'bart', check=bart_check,
                config=bart_config, table=bart_table, text=hf_mapping.T5_TEXT,
                extra=bart_zero_logits_bias, load=bart_load,
                fits=lambda cfg: cfg.position == 'learned',
                data=lambda cfg: dict(objective='bart', inputs_length=min(cfg.max_length, 512),
                                      targets_length=min(cfg.max_length, 512))),
        HfModel('LongT5', 'LongT5ForConditionalGeneration', 'longt5', check=longt5_check,
                config=longt5_config, table=longt5_table, text=hf_mapping.T5_TEXT,
                load=longt5_load, fits=lambda cfg: cfg.encoder_attention != 'dense',
                data=lambda cfg: LONGT5_PRETRAINING),
        HfModel('UMT5', 'UMT5ForConditionalGeneration', 'umt5', check=umt5_check,
                config=t5_config, table=umt5_table, text=hf_mapping.T5_TEXT, load=umt5_load,
                fits=lambda cfg: cfg.relative_bias_per_layer),
        HfModel('MT5', 'MT5ForConditionalGeneration', 'mt5', check=mt5_check,
                config=t5_config, table=t5_table, text=hf_mapping.T5_TEXT, load=mt5_load,
                fits=lambda cfg: cfg.hf_model_type == 'mt5'),
        T5))
