"""ELECTRA (Clark et al. 2020): a small masked-LM generator and a discriminator trained together.

The generator fills the masked positions of an MLM batch with samples from its softmax; the
discriminator reads the result and tells, for every token, whether it was replaced. The
discriminator is the model one keeps. Both are bidirectional `Stack`s over one shared token
embedding, position table and embedding LayerNorm, as in the paper.

As in the paper, the generator is narrower: `generator_size` of the discriminator's heads (of the
same d_kv) and of its d_ff, so its hidden size is heads * d_kv, and a dense layer projects the
shared embeddings into it. Its MLM head is HF's ElectraGeneratorPredictions: dense back to the
embedding width, the exact (erf) GELU, LayerNorm, then the tied embedding plus a bias.

  model(batch)                   # (b, l) float32 logits of "this encoder input token was replaced"
  model.generator_logits(batch)  # (b, l, vocab) float32 MLM logits

Both go to Hugging Face and back: the discriminator as ElectraForPreTraining, the generator as
ElectraForMaskedLM in the export's `generator/` folder (HF's two checkpoints of one run). ELECTRA
has no token types: HF's table is written as zeros, so its default type 0 adds nothing; importing,
type 0's row is added to the position table.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models import architecture, hf_mapping
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel, Row
from t5lite.models.layers import ACTIVATION_FUNCTIONS, Dense, constrain
from t5lite.models.transformer import (Features, MlmTransform, Stack, output_logits,
                                       shared_parts)


def generator_config(cfg: ModelConfig) -> ModelConfig:
  """The generator's stack: `generator_size` of the heads (at least one) and of d_ff, as wide as
  its heads."""
  num_heads = max(1, round(cfg.num_heads * cfg.generator_size))
  return dataclasses.replace(cfg, arch='encoder', num_heads=num_heads, d_model=num_heads * cfg.d_kv,
                             d_ff=max(1, round(cfg.d_ff * cfg.generator_size)))


class Electra(nnx.Module):
  """The generator and discriminator stacks, their shared embeddings, the two heads."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg, self.generator_cfg = cfg, generator_config(cfg)
    # the generator reads its logits off the shared embedding, whatever tie_embeddings says
    self.tied_cfg = dataclasses.replace(cfg, tie_embeddings=True)
    self.embed, _, self.rngs = shared_parts(self.tied_cfg, rngs)
    self.generator = Stack(self.generator_cfg, cfg.num_encoder_layers, causal=False,
                           cross_attention=False, rngs=rngs, embed_width=cfg.d_model)
    self.discriminator = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                               rngs=rngs)
    if cfg.position == 'learned':  # one table, stored once (nnx shares the module)
      self.generator.position_embedding = self.discriminator.position_embedding
    if cfg.embed_norm:  # and one embedding LayerNorm
      self.generator.embed_norm = self.discriminator.embed_norm
    self.generator_head = MlmTransform(self.tied_cfg, rngs=rngs, d_in=self.generator_cfg.d_model,
                                       activation='gelu_erf')
    # The paper's discriminator head: dense + activation, then one logit per token.
    self.act = ACTIVATION_FUNCTIONS[cfg.activation.removeprefix('gated-')]
    self.discriminator_dense = Dense((cfg.d_model,), (cfg.d_model,), ('embed', 'mlp'),
                                     std=cfg.d_model**-0.5, cfg=cfg, rngs=rngs)
    self.discriminator_output = Dense((cfg.d_model,), (1,), ('mlp', None),
                                      std=cfg.d_model**-0.5, cfg=cfg, rngs=rngs)

  def generator_logits(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
                       rngs: nnx.Rngs | None = None) -> jax.Array:
    """The MLM's (b, l, vocab) float32 logits over the batch's masked encoder_input_tokens."""
    features = Features.from_batch(batch, 'encoder')
    x = self.generator(self.embed(features.tokens), features, deterministic=deterministic,
                       rngs=self.rngs if rngs is None else rngs)
    return output_logits(self.tied_cfg, self.embed, None, x, self.generator_head)

  def discriminator_logits(self, features: Features, *, deterministic: bool = True,
                           rngs: nnx.Rngs | None = None) -> jax.Array:
    """(b, l) float32 logits that each token of `features` is a replacement."""
    x = self.discriminator(self.embed(features.tokens), features, deterministic=deterministic,
                           rngs=self.rngs if rngs is None else rngs)
    h = self.act(self.discriminator_dense(x))  # (b, l, d)
    logits = self.discriminator_output(h)[..., 0]  # (b, l, 1) -> (b, l)
    return constrain(logits.astype(jnp.float32), ('batch', 'length'))

  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
    return self.discriminator_logits(Features.from_batch(batch, 'encoder'),
                                     deterministic=deterministic, rngs=rngs)


def shapes(cfg: ModelConfig, inputs_length: int, targets_length: int) -> Shapes:
  """Both stacks over the inputs; the generator's projection in and MLM transform out (d <-> its
  width), and the discriminator's 2-layer head (d -> d, then d -> 1) at every position."""
  del targets_length  # the targets are the inputs' positions
  generator = generator_config(cfg)
  projections = 2 if generator.d_model != cfg.d_model else 1
  return Shapes(tuple(StackShape(c, cfg.num_encoder_layers, inputs_length, causal=False)
                      for c in (cfg, generator)),
                logits_length=inputs_length,
                head_flops=2 * inputs_length * cfg.d_model * (
                    cfg.d_model + 1 + projections * generator.d_model))


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_encoder_layers')
  architecture.refuse_encoder_heads(cfg)
  architecture.refuse_long_encoder(cfg)


def hf_check(cfg: ModelConfig) -> None:
  hf_mapping.check_bert_layers(cfg, 'ELECTRA')


DISCRIMINATOR_HEAD = (('discriminator_dense',), 'discriminator_predictions.dense',
                      ('discriminator_output',), 'discriminator_predictions.dense_prediction')
GENERATOR_HEAD = ('generator_predictions.dense', 'generator_predictions.LayerNorm',
                  'generator_lm_head.bias')
GENERATOR_FOLDER = 'generator'  # the export's subfolder of the generator


def discriminator_table(cfg: ModelConfig) -> list[Row]:
  """ElectraForPreTraining: the shared embeddings, the discriminator's stack and head."""
  dense, dense_name, output, output_name = DISCRIMINATOR_HEAD
  return (hf_mapping.bert_stack_table(cfg, 'discriminator', 'electra')
          + hf_mapping.linear(dense, dense_name) + hf_mapping.linear(output, output_name))


def generator_table(cfg: ModelConfig) -> list[Row]:
  """ElectraForMaskedLM: the shared embeddings (stored under the discriminator), the projection
  into the generator, its stack and its MLM head (HF ties the output to the embeddings)."""
  generator = generator_config(cfg)
  rows = hf_mapping.bert_embeddings_table(cfg, 'discriminator', 'electra')
  if generator.d_model != cfg.d_model:
    rows += hf_mapping.linear(('generator', 'embed_projection'), 'electra.embeddings_project')
  return (rows + hf_mapping.bert_layers_table(generator, 'generator', 'electra')
          + hf_mapping.mlm_head_table(cfg, ('generator_head',), *GENERATOR_HEAD))


def discriminator_config(cfg: ModelConfig) -> dict[str, Any]:
  return {'embedding_size': cfg.d_model, **hf_mapping.bert_config(cfg)}


def generator_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The generator's layers, reading embeddings as wide as the discriminator's."""
  return {'embedding_size': cfg.d_model, **hf_mapping.bert_config(generator_config(cfg))}


def discriminator_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
                       ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """ElectraForPreTraining's fields: its layers are ours, embeddings as wide as them."""
  fields = hf_mapping.bert_fields(config, 'ELECTRA')
  if config.get('embedding_size', fields['d_model']) != fields['d_model']:
    raise ValueError(f'unsupported ELECTRA discriminator embedding_size='
                     f'{config["embedding_size"]}: t5lite\'s embeddings are as wide as its '
                     f'hidden_size={fields["d_model"]}')
  return fields, hf_mapping.fold_token_types(tensors, 'electra')


def generator_load(config: dict[str, Any], tensors: dict[str, np.ndarray]
                   ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """ElectraForMaskedLM's fields: the discriminator's are those `generator_config` narrows to
  its layers (d_model the embedding width, generator_size the ratio of hidden sizes)."""
  fields = hf_mapping.bert_fields(config, 'ELECTRA generator')
  width = config.get('embedding_size', fields['d_model'])
  size = fields['d_model'] / width
  if not 0 < size <= 1:
    raise ValueError(f'unsupported ELECTRA generator: hidden_size={fields["d_model"]} is wider '
                     f'than embedding_size={width}')
  fields.update(d_model=width, generator_size=size, num_heads=round(fields['num_heads'] / size),
                d_ff=round(fields['d_ff'] / size))
  return fields, hf_mapping.fold_token_types(tensors, 'electra')


def data(cfg: ModelConfig) -> dict[str, Any]:
  """An imported ELECTRA pretrains as ELECTRA does, over rows as long as its positions."""
  return dict(objective='electra', inputs_length=cfg.max_length, targets_length=0)


def zero_token_types(cfg: ModelConfig) -> dict[str, np.ndarray]:
  return hf_mapping.zero_token_types(cfg, 'electra')


FAMILY = Family(
    arch='electra', model=Electra, sides=('encoder',), objective='electra',
    stacks=('generator', 'discriminator'), shapes=shapes, check=check, prompt=None,
    hf=(HfModel('ELECTRA', 'ElectraForPreTraining', 'electra', check=hf_check,
                config=discriminator_config, table=discriminator_table, text=hf_mapping.RAW_TEXT,
                extra=zero_token_types,
                load=discriminator_load, data=data),
        HfModel('ELECTRA', 'ElectraForMaskedLM', 'electra', check=hf_check,
                config=generator_hf_config, table=generator_table, text=hf_mapping.MASKED_TEXT,
                extra=zero_token_types,
                load=generator_load, data=data, folder=GENERATOR_FOLDER)))
