"""model.arch='encoder': BERT-like encoder-only models, and Hugging Face's BERT and RoBERTa.

With `mlm_transform` the MLM head is HF's (dense, activation, LayerNorm, tied output plus a bias):
'bert' goes both ways as BertForPreTraining (with `next_sentence`: the pooler and next-sentence
classifier too) or BertForMaskedLM, 'roberta' as RobertaForMaskedLM. Without it, BERT with
next-sentence prediction exports as BertForNextSentencePrediction (encoder, pooler, classifier;
our plain tied head has no HF counterpart, so it stays behind).

Two things move into HF's numbers. Our tied head multiplies the final hidden states by
d_model**-0.5, HF's does not: the transform's LayerNorm weight and bias carry it (HF's
transform output is ours times d_model**-0.5, logits agree), as GPT-2's ln_f does. And RoBERTa
numbers positions from pad_token_id + 1 (padding itself takes position pad_token_id): with our
pad id 0, our position p is HF's p + 1, and HF's table has max_length + 1 rows, row 0 zeros.
Token types we lack are written as zeros; importing, type 0's row, which HF adds to every token,
is added to the position table instead.
"""

from collections.abc import Mapping
import functools
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models import architecture, hf_mapping
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel, Row
from t5lite.models.layers import Dense
from t5lite.models.transformer import (Features, LanguageModel, MlmTransform, Stack,
                                       output_logits, shared_parts)
from t5lite.token_ids import EOS_ID, PAD_ID


class EncoderOnly(LanguageModel):
  """BERT-like: a bidirectional stack with per-token vocabulary logits (the MLM head, transformed
  first with `mlm_transform`), and with `next_sentence` BERT's pooler and next-sentence
  classifier over the first ([CLS]) token."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed, self.lm_head, self.rngs = shared_parts(cfg, rngs)
    self.mlm_transform = MlmTransform(cfg, rngs=rngs) if cfg.mlm_transform != 'none' else None
    self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                         rngs=rngs)
    if cfg.next_sentence:
      self.pooler = Dense((cfg.d_model,), (cfg.d_model,), ('embed', 'mlp'), std=cfg.d_model**-0.5,
                          cfg=cfg, rngs=rngs)
      self.next_sentence_head = Dense((cfg.d_model,), (2,), ('mlp', None),
                                      std=cfg.d_model**-0.5, cfg=cfg, rngs=rngs)

  def hidden_states(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
                    rngs: nnx.Rngs | None = None) -> jax.Array:
    """The batch's encoder tokens -> (b, l, d) hidden states, read by both heads."""
    encoder = Features.from_batch(batch, 'encoder')
    return self.encoder(self.embed(encoder.tokens), encoder, deterministic=deterministic,
                        rngs=self.rngs if rngs is None else rngs)

  def lm_logits(self, x: jax.Array) -> jax.Array:
    """(b, l, d) final hidden states -> (b, l, vocab) float32 MLM logits."""
    return output_logits(self.cfg, self.embed, self.lm_head, x, self.mlm_transform)

  def next_sentence_logits(self, x: jax.Array) -> jax.Array:
    """(b, l, d) hidden states -> (b, 2) float32 logits of (is next, is random) from [CLS]."""
    pooled = jnp.tanh(self.pooler(x[:, 0]))  # (b, d)
    return self.next_sentence_head(pooled).astype(jnp.float32)


def shapes(cfg: ModelConfig, inputs_length: int, targets_length: int) -> Shapes:
  """Everything over the inputs (the next-sentence heads' few FLOPs are left out)."""
  del targets_length  # the targets are the inputs' positions
  return Shapes((StackShape(cfg, cfg.num_encoder_layers, inputs_length, causal=False),),
                logits_length=inputs_length)


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_encoder_layers')
  architecture.refuse_long_encoder(cfg)


# HF's names of the MLM head's transform dense, its LayerNorm and the output bias
BERT_MLM_HEAD = ('cls.predictions.transform.dense', 'cls.predictions.transform.LayerNorm',
                 'cls.predictions.bias')
ROBERTA_MLM_HEAD = ('lm_head.dense', 'lm_head.layer_norm', 'lm_head.bias')
ROBERTA_POSITION_OFFSET = PAD_ID + 1  # HF's first position is pad_token_id + 1
ROBERTA_TYPE_VOCAB_SIZE = 1


def next_sentence_table() -> list[Row]:
  """BERT's pooler and next-sentence classifier."""
  return (hf_mapping.linear(('pooler',), 'bert.pooler.dense')
          + hf_mapping.linear(('next_sentence_head',), 'cls.seq_relationship'))


def bert_table(cfg: ModelConfig) -> list[Row]:
  """BertForPreTraining (with next_sentence) or BertForMaskedLM."""
  rows = (hf_mapping.bert_stack_table(cfg, 'encoder', 'bert')
          + hf_mapping.mlm_head_table(cfg, ('mlm_transform',), *BERT_MLM_HEAD))
  return rows + next_sentence_table() if cfg.next_sentence else rows


def bert_check(cfg: ModelConfig) -> None:
  hf_mapping.check_bert_layers(cfg, 'BERT')


def roberta_table(cfg: ModelConfig) -> list[Row]:
  return (hf_mapping.bert_stack_table(cfg, 'encoder', 'roberta', ROBERTA_POSITION_OFFSET)
          + hf_mapping.mlm_head_table(cfg, ('mlm_transform',), *ROBERTA_MLM_HEAD))


def roberta_check(cfg: ModelConfig) -> None:
  hf_mapping.check_bert_layers(cfg, 'RoBERTa', next_sentence=False)


def roberta_config(cfg: ModelConfig) -> dict[str, Any]:
  """BERT's config.json with RoBERTa's offset positions, one token type and our EOS."""
  return {**hf_mapping.bert_config(cfg),
          'max_position_embeddings': cfg.max_length + ROBERTA_POSITION_OFFSET,
          'type_vocab_size': ROBERTA_TYPE_VOCAB_SIZE, 'bos_token_id': None,
          'eos_token_id': EOS_ID}


def next_sentence_check(cfg: ModelConfig) -> None:
  """The export of a config without an HF MLM head: BERT's next-sentence classifier or none."""
  hf_mapping.check_bert_layers(cfg, 'BERT with next-sentence prediction')
  if not cfg.next_sentence:
    raise ValueError("export of model.arch='encoder' needs Hugging Face's MLM head "
                     "(model.mlm_transform='bert' or 'roberta') or next_sentence=True")


def mlm_load(config: dict[str, Any], tensors: dict[str, np.ndarray], *, name: str, prefix: str,
             next_sentence: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Our ModelConfig fields (mlm_transform aside) and tensors for an HF BERT-layer MLM; without
  next_sentence, token type 0's row is folded into the positions."""
  fields = hf_mapping.bert_fields(config, name)
  if not next_sentence:
    tensors = hf_mapping.fold_token_types(tensors, prefix)
  return {**fields, 'next_sentence': next_sentence}, tensors


def bert_load(config: dict[str, Any], tensors: dict[str, np.ndarray], *, next_sentence: bool
              ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  fields, tensors = mlm_load(config, tensors, name='BERT', prefix='bert',
                             next_sentence=next_sentence)
  return {**fields, 'mlm_transform': 'bert'}, tensors


def roberta_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
                 ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """RoBERTa's fields; its table's first pad_token_id + 1 rows are not our positions."""
  config = {'pad_token_id': 1, **config}  # RobertaConfig's default
  fields, tensors = mlm_load(config, tensors, name='RoBERTa', prefix='roberta',
                             next_sentence=False)
  return {**fields, 'mlm_transform': 'roberta',
          'max_length': fields['max_length'] - ROBERTA_POSITION_OFFSET}, tensors


def masked_lm_data(cfg: ModelConfig, objective: str) -> dict[str, Any]:
  """An imported encoder's pretraining: `objective` over rows as long as its positions."""
  return dict(objective=objective, inputs_length=cfg.max_length, targets_length=0)


FAMILY = Family(
    arch='encoder', model=EncoderOnly, sides=('encoder',), objective=None, stacks=('encoder',),
    shapes=shapes, check=check, prompt=None,
    hf=(HfModel('BERT', 'BertForPreTraining', 'bert', check=bert_check,
                config=hf_mapping.bert_config, table=bert_table,
                text=hf_mapping.SENTENCE_PAIR_TEXT,
                load=functools.partial(bert_load, next_sentence=True),
                fits=lambda cfg: cfg.mlm_transform == 'bert' and cfg.next_sentence,
                data=lambda cfg: masked_lm_data(cfg, 'mlm_nsp')),
        HfModel('BERT', 'BertForMaskedLM', 'bert', check=bert_check,
                config=hf_mapping.bert_config, table=bert_table, text=hf_mapping.MASKED_TEXT,
                extra=lambda cfg: hf_mapping.zero_token_types(cfg, 'bert'),
                load=functools.partial(bert_load, next_sentence=False),
                fits=lambda cfg: cfg.mlm_transform == 'bert',
                data=lambda cfg: masked_lm_data(cfg, 'mlm')),
        HfModel('RoBERTa', 'RobertaForMaskedLM', 'roberta', check=roberta_check,
                config=roberta_config, table=roberta_table, text=hf_mapping.MASKED_TEXT,
                extra=lambda cfg: hf_mapping.zero_token_types(cfg, 'roberta',
                                                              ROBERTA_TYPE_VOCAB_SIZE),
                load=roberta_load, fits=lambda cfg: cfg.mlm_transform == 'roberta',
                data=lambda cfg: masked_lm_data(cfg, 'mlm')),
        HfModel('BERT', 'BertForNextSentencePrediction', 'bert', check=next_sentence_check,
                config=hf_mapping.bert_config, text=hf_mapping.SENTENCE_PAIR_TEXT,
                table=lambda cfg: (hf_mapping.bert_stack_table(cfg, 'encoder', 'bert')
                                   + next_sentence_table()))))
