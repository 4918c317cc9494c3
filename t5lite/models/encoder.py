"""model.arch='encoder': BERT-like encoder-only models, and with next-sentence prediction
BertForNextSentencePrediction (the encoder, pooler and classifier; HF's MLM head has a transform
layer ours lacks, so it stays behind)."""

from collections.abc import Mapping

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models import architecture, hf_mapping
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel, Row
from t5lite.models.layers import Dense
from t5lite.models.transformer import Features, LanguageModel, Stack, shared_parts


class EncoderOnly(LanguageModel):
  """BERT-like: a bidirectional stack with per-token vocabulary logits (the MLM head), and with
  `next_sentence` BERT's pooler and next-sentence classifier over the first ([CLS]) token."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed, self.lm_head, self.rngs = shared_parts(cfg, rngs)
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


def hf_check(cfg: ModelConfig) -> None:
  hf_mapping.check_bert_layers(cfg, 'BERT with next-sentence prediction', next_sentence=True)


def hf_table(cfg: ModelConfig) -> list[Row]:
  """The encoder, pooler and classifier of BertForNextSentencePrediction."""
  return (hf_mapping.bert_stack_table(cfg, 'encoder', 'bert')
          + hf_mapping.linear(('pooler',), 'bert.pooler.dense')
          + hf_mapping.linear(('next_sentence_head',), 'cls.seq_relationship'))


FAMILY = Family(
    arch='encoder', model=EncoderOnly, sides=('encoder',), objective=None, stacks=('encoder',),
    shapes=shapes, check=check, prompt=None,
    hf=(HfModel('BERT', 'BertForNextSentencePrediction', 'bert', check=hf_check,
                config=hf_mapping.bert_config, table=hf_table),))
