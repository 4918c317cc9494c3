"""Hugging Face export and import: config.json + model.safetensors.

T5 encoder-decoders go both ways (T5ForConditionalGeneration); ELECTRA exports its discriminator
(ElectraForPreTraining), the model ELECTRA pretrains for, and BERT with next-sentence prediction
its encoder, pooler and classifier (BertForNextSentencePrediction; HF's MLM head has a transform
layer ours lacks). The parameter names map one to one
(`_name_table`); the transform is PyTorch's Linear layout: our kernel (in..., out...) is HF's
weight (out, in) flattened and transposed, and our (heads, d_kv) biases are flattened. HF keeps
T5's relative attention bias only in block 0 of each stack, as we keep one table per stack.
BERT-style attention divides q.k by sqrt(d_kv), which ours folds into the query weights: the
export multiplies HF's query weight and bias by sqrt(d_kv). ELECTRA has no token types: HF's
table is written as zeros, so its default type 0 adds nothing. Export needs neither torch nor
transformers; tensors are written as float32.

Tied heads: T5 v1.0 ties the lm head to the shared embedding and rescales by d_model**-0.5
(`tie_word_embeddings: true`). v1.1 has its own lm head and no rescaling. transformers 5.x may
tie an unscaled head to the embedding (`scale_decoder_outputs: false`); such a checkpoint imports
as an untied head holding a copy of the embedding, which computes the same logits.
"""

import dataclasses
import json
import math
import os
from typing import Any, NamedTuple

from flax import nnx
import numpy as np
import safetensors.numpy

from t5lite import paths
from t5lite.models import build
from t5lite.models.config import ModelConfig
from t5lite.models.params import Params, flatten, stack_layers, unstack_layers

# Our activation -> HF T5Config.feed_forward_proj ('gelu_new' is HF's tanh approximation).
FEED_FORWARD_PROJ = {'relu': 'relu', 'gelu': 'gelu_new', 'gated-gelu': 'gated-gelu',
                     'gated-silu': 'gated-silu'}
CONFIG_FILE, WEIGHTS_FILE = 'config.json', 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'  # sharded checkpoints


# What each exportable architecture must be, field by field, to be HF's model exactly.
_BERT_LAYERS = dict(position='learned', norm='layer', norm_position='post', use_bias=True,
                    embed_norm=True, tie_embeddings=True)
EXPORTABLE = {
    'encoder_decoder': ('T5', dict(position='t5_relative', norm='rms', norm_position='pre',
                                   use_bias=False)),
    'electra': ('ELECTRA', _BERT_LAYERS),
    'encoder': ('BERT with next-sentence prediction', dict(_BERT_LAYERS, next_sentence=True)),
}


def _check_exportable(cfg: ModelConfig) -> None:
  if cfg.arch not in EXPORTABLE:
    raise ValueError(f'export supports T5, BERT and ELECTRA models; got arch={cfg.arch}')
  name, fields = EXPORTABLE[cfg.arch]
  for field, value in fields.items():
    if getattr(cfg, field) != value:
      raise ValueError(f'export supports {name} models ({field}={value!r}); '
                       f'got {field}={getattr(cfg, field)!r}')
  if cfg.arch != 'encoder_decoder' and (cfg.is_gated or cfg.num_heads * cfg.d_kv != cfg.d_model):
    raise ValueError(f'{name} export needs an ungated activation and num_heads * d_kv == d_model '
                     f'(got {cfg.activation}, {cfg.num_heads} * {cfg.d_kv} vs {cfg.d_model})')


class Row(NamedTuple):
  """One tensor: our param path, HF's name, the input dims of a Linear kernel (0: copied as is,
  biases flattened) and the factor HF's tensor carries over ours."""
  path: tuple
  name: str
  num_in: int
  scale: float = 1.0


def _name_table(cfg: ModelConfig) -> list[Row]:
  return {'electra': _electra_table, 'encoder': _bert_table}.get(cfg.arch, _t5_table)(cfg)


def _t5_table(cfg: ModelConfig) -> list[Row]:
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


def _linear(ours: tuple, theirs: str, num_in: int = 1, scale: float = 1.0) -> list[Row]:
  """A Linear layer with a bias: its weight and bias rows."""
  return [Row((*ours, 'kernel'), f'{theirs}.weight', num_in, scale),
          Row((*ours, 'bias'), f'{theirs}.bias', 0, scale)]


def _layer_norm(ours: tuple, theirs: str) -> list[Row]:
  return [Row((*ours, 'scale'), f'{theirs}.weight', 0), Row((*ours, 'bias'), f'{theirs}.bias', 0)]


def _bert_stack_table(cfg: ModelConfig, stack: str, prefix: str) -> list[Row]:
  """A BERT-layer `Stack` (post-LN, biases, learned positions, embedding LayerNorm) as HF's
  BertModel/ElectraModel named `prefix`: embeddings and encoder layers."""
  rows = [Row(('embed', 'embedding'), f'{prefix}.embeddings.word_embeddings.weight', 0),
          Row((stack, 'position_embedding', 'embedding'),
              f'{prefix}.embeddings.position_embeddings.weight', 0),
          *_layer_norm((stack, 'embed_norm'), f'{prefix}.embeddings.LayerNorm')]
  if cfg.next_sentence:
    rows.append(Row((stack, 'type_embedding', 'embedding'),
                    f'{prefix}.embeddings.token_type_embeddings.weight', 0))
  names = {'q': 'self.query', 'k': 'self.key', 'v': 'self.value', 'o': 'output.dense'}
  for i in range(cfg.num_encoder_layers):
    ours, theirs = (stack, 'layers', i), f'{prefix}.encoder.layer.{i}'
    for p, name in names.items():
      rows += _linear((*ours, 'self_attention', p), f'{theirs}.attention.{name}',
                      2 if p == 'o' else 1, cfg.d_kv**0.5 if p == 'q' else 1.0)
    rows += _layer_norm((*ours, 'self_attention_norm'), f'{theirs}.attention.output.LayerNorm')
    rows += _linear((*ours, 'mlp', 'wi'), f'{theirs}.intermediate.dense')
    rows += _linear((*ours, 'mlp', 'wo'), f'{theirs}.output.dense')
    rows += _layer_norm((*ours, 'mlp_norm'), f'{theirs}.output.LayerNorm')
  return rows


def _electra_table(cfg: ModelConfig) -> list[Row]:
  """The discriminator's stack (and the shared embeddings it reads) and head; the generator
  stays behind. Token types are written apart (zeros), as ELECTRA has none."""
  return (_bert_stack_table(cfg, 'discriminator', 'electra')
          + _linear(('discriminator_dense',), 'discriminator_predictions.dense')
          + _linear(('discriminator_output',), 'discriminator_predictions.dense_prediction'))


def _bert_table(cfg: ModelConfig) -> list[Row]:
  """BERT with next-sentence prediction as BertForNextSentencePrediction: the encoder, pooler
  and classifier. The MLM head has no HF counterpart (HF's has a transform layer) and stays."""
  return (_bert_stack_table(cfg, 'encoder', 'bert') + _linear(('pooler',), 'bert.pooler.dense')
          + _linear(('next_sentence_head',), 'cls.seq_relationship'))


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json of T5ForConditionalGeneration, ElectraForPreTraining (the discriminator) or
  BertForNextSentencePrediction for `cfg`."""
  _check_exportable(cfg)
  if cfg.arch in ('electra', 'encoder'):
    electra = cfg.arch == 'electra'
    return {
        'architectures': ['ElectraForPreTraining' if electra else 'BertForNextSentencePrediction'],
        'model_type': 'electra' if electra else 'bert', 'vocab_size': cfg.vocab_size,
        **({'embedding_size': cfg.d_model} if electra else {}), 'hidden_size': cfg.d_model,
        'num_hidden_layers': cfg.num_encoder_layers, 'num_attention_heads': cfg.num_heads,
        'intermediate_size': cfg.d_ff, 'hidden_act': FEED_FORWARD_PROJ[cfg.activation],
        'hidden_dropout_prob': cfg.dropout, 'attention_probs_dropout_prob': 0.0,
        'max_position_embeddings': cfg.max_length, 'type_vocab_size': 2,
        'layer_norm_eps': cfg.norm_eps, 'position_embedding_type': 'absolute',
        'pad_token_id': 0, 'dtype': 'float32',
    }
  return {
      'architectures': ['T5ForConditionalGeneration'], 'model_type': 't5',
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


def export_hf(params: nnx.State | Params, cfg: ModelConfig, out_dir: str) -> None:
  """Writes `params` (`nnx.state(model, nnx.Param)` or `get_params(model)`) as an HF folder."""
  config = hf_config(cfg)
  if isinstance(params, nnx.State):
    params = params.to_pure_dict()
  if cfg.scan_layers:
    params = unstack_layers(params)
  flat = dict(flatten(params))
  tensors = {}
  for path, name, num_in, scale in _name_table(cfg):
    if path not in flat:
      raise ValueError(f'params have no {"/".join(map(str, path))}; are they of this config?')
    value = np.asarray(flat[path], np.float32) * np.float32(scale)
    if num_in:  # (in..., out...) -> (in, out) -> (out, in)
      value = value.reshape(math.prod(value.shape[:num_in]), -1).T
    elif name.endswith('.bias'):  # (heads, d_kv) -> (heads * d_kv,)
      value = value.reshape(-1)
    tensors[name] = np.ascontiguousarray(value)
  if cfg.arch == 'electra':
    tensors['electra.embeddings.token_type_embeddings.weight'] = np.zeros(
        (config['type_vocab_size'], cfg.d_model), np.float32)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG_FILE), 'w') as f:
    json.dump(config, f, indent=2)
  safetensors.numpy.save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE),
                              metadata={'format': 'pt'})


def _read_folder(folder: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """config.json and every tensor of model.safetensors (single or sharded); a local folder or a
  gs:// one."""
  root = paths.path(folder)
  config = _read_json(root / CONFIG_FILE, f'{folder} is not a Hugging Face checkpoint')
  if config.get('model_type') != 't5':
    raise ValueError(f'{folder} is not a T5 checkpoint: model_type={config.get("model_type")!r}')
  if (root / INDEX_FILE).is_file():
    files = sorted(set(_read_json(root / INDEX_FILE, folder).get('weight_map', {}).values()))
  elif (root / WEIGHTS_FILE).is_file():
    files = [WEIGHTS_FILE]
  else:
    raise ValueError(f'{folder} has no {WEIGHTS_FILE} (PyTorch .bin checkpoints are not read)')
  tensors = {}
  for name in files:
    try:
      tensors.update(safetensors.numpy.load((root / name).read_bytes()))
    except (OSError, safetensors.SafetensorError) as error:
      raise ValueError(f'{root / name} cannot be read ({error}); is it complete?') from None
  return config, tensors


def _read_json(file, what: str) -> dict:
  if not file.is_file():
    raise ValueError(f'{what}: no {file.name}')
  try:
    return json.loads(file.read_text())
  except (ValueError, UnicodeDecodeError) as error:
    raise ValueError(f'{file} is not JSON ({error})') from None


def _model_config(config: dict[str, Any], tensors: dict[str, np.ndarray],
                  overrides: dict[str, Any]) -> ModelConfig:
  """Our ModelConfig for an HF T5 config; an unscaled tied head imports as untied."""
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
  fields = dict(
      arch='encoder_decoder', vocab_size=config['vocab_size'], d_model=config['d_model'],
      d_ff=config['d_ff'], num_heads=config['num_heads'], d_kv=config['d_kv'],
      num_encoder_layers=config['num_layers'],
      num_decoder_layers=config.get('num_decoder_layers') or config['num_layers'],
      activation=activations[proj], norm='rms', norm_position='pre',
      norm_eps=config.get('layer_norm_epsilon', 1e-6), position='t5_relative',
      relative_buckets=config.get('relative_attention_num_buckets', 32),
      relative_max_distance=config.get('relative_attention_max_distance', 128),
      tie_embeddings=bool(scaled), use_bias=False, dropout=config.get('dropout_rate', 0.0))
  return ModelConfig(**{**fields, **overrides})


def import_hf(folder: str, **overrides: Any) -> tuple[ModelConfig, Params]:
  """(ModelConfig, params) of an HF T5 folder; params load with `load_params(build(cfg), ...)`.

  overrides set ModelConfig fields HF does not know (scan_layers, dtype, remat_policy, ...).
  """
  config, tensors = _read_folder(folder)
  cfg = _model_config(config, tensors, overrides)
  if not cfg.tie_embeddings and 'lm_head.weight' not in tensors:
    tensors['lm_head.weight'] = tensors.get('shared.weight')  # HF tied an unscaled head
  unrolled = dataclasses.replace(cfg, scan_layers=False)
  abstract = nnx.eval_shape(lambda: build(unrolled, nnx.Rngs(0)))
  shapes = dict(flatten(nnx.state(abstract, nnx.Param).to_pure_dict()))
  table = _t5_table(cfg)
  missing = [row.name for row in table if tensors.get(row.name) is None]
  if missing:
    raise ValueError(f'{folder} misses {len(missing)} T5 tensor(s), e.g. {missing[0]}')
  params: Params = {}
  for path, name, num_in, _ in table:  # T5's rows are all unscaled
    shape = shapes[path].shape
    hf_shape = (math.prod(shape[num_in:]), math.prod(shape[:num_in])) if num_in else shape
    value = tensors[name].astype(np.float32)
    if value.shape != hf_shape:
      raise ValueError(f'{name} has shape {value.shape}, config.json implies {hf_shape}')
    if num_in:
      value = value.T.reshape(shape)  # (out, in) -> (in, out) -> (in..., out...)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return cfg, stack_layers(params) if cfg.scan_layers else params
