"""ELECTRA's replaced-token detection (Clark et al. 2020), for `model.arch='electra'`.

The data are `mlm`'s. The generator's MLM loss on the masked positions, plus
REPLACED_TOKEN_WEIGHT times the discriminator's binary cross entropy on every real token of the
batch with the masked positions filled by the generator's samples (no gradient through them).
A mixture's per-component `loss/NAME` and `accuracy/NAME` are the generator's MLM ones (compare
them with `mlm_loss`).
"""

import jax
import jax.numpy as jnp

from t5lite.models import Features
from t5lite.objectives import base
from t5lite.objectives import losses
from t5lite.objectives import mlm
from t5lite.token_ids import PAD_ID

REPLACED_TOKEN_WEIGHT = 50.0  # the paper's lambda: the discriminator's loss is much the smaller


class Electra(mlm.MaskedLM):
  name = 'electra'
  arch = 'electra'
  token_loss = False

  def loss(self, model_cfg, train_cfg, *, exact_match=False) -> base.Loss:
    del exact_match  # evaluation reports the generator's and the discriminator's metrics
    normalizer = train_cfg.loss_normalizer

    def sums(model, batch, frozen_params, key, *, train):
      del frozen_params
      sample_key, key = jax.random.split(key)
      rngs = base.dropout_rngs(model_cfg, key, train)
      logits = model.generator_logits(batch, deterministic=rngs is None, rngs=rngs)  # (b, l, v)
      masked_lm = losses.token_losses(logits, batch['encoder_target_tokens'],
                                      batch['encoder_loss_weights'], z_loss=train_cfg.z_loss,
                                      label_smoothing=train_cfg.label_smoothing,
                                      groups=base.component_groups(batch))
      original = original_tokens(batch)
      corrupted, replaced = replace_tokens(original, batch['encoder_loss_weights'] > 0,
                                           sample_tokens(sample_key, logits))
      features = Features(corrupted, batch.get('encoder_segment_ids'),
                          batch.get('encoder_positions'))
      discriminator = losses.binary_losses(
          model.discriminator_logits(features, deterministic=rngs is None, rngs=rngs), replaced,
          original != PAD_ID)
      discriminator['replaced'] = jnp.sum(replaced, dtype=jnp.float32)
      return {'mlm': masked_lm, 'discriminator': discriminator}

    def denominators(batch):
      return {'mlm': losses.loss_denominator(batch['encoder_loss_weights'], normalizer),
              'discriminator': losses.loss_denominator(original_tokens(batch) != PAD_ID,
                                                       normalizer)}

    minimised = base.sum_of_means({'mlm': 1.0, 'discriminator': REPLACED_TOKEN_WEIGHT})

    def metrics(sums):
      discriminator = sums['discriminator']
      return {'loss': minimised(sums, base.term_weights(sums)),
              'accuracy': base.per_token(discriminator, 'correct'),
              **base.mlm_metrics(sums['mlm']),
              'discriminator_loss': base.per_token(discriminator, 'loss'),
              'replaced': base.per_token(discriminator, 'replaced')}  # fraction replaced

    return base.Loss(sums, denominators, minimised, metrics)


def original_tokens(batch) -> jax.Array:
  """The text an MLM batch was made from: the targets where masked, the inputs elsewhere."""
  return jnp.where(batch['encoder_loss_weights'] > 0, batch['encoder_target_tokens'],
                   batch['encoder_input_tokens'])


def sample_tokens(key: jax.Array, logits: jax.Array) -> jax.Array:
  """A token per position from softmax(logits) (b, l, v), by the Gumbel-max trick
  (`jax.random.categorical`); never the padding id, and no gradient through the choice."""
  logits = jnp.where(jnp.arange(logits.shape[-1]) == PAD_ID, -jnp.inf,
                     jax.lax.stop_gradient(logits))
  return jax.random.categorical(key, logits, axis=-1)  # (b, l, v) -> (b, l)


def replace_tokens(original: jax.Array, masked: jax.Array,
                   sampled: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The discriminator's input and labels: samples at the masked positions, the original text
  elsewhere; a sample equal to the original token counts as not replaced, as in the paper.

  original [5 6 7 8], masked [0 1 1 0], sampled [9 6 3 9] -> input [5 6 3 8], replaced [0 0 1 0]
  """
  corrupted = jnp.where(masked, sampled, original)
  return corrupted, corrupted != original


OBJECTIVE = Electra()
