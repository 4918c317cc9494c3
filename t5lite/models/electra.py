"""ELECTRA (Clark et al. 2020): a small masked-LM generator and a discriminator trained together.

The generator fills the masked positions of an MLM batch with samples from its softmax; the
discriminator reads the result and tells, for every token, whether it was replaced. The
discriminator is the model one keeps. Both are bidirectional `Stack`s over one shared token
embedding, position table and embedding LayerNorm, as in the paper.

The paper narrows the generator (hidden size, FFN and heads all times `generator_size`) and
projects the shared embeddings into it. Here the generator keeps the discriminator's d_model and
depth and takes `generator_size` of its heads and d_ff, so the embeddings are shared without a
projection: each generator layer has `generator_size` of a discriminator layer's weights and
FLOPs, and the residual stream stays full width.

  model(batch)                   # (b, l) float32 logits of "this encoder input token was replaced"
  model.generator_logits(batch)  # (b, l, vocab) float32 MLM logits

It exports its discriminator to Hugging Face (ElectraForPreTraining), the model ELECTRA pretrains
for; the generator stays behind. ELECTRA has no token types: HF's table is written as zeros, so
its default type 0 adds nothing.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models import architecture, hf_mapping
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel, Row
from t5lite.models.layers import ACTIVATION_FUNCTIONS, Dense, constrain
from t5lite.models.transformer import Features, Stack, output_logits, shared_parts


def generator_config(cfg: ModelConfig) -> ModelConfig:
  """The generator's stack: `generator_size` of the heads (at least one) and of d_ff, and an MLM
  head tied to the shared embedding (the paper ties the generator's input and output)."""
  return dataclasses.replace(
      cfg, arch='encoder', num_heads=max(1, round(cfg.num_heads * cfg.generator_size)),
      d_ff=max(1, round(cfg.d_ff * cfg.generator_size)), tie_embeddings=True)


class Electra(nnx.Module):
  """The generator and discriminator stacks, their shared embeddings, the discriminator head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg, self.generator_cfg = cfg, generator_config(cfg)
    self.embed, _, self.rngs = shared_parts(self.generator_cfg, rngs)  # tied: no lm head
    self.generator = Stack(self.generator_cfg, cfg.num_encoder_layers, causal=False,
                           cross_attention=False, rngs=rngs)
    self.discriminator = Stack(cfg, cfg.num_encoder_layers, causal=False, cross_attention=False,
                               rngs=rngs)
    if cfg.position == 'learned':  # one table, stored once (nnx shares the module)
      self.generator.position_embedding = self.discriminator.position_embedding
    if cfg.embed_norm:  # and one embedding LayerNorm
      self.generator.embed_norm = self.discriminator.embed_norm
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
    return output_logits(self.generator_cfg, self.embed, None, x)

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
  """Both stacks over the inputs; the generator's MLM logits, and the discriminator's 2-layer
  head (d -> d, then d -> 1) at every position."""
  del targets_length  # the targets are the inputs' positions
  return Shapes(tuple(StackShape(c, cfg.num_encoder_layers, inputs_length, causal=False)
                      for c in (cfg, generator_config(cfg))),
                logits_length=inputs_length,
                head_flops=2 * inputs_length * cfg.d_model * (cfg.d_model + 1))


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_encoder_layers')
  architecture.refuse_encoder_heads(cfg)


def hf_check(cfg: ModelConfig) -> None:
  hf_mapping.check_bert_layers(cfg, 'ELECTRA')


def hf_table(cfg: ModelConfig) -> list[Row]:
  """The discriminator's stack (and the shared embeddings it reads) and head."""
  return (hf_mapping.bert_stack_table(cfg, 'discriminator', 'electra')
          + hf_mapping.linear(('discriminator_dense',), 'discriminator_predictions.dense')
          + hf_mapping.linear(('discriminator_output',),
                              'discriminator_predictions.dense_prediction'))


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  return {'embedding_size': cfg.d_model, **hf_mapping.bert_config(cfg)}


FAMILY = Family(
    arch='electra', model=Electra, sides=('encoder',), objective='electra',
    stacks=('generator', 'discriminator'), shapes=shapes, check=check, prompt=None,
    hf=(HfModel('ELECTRA', 'ElectraForPreTraining', 'electra', check=hf_check, config=hf_config,
                table=hf_table, extra=lambda cfg: hf_mapping.zero_token_types(cfg, 'electra')),))
