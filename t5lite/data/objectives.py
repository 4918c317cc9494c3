"""Span corruption, T5's pretraining objective (Raffel et al. 2020, section 3.1.4), as tf.data ops.

Functions and arguments are named as in `t5.data.preprocessors`; the per-example ops work on
tensors (eagerly or traced), `span_corruption` is a Dataset -> Dataset function. Randomness is
stateless: each example carries its own `seed`, so an example is a function of (seed, tokens)
wherever and whenever it is computed.

One example, 10 tokens, noise spans [C D] and [I J] (T5's masks start with non-noise and end
with noise):
  targets (raw)  A B C D E F G H I J     noise_mask 0 0 1 1 0 0 0 0 1 1
  inputs  ->     A B <X0> E F G H <X1> EOS
  targets ->     <X0> C D <X1> I J EOS
where <X0> = <extra_id_0> = vocab_size - 1, <X1> = vocab_size - 2.
"""

import tensorflow as tf

from t5lite.data.vocabulary import EOS_ID


def random_spans_helper(inputs_length: int, noise_density: float = 0.15,
                        mean_noise_span_length: float = 3.0) -> tuple[int, int]:
  """(raw tokens per example, targets length) so that corrupted inputs fill `inputs_length`.

  Counts one sentinel per noise span in both inputs and targets and one EOS in each, as T5:
  512 -> (568, 114), 256 -> (284, 58), 1024 -> (1137, 229), 128 -> (141, 29).
  """
  def lengths(tokens_length):
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
    return (tokens_length - num_noise_tokens + num_noise_spans + 1,
            num_noise_tokens + num_noise_spans + 1)

  tokens_length = inputs_length - 1
  while lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  targets_length = lengths(tokens_length)[1]
  if noise_density == 0.5 and targets_length > inputs_length:  # T5 keeps targets <= inputs here
    tokens_length, targets_length = tokens_length - 1, targets_length - 1
  return tokens_length, targets_length


def _random_segmentation(num_items, num_segments, seed):
  """Lengths of `num_segments` non-empty segments that partition `num_items`, all equally likely.

  Chooses num_segments - 1 distinct cut points among the num_items - 1 gaps.
  """
  gaps = tf.random.experimental.stateless_shuffle(tf.range(1, num_items), seed)
  bounds = tf.concat([[0], tf.sort(gaps[:num_segments - 1]), [num_items]], axis=0)
  return bounds[1:] - bounds[:-1]


def random_spans_noise_mask(length, noise_density: float, mean_noise_span_length: float, seeds):
  """Boolean mask of `length` made of alternating non-noise/noise spans, non-noise first.

  round(length * noise_density) noise tokens in round(noise / mean_noise_span_length) spans;
  span lengths are a uniformly random segmentation (seeds: two stateless seeds, shape [2, 2]).
  E.g. length 10, density 0.3, mean 2 -> 3 noise tokens in 2 spans: [0 0 1 1 0 0 0 1 0 0].
  """
  orig_length = length
  length = tf.maximum(length, 2)  # degenerate lengths still get one noise and one clean token
  num_noise_tokens = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
  num_noise_tokens = tf.clip_by_value(num_noise_tokens, 1, length - 1)
  num_noise_spans = tf.cast(
      tf.round(tf.cast(num_noise_tokens, tf.float32) / mean_noise_span_length), tf.int32)
  num_noise_spans = tf.maximum(num_noise_spans, 1)
  noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans, seeds[0])
  nonnoise_span_lengths = _random_segmentation(length - num_noise_tokens, num_noise_spans,
                                               seeds[1])
  span_lengths = tf.reshape(tf.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [-1])
  is_noise_span = tf.tile([False, True], [num_noise_spans])
  return tf.repeat(is_noise_span, span_lengths)[:orig_length]


def noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id: int):
  """Replaces each noise span with one sentinel, counting down from `sentinel_id` (<extra_id_0>).

  tokens [A B C D E], noise_mask [0 1 1 0 1] -> [A <X0> D <X1>].
  """
  previous_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
  span_start = noise_mask & ~previous_is_noise
  sentinels = sentinel_id + 1 - tf.cumsum(tf.cast(span_start, tokens.dtype))
  tokens = tf.where(span_start, sentinels, tokens)
  return tf.boolean_mask(tokens, ~(noise_mask & previous_is_noise))


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id: int):
  """The targets side: each non-noise span becomes a sentinel, noise tokens stay.

  tokens [A B C D E], noise_mask [0 1 1 0 1] -> [<X0> B C <X1> E].
  """
  return noise_span_to_unique_sentinel(tokens, ~noise_mask, sentinel_id)


def span_corruption(dataset: tf.data.Dataset, sentinel_id: int, noise_density: float = 0.15,
                    mean_noise_span_length: float = 3.0) -> tf.data.Dataset:
  """{'targets': raw tokens, 'seed': int64[2]} -> {'inputs', 'targets'}, each ending in EOS.

  Split the text into chunks of `random_spans_helper(inputs_length)[0]` tokens first, as T5
  does, and the outputs have exactly inputs_length and targets_length tokens.
  """
  def corrupt(example):
    tokens = example['targets']
    seeds = tf.random.experimental.stateless_split(example['seed'], 2)
    noise_mask = random_spans_noise_mask(tf.size(tokens), noise_density, mean_noise_span_length,
                                         seeds)
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {
        'inputs': tf.concat([noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id), eos],
                            axis=0),
        'targets': tf.concat(
            [nonnoise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id), eos], axis=0),
    }

  return dataset.map(corrupt, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
