"""How a family is a Hugging Face model (its `Family.hf`), and the pieces BERT-layer families share.

A family names every tensor (`HfModel.table`) and the special tokens its tokenizer adds
(`HfModel.text`); t5lite/export/ does the rest. The transform is PyTorch's Linear layout: our
kernel (in..., out...) is HF's weight (out, in) flattened and transposed, and our (heads, d_kv)
biases are flattened. GPT-2's Conv1D keeps (in, out) (`Row.conv1d`) and fuses q, k and v into one
tensor: rows that name one tensor are its parts, concatenated along HF's output dim in table
order. HF's table may have rows before ours (`Row.leading_rows`: BART's positions start at row 2,
RoBERTa's at pad_token_id + 1).
BERT-style attention divides q.k by sqrt(d_kv), which ours folds into the query weights: a
BERT-layer table multiplies HF's query weight and bias by sqrt(d_kv).
"""

from typing import Any, Callable, NamedTuple

import numpy as np

from t5lite.models.config import ModelConfig
from t5lite.token_ids import PAD_ID

# Our activation -> HF's name (HF's 'gelu_new' is the tanh approximation, its 'gelu' the erf GELU).
FEED_FORWARD_PROJ = {'relu': 'relu', 'gelu': 'gelu_new', 'gelu_erf': 'gelu',
                     'gated-gelu': 'gated-gelu', 'gated-silu': 'gated-silu'}
# HF's activation names that import: our ungated activations
UNGATED_ACTIVATIONS = {FEED_FORWARD_PROJ[ours]: ours for ours in ('relu', 'gelu', 'gelu_erf')}
TYPE_VOCAB_SIZE = 2  # BERT's segments A and B
# What a BERT-layer stack must be, field by field, to be HF's BertModel, ElectraModel or BART's.
BERT_LAYERS = dict(position='learned', norm='layer', norm_position='post', use_bias=True,
                   embed_norm=True, tie_embeddings=True)
# BertConfig/RobertaConfig/ElectraConfig fields whose other values change what the model computes
BERT_FIXED = dict(position_embedding_type='absolute', is_decoder=False, add_cross_attention=False,
                  tie_word_embeddings=True)


class Row(NamedTuple):
  """One tensor, or one part of a tensor that several rows name: our param path, HF's name, the
  input dims of a kernel (0: copied as is, biases flattened), the factor HF's tensor carries over
  ours, whether HF's weight is Conv1D's (in, out) rather than Linear's (out, in), how many
  rows HF's table has before ours (zeros on export, dropped on import), and which entry of our
  param's leading axis the tensor is, if one (an expert of the experts stacked in one param)."""
  path: tuple
  name: str
  num_in: int
  scale: float = 1.0
  conv1d: bool = False
  leading_rows: int = 0
  index: int | None = None


class TextTemplate(NamedTuple):
  """The special tokens a model read around its text in pretraining, which its exported tokenizer
  adds by default: HF's TemplateProcessing over one text and a pair ('$B:1': segment B), and the
  tokenizer's other special tokens by role."""
  single: str  # '$A </s>': the text, then EOS
  pair: str
  special_tokens: dict[str, str] = {}  # role -> token: {'mask_token': '<extra_id_0>'}
  # T5Tokenizer sets T5's template itself; any other is read from tokenizer.json by the generic
  # class
  tokenizer_class: str = 'PreTrainedTokenizerFast'
  # A causal LM's: decoded text keeps its first space, as a continuation of the prompt does
  continues: bool = False


# What t5lite's objectives (t5lite/objectives/) give each model. The rows of MLM and causal LM
# are cut anywhere from concatenated text: nothing marks their ends. MLM and BART mask with
# <extra_id_0>, next-sentence pairs are [CLS] A [SEP] B [SEP] with <extra_id_1> and <extra_id_2>.
T5_TEXT = TextTemplate('$A </s>', '$A </s> $B </s>', tokenizer_class='T5Tokenizer')  # BART's too
RAW_TEXT = TextTemplate('$A', '$A $B')  # ELECTRA's discriminator: no masks either
MASKED_TEXT = RAW_TEXT._replace(special_tokens={'mask_token': '<extra_id_0>'})
SENTENCE_PAIR_TEXT = TextTemplate(
    '<extra_id_1> $A <extra_id_2>', '<extra_id_1> $A <extra_id_2> $B:1 <extra_id_2>:1',
    {'mask_token': '<extra_id_0>', 'cls_token': '<extra_id_1>', 'sep_token': '<extra_id_2>'})
CAUSAL_TEXT = TextTemplate('<pad> $A', '<pad> $A $B', {'bos_token': '<pad>'}, continues=True)


class HfModel(NamedTuple):
  """A Hugging Face model a family exports as (and imports from, given `load`)."""
  name: str  # in messages: 'T5'
  architecture: str  # config.json's architectures: 'T5ForConditionalGeneration'
  model_type: str  # config.json's model_type: 't5'
  check: Callable[[ModelConfig], None]  # refuses in one line a config HF's model cannot be
  config: Callable[[ModelConfig], dict[str, Any]]  # the rest of config.json
  table: Callable[[ModelConfig], list[Row]]  # every tensor of HF's model we have
  text: TextTemplate  # what its tokenizer adds around a text
  # HF's tensors we lack, written as they are (ELECTRA's token types, BART's final_logits_bias:
  # zeros)
  extra: Callable[[ModelConfig], dict[str, np.ndarray]] | None = None
  # config.json and tensors -> ModelConfig fields (arch aside) and the tensors `table` names;
  # None: export only
  load: Callable[[dict[str, Any], dict[str, np.ndarray]],
                 tuple[dict[str, Any], dict[str, np.ndarray]]] | None = None
  # Whether a config means this model rather than the family's others (BART, not T5: learned
  # positions); `check` then says in one line what keeps it from being the model exactly.
  fits: Callable[[ModelConfig], bool] = lambda cfg: True
  # The config.data settings an imported model pretrains with (its objective, and lengths its
  # positions hold), over base_config's (T5's span corruption)
  data: Callable[[ModelConfig], dict[str, Any]] = lambda cfg: {}
  # '': the model a config exports as; a name: a second model of the run, written beside the
  # first in this subfolder and read from there on import (ELECTRA's generator)
  folder: str = ''


def check_fields(cfg: ModelConfig, name: str, fields: dict[str, Any]) -> None:
  """Refuses a config whose `fields` differ from those HF's `name` model fixes."""
  for field, value in fields.items():
    if getattr(cfg, field) != value:
      raise ValueError(f'export supports {name} models ({field}={value!r}); '
                       f'got {field}={getattr(cfg, field)!r}')


def check_bert_layers(cfg: ModelConfig, name: str, **fields: Any) -> None:
  """Refuses a config that is not BERT's layers (and `fields`)."""
  check_fields(cfg, name, {**BERT_LAYERS, **fields})
  check_ungated_full_width(cfg, name)


def check_ungated_full_width(cfg: ModelConfig, name: str) -> None:
  """Refuses what HF's BERT and GPT-2 layers lack: gating, and attention of another width than
  the hidden size."""
  if cfg.is_gated or cfg.num_heads * cfg.d_kv != cfg.d_model:
    raise ValueError(f'{name} export needs an ungated activation and num_heads * d_kv == d_model '
                     f'(got {cfg.activation}, {cfg.num_heads} * {cfg.d_kv} vs {cfg.d_model})')


def linear(ours: tuple, theirs: str, num_in: int = 1, scale: float = 1.0,
           conv1d: bool = False) -> list[Row]:
  """A Linear (or Conv1D) layer with a bias: its weight and bias rows."""
  return [Row((*ours, 'kernel'), f'{theirs}.weight', num_in, scale, conv1d),
          Row((*ours, 'bias'), f'{theirs}.bias', 0, scale)]


def layer_norm(ours: tuple, theirs: str, scale: float = 1.0) -> list[Row]:
  return [Row((*ours, 'scale'), f'{theirs}.weight', 0, scale),
          Row((*ours, 'bias'), f'{theirs}.bias', 0, scale)]


def scaled_attention(ours: tuple, names: dict[str, str], d_kv: int) -> list[Row]:
  """BERT-style attention's Linear layers (names: 'q', 'k', 'v', 'o' -> HF's); HF's query
  carries the sqrt(d_kv) ours folds into its weights."""
  rows = []
  for p, name in names.items():
    rows += linear((*ours, p), name, 2 if p == 'o' else 1, d_kv**0.5 if p == 'q' else 1.0)
  return rows


def bert_stack_table(cfg: ModelConfig, stack: str, prefix: str,
                     position_offset: int = 0) -> list[Row]:
  """A BERT-layer `Stack` (post-LN, biases, learned positions, embedding LayerNorm) as HF's
  BertModel/ElectraModel/RobertaModel named `prefix`: embeddings and encoder layers. Our position
  p is HF's p + position_offset."""
  return (bert_embeddings_table(cfg, stack, prefix, position_offset)
          + bert_layers_table(cfg, stack, prefix))


def bert_embeddings_table(cfg: ModelConfig, stack: str, prefix: str,
                          position_offset: int = 0) -> list[Row]:
  """The token embedding and `stack`'s positions, token types and embedding LayerNorm."""
  rows = [Row(('embed', 'embedding'), f'{prefix}.embeddings.word_embeddings.weight', 0),
          Row((stack, 'position_embedding', 'embedding'),
              f'{prefix}.embeddings.position_embeddings.weight', 0,
              leading_rows=position_offset),
          *layer_norm((stack, 'embed_norm'), f'{prefix}.embeddings.LayerNorm')]
  if cfg.next_sentence:
    rows.append(Row((stack, 'type_embedding', 'embedding'),
                    f'{prefix}.embeddings.token_type_embeddings.weight', 0))
  return rows


def bert_layers_table(cfg: ModelConfig, stack: str, prefix: str) -> list[Row]:
  """`stack`'s layers, cfg its own config, as HF's `{prefix}.encoder.layer.{i}`."""
  rows = []
  names = {'q': 'self.query', 'k': 'self.key', 'v': 'self.value', 'o': 'output.dense'}
  for i in range(cfg.num_encoder_layers):
    ours, theirs = (stack, 'layers', i), f'{prefix}.encoder.layer.{i}'
    rows += scaled_attention((*ours, 'self_attention'),
                             {p: f'{theirs}.attention.{name}' for p, name in names.items()},
                             cfg.d_kv)
    rows += layer_norm((*ours, 'self_attention_norm'), f'{theirs}.attention.output.LayerNorm')
    rows += linear((*ours, 'mlp', 'wi'), f'{theirs}.intermediate.dense')
    rows += linear((*ours, 'mlp', 'wo'), f'{theirs}.output.dense')
    rows += layer_norm((*ours, 'mlp_norm'), f'{theirs}.output.LayerNorm')
  return rows


def mlm_head_table(cfg: ModelConfig, ours: tuple, dense: str, norm: str, bias: str) -> list[Row]:
  """An `MlmTransform` at `ours` and its output bias; HF's LayerNorm carries our tied head's
  d_model**-0.5."""
  return (linear((*ours, 'dense'), dense)
          + layer_norm((*ours, 'norm'), norm, cfg.d_model**-0.5)
          + [Row((*ours, 'output_bias'), bias, 0)])


def bert_config(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json fields BertConfig and ElectraConfig share."""
  return {
      'vocab_size': cfg.vocab_size, 'hidden_size': cfg.d_model,
      'num_hidden_layers': cfg.num_encoder_layers, 'num_attention_heads': cfg.num_heads,
      'intermediate_size': cfg.d_ff, 'hidden_act': FEED_FORWARD_PROJ[cfg.activation],
      'hidden_dropout_prob': cfg.dropout, 'attention_probs_dropout_prob': 0.0,
      'max_position_embeddings': cfg.max_length, 'type_vocab_size': TYPE_VOCAB_SIZE,
      'layer_norm_eps': cfg.norm_eps, 'position_embedding_type': 'absolute',
      'pad_token_id': 0, 'dtype': 'float32',
  }


def zero_token_types(cfg: ModelConfig, prefix: str,
                     types: int = TYPE_VOCAB_SIZE) -> dict[str, np.ndarray]:
  """HF's token-type table for a stack without ours: zeros, so that type 0 adds nothing."""
  return {f'{prefix}.embeddings.token_type_embeddings.weight':
          np.zeros((types, cfg.d_model), np.float32)}


def check_hf_config(config: dict[str, Any], name: str, required: tuple[str, ...],
                    fixed: dict[str, Any], default_activation: str,
                    activation_key: str = 'activation_function') -> str:
  """Refuses in one line an HF config.json that misses a `required` key, has an activation ours
  lacks or sets a `fixed` field otherwise; returns our name of its activation."""
  absent = [key for key in required if key not in config]
  if absent:
    raise ValueError(f'{name} config.json misses {", ".join(absent)}')
  activation = config.get(activation_key, default_activation)
  if activation not in UNGATED_ACTIVATIONS:
    raise ValueError(f'unsupported {name} {activation_key}={activation!r}; expected one of '
                     f'{", ".join(UNGATED_ACTIVATIONS)}')
  for key, value in fixed.items():  # absent: the value given
    if config.get(key, value) != value:
      raise ValueError(f'unsupported {name} {key}={config[key]!r}; only {key}={value} imports')
  return UNGATED_ACTIVATIONS[activation]


def bert_fields(config: dict[str, Any], name: str) -> dict[str, Any]:
  """Our ModelConfig fields for the BERT layers of an HF config.json (`bert_config` undone);
  attention dropout, which ours lacks, is dropped."""
  required = ('vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads',
              'intermediate_size', 'max_position_embeddings')
  activation = check_hf_config(config, name, required, BERT_FIXED, default_activation='gelu',
                               activation_key='hidden_act')
  pad_id = config.get('pad_token_id', PAD_ID)
  if pad_id != PAD_ID:
    raise ValueError(f'unsupported {name} pad_token_id={pad_id!r}: t5lite pads with id {PAD_ID}'
                     f' (its positions and attention mask); renumber the vocabulary first')
  return dict(
      vocab_size=config['vocab_size'], d_model=config['hidden_size'],
      d_ff=config['intermediate_size'], num_heads=config['num_attention_heads'],
      d_kv=config['hidden_size'] // config['num_attention_heads'],
      num_encoder_layers=config['num_hidden_layers'], num_decoder_layers=0,
      activation=activation, norm_eps=config.get('layer_norm_eps', 1e-12),
      max_length=config['max_position_embeddings'],
      dropout=config.get('hidden_dropout_prob', 0.1), **BERT_LAYERS)


def fold_token_types(tensors: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
  """For a stack without token types: HF's type 0 row, which it adds to every token, moved into
  the position table."""
  types = tensors.get(f'{prefix}.embeddings.token_type_embeddings.weight')
  positions = f'{prefix}.embeddings.position_embeddings.weight'
  if types is None or positions not in tensors:
    return tensors
  return {**tensors, positions: tensors[positions] + types[0]}
