"""Cross entropy with z-loss and label smoothing, as T5X computes it, returned as sums.

Sums rather than means so that gradient accumulation over microbatches adds up to exactly the
big batch: the step adds the sums of its microbatches and divides once by `loss_denominator`
of the whole batch. With `groups` (a mixture's rows by component), the token losses also come
summed per group, so that per-component metrics add up the same way.
"""

from typing import Callable

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
  # A product, not jnp.where(is_target, logits, 0.0): that one's zeros [..., vocab] depend on
  # nothing, so under chunked_token_losses' loop autodiff hoists them out as a stored array.
  target_logit = jnp.sum(logits * is_target, axis=-1)  # [...]
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
                 z_loss: float = 0.0, label_smoothing: float = 0.0,
                 groups: jax.Array | None = None) -> dict[str, jax.Array]:
  """Weighted sums over a batch of logits [b, ..., vocab] against integer targets [b, ...].

  Returns float32 scalars: `loss` (cross entropy + z-loss, what is minimised), `z_loss` (its
  z-loss part), `weight` (the sum of weights: real target tokens) and `correct` (weighted count
  of argmax == target). Positions of weight 0 (padding) contribute nothing. With `groups`
  (float32 [b, G], each row's group one-hot: a mixture's components), also `group_loss`,
  `group_weight` and `group_correct`, float32 [G]: the same sums over each group's rows.
  """
  weights = weights.astype(jnp.float32)
  loss, z = cross_entropy_with_logits(logits, targets, z_loss=z_loss,
                                      label_smoothing=label_smoothing)
  correct = jnp.argmax(logits, axis=-1) == targets
  sums = dict(loss=jnp.sum(loss * weights), z_loss=jnp.sum(z * weights),
              weight=jnp.sum(weights), correct=jnp.sum(correct * weights))
  if groups is not None:
    sums.update(group_sums(groups, loss=loss * weights, weight=weights,
                           correct=correct * weights))
  return sums


def group_sums(groups: jax.Array, **values: jax.Array) -> dict[str, jax.Array]:
  """Per-token values [b, ...] summed over each group's rows: {name: [b, ...]} ->
  {'group_' + name: [G]}, for rows' groups [b, G] one-hot.

  groups [[1 0] [0 1] [1 0]], weight [[1 1] [1 0] [0 1]] -> group_weight [3 1]
  """
  sums = {}
  for name, value in values.items():
    rows = jnp.sum(value.reshape(value.shape[0], -1), axis=-1)  # [b, ...] -> [b]
    # [b, 1] * [b, G] summed over b -> [G]: a float32 sum, where a matmul may round to bfloat16
    # (TPU) or TF32 (GPU) at default precision
    sums[f'group_{name}'] = jnp.sum(rows[:, None] * groups, axis=0)
  return sums


def chunked_token_losses(x: jax.Array, project: Callable[[jax.Array], jax.Array],
                         targets: jax.Array, weights: jax.Array, num_chunks: int, *,
                         z_loss: float = 0.0, label_smoothing: float = 0.0,
                         groups: jax.Array | None = None) -> dict[str, jax.Array]:
  """`token_losses(project(x), targets, weights, groups=groups)` without ever holding all the
  logits.

  For vocabularies large enough that the float32 logits [b, l, vocab] and their gradient are
  the biggest arrays of a train step. The length is padded with weight 0 to a multiple of
  `num_chunks` and every row cut into `num_chunks` slices of c positions, so each chunk [b, c]
  keeps the batch axis and its sharding. `jax.lax.map` projects one chunk's hidden states
  x [b, c, d] at a time and keeps only its sums; under `jax.checkpoint` the backward pass
  recomputes each chunk's logits rather than storing them. The logits then take [b, c, vocab]
  at a time, for a second projection matmul in the backward pass.
  """
  if num_chunks < 1:
    raise ValueError(f'train.loss_chunks must be 0 (off) or a number of chunks, got {num_chunks}')
  batch, length = targets.shape
  size = -(-length // num_chunks)  # c, rounded up

  def chunks(a):  # [b, l, ...] -> [num_chunks, b, c, ...]
    a = jnp.pad(a, [(0, 0), (0, size * num_chunks - length)] + [(0, 0)] * (a.ndim - 2))
    return jnp.moveaxis(a.reshape(batch, num_chunks, size, *a.shape[2:]), 1, 0)

  @jax.checkpoint
  def chunk_sums(chunk):
    x, targets, weights = chunk
    return token_losses(project(x), targets, weights, z_loss=z_loss,
                        label_smoothing=label_smoothing, groups=groups)  # groups: every row's

  sums = jax.lax.map(chunk_sums, (chunks(x), chunks(targets), chunks(weights)))
  return jax.tree.map(lambda s: jnp.sum(s, axis=0), sums)


def binary_losses(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> dict[str, jax.Array]:
  """Weighted sums of sigmoid cross entropy for logits [...] against boolean labels [...].

  `loss` is -log sigmoid(logit) where the label is true and -log(1 - sigmoid(logit)) where
  false, computed stably as softplus(logit) - label * logit; `correct` counts logit > 0 == label.
  """
  logits, weights = logits.astype(jnp.float32), weights.astype(jnp.float32)
  loss = jax.nn.softplus(logits) - labels * logits
  correct = (logits > 0) == labels
  return dict(loss=jnp.sum(loss * weights), weight=jnp.sum(weights),
              correct=jnp.sum(correct * weights))


def distillation_losses(student_logits: jax.Array, teacher_logits: jax.Array,
                        weights: jax.Array, temperature: float) -> dict[str, jax.Array]:
  """Weighted sums of T^2 KL(teacher || student) between their softmaxes at temperature T.

  Hinton et al. (2015): the soft targets are softmax(teacher / T); their gradients scale as
  1/T^2, so the loss is multiplied by T^2 to keep its weight against the hard-label loss
  independent of T. `agreement` counts tokens where the two argmaxes agree.
  """
  weights = weights.astype(jnp.float32)
  student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)  # [..., vocab] -> [...]
  agreement = jnp.argmax(student_logits, axis=-1) == jnp.argmax(teacher_logits, axis=-1)
  return dict(loss=temperature**2 * jnp.sum(kl * weights), weight=jnp.sum(weights),
              agreement=jnp.sum(agreement * weights))


def cosine_losses(x: jax.Array, y: jax.Array, weights: jax.Array) -> dict[str, jax.Array]:
  """Weighted sums of 1 - cos(x, y) between vectors [..., d] (DistilBERT's hidden-state loss)."""
  x, y, weights = x.astype(jnp.float32), y.astype(jnp.float32), weights.astype(jnp.float32)
  norms = jnp.linalg.norm(x, axis=-1) * jnp.linalg.norm(y, axis=-1)
  cosine = jnp.sum(x * y, axis=-1) / jnp.maximum(norms, 1e-8)  # [..., d] -> [...]
  return dict(loss=jnp.sum((1.0 - cosine) * weights), weight=jnp.sum(weights))


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


def sequence_sums(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                  segment_ids: jax.Array) -> dict[str, jax.Array]:
  """Counts of target sequences (the packed segments of [b, l] rows) and of exact ones.

  A sequence is exact when the argmax matches every one of its weighted target tokens, EOS
  included. With teacher forcing that is exactly when greedy decoding would output the target:
  each greedy step then sees the same previous tokens as the teacher-forced one and picks the
  same argmax, up to the EOS where greedy decoding stops. So `exact / sequences` is the
  accuracy of greedy decoding (classification as text, exact match), computed without a decoder.
  segment_ids [[1 1 2 2 0]], argmax right at [[T T T F T]] -> sequences 2, exact 1.
  """
  real = weights > 0
  wrong = real & (jnp.argmax(logits, axis=-1) != targets)  # [b, l]
  # A segment holds at least one token, so ids run below l + 1: [b, l, 1] vs [l] -> [b, l, l]
  in_segment = segment_ids[..., None] == jnp.arange(1, targets.shape[-1] + 1)
  present = jnp.any(in_segment & real[..., None], axis=-2)  # [b, l]: segment s+1 has tokens
  missed = jnp.any(in_segment & wrong[..., None], axis=-2)
  return dict(sequences=jnp.sum(present, dtype=jnp.float32),
              exact=jnp.sum(present & ~missed, dtype=jnp.float32))
