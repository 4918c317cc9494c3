"""Cross entropy with z-loss and label smoothing, as T5X computes it, returned as sums.

Sums rather than means so that gradient accumulation over microbatches adds up to exactly the
big batch: the step adds the sums of its microbatches and divides once by `loss_denominator`
of the whole batch.
"""

import jax
import jax.numpy as jnp
import numpy as np

NORMALIZERS = ('real_tokens', 'total_tokens')


def cross_entropy_with_logits(logits: jax.Array, targets: jax.Array, *, z_loss: float = 0.0,
                              label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """Per-token (cross entropy + z-loss, z-loss), in float32; shapes [..., vocab] -> [...].

  With label smoothing the target distribution puts `1 - label_smoothing` on the target and
  spreads the rest evenly over the other vocab - 1 entries; the entropy of that distribution is
  subtracted so a perfect prediction scores ~0, as in T5X. z-loss (PaLM, T5X) adds
  `z_loss * logsumexp(logits)^2`, which keeps the softmax normalizer near 1 and the logits from
  drifting in bfloat16.

  Every term is a reduction over the vocab (logsumexp, the target logit, the logit sum), with no
  one-hot array, so a variant chunked over the vocab or the length can reuse it piece by piece.
  """
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f'train.label_smoothing must be in [0, 1), got {label_smoothing}')
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [...]
  is_target = jnp.arange(vocab) == targets[..., None]  # [..., vocab], fused into the sum below
  target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)  # [...]
  confidence = 1.0 - label_smoothing
  low_confidence = label_smoothing / (vocab - 1)
  # -sum_v q_v log p_v = log_z - sum_v q_v logits_v, for the smoothed target distribution q.
  smoothed_logit = (confidence - low_confidence) * target_logit
  if label_smoothing:
    smoothed_logit += low_confidence * jnp.sum(logits, axis=-1)
  entropy = -(confidence * np.log(confidence)
              + (vocab - 1) * low_confidence * np.log(low_confidence + 1e-20))
  z = z_loss * jnp.square(log_z)
  return log_z - smoothed_logit - entropy + z, z


def token_losses(logits: jax.Array, targets: jax.Array, weights: jax.Array, *,
                 z_loss: float = 0.0, label_smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Weighted sums over a batch of logits [..., vocab] against integer targets [...].

  Returns float32 scalars: `loss` (cross entropy + z-loss, what is minimised), `z_loss` (its
  z-loss part), `weight` (the sum of weights: real target tokens) and `correct` (weighted count
  of argmax == target). Positions of weight 0 (padding) contribute nothing.
  """
  weights = weights.astype(jnp.float32)
  loss, z = cross_entropy_with_logits(logits, targets, z_loss=z_loss,
                                      label_smoothing=label_smoothing)
  correct = jnp.argmax(logits, axis=-1) == targets
  return dict(loss=jnp.sum(loss * weights), z_loss=jnp.sum(z * weights),
              weight=jnp.sum(weights), correct=jnp.sum(correct * weights))


def loss_denominator(weights: jax.Array, normalizer) -> jax.Array:
  """What the summed loss of a whole batch (all microbatches) is divided by.

  'real_tokens': the sum of loss weights (the mean per real target token); 'total_tokens': the
  number of target positions, padding included; a positive number (or numeric string): that
  constant, as T5X's `loss_normalizing_factor` (e.g. batch 2048 x 114 targets = 233472).
  """
  if normalizer == 'real_tokens':
    return jnp.sum(weights.astype(jnp.float32))
  if normalizer == 'total_tokens':
    return jnp.asarray(weights.size, jnp.float32)
  try:
    constant = float(normalizer)
  except (TypeError, ValueError):
    constant = 0.0
  if not 0 < constant < float('inf'):
    raise ValueError(f'train.loss_normalizer={normalizer!r} is not one of '
                     f'{", ".join(NORMALIZERS)} or a positive number')
  return jnp.asarray(constant, jnp.float32)
