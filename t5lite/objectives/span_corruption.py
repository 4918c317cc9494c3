"""T5's span corruption (Raffel et al. 2020, section 3.1.4), for encoder-decoder models.

15% of the tokens, in spans of 3 on average, each replaced by a sentinel in the inputs; the
targets are the spans, each after its sentinel. `data.inputs_length` fixes the raw chunk so
that the corrupted inputs fill their row exactly (`random_spans_helper`):
  raw     A B C D E F G H I J       noise spans [C D] and [I J]
  inputs  A B <X0> E F G H <X1> EOS
  targets <X0> C D <X1> I J EOS
With `data.mode` (UL2's mode token, e.g. '[NLU]') the inputs start with that text's ids, and the
raw chunk is the one whose corrupted inputs fill the rest of the row.
The loss is the token cross entropy on the decoder's targets.

Each span's sentinel counts down from `<extra_id_0>` (vocab_size - 1): <X0> above, <X1> =
vocab_size - 2, as T5's preprocessors name them (`t5.data.preprocessors`); past the 100th they
count on into the vocabulary's last pieces, as in T5. The byte vocabulary's count up from 259, as
ByT5Tokenizer numbers them, and an example may hold as many spans as it has sentinels (125: at
ByT5's mean span of 20 bytes, 1,024 inputs make 9).
"""

import ml_collections

from t5lite.data import vocabulary
from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base
from t5lite.token_ids import EOS_ID, PAD_ID


class SpanCorruption(base.EncoderDecoderObjective):
  name = 'span_corruption'
  settings = row_settings = ('noise_density', 'mean_noise_span_length', 'mode')

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """random_spans_helper's raw length for the inputs the mode tokens leave; checks that the
    targets can hold a corrupted example."""
    mode = len(base.mode_tokens(data))
    base.at_least(data, 'inputs_length', mode + 2)  # a sentinel and EOS
    raw_length, targets_length = random_spans_helper(
        data.inputs_length - mode, data.noise_density, data.mean_noise_span_length)
    if data.targets_length < targets_length:
      raise ValueError(f'data.targets_length={data.targets_length} is too short for span '
                       f'corruption of {data.inputs_length} inputs (density '
                       f'{data.noise_density}, mean span {data.mean_noise_span_length}): it '
                       f'needs {targets_length}')
    _check_sentinels(data, raw_length)
    return raw_length

  def transform(self, examples, data, vocab):
    return corrupt_spans(examples, vocab.sentinel_id(0), vocab.sentinel_step)


def _check_sentinels(data: ml_collections.ConfigDict, raw_length: int) -> None:
  """Refuses more spans an example than the byte vocabulary has sentinels (they count up from
  259, and would run past its last id)."""
  if data.vocabulary != vocabulary.BYTES:
    return
  vocab = vocabulary.BYTE_VOCABULARY
  noise = max(1, round(raw_length * data.noise_density))
  spans = max(1, round(noise / data.mean_noise_span_length))
  if spans > vocab.num_sentinels:
    raise ValueError(f'span corruption of {data.inputs_length} inputs (density '
                     f'{data.noise_density}, mean span {data.mean_noise_span_length}) makes '
                     f'{spans} spans an example, more than the {vocab.num_sentinels} sentinels '
                     f'of data.vocabulary={data.vocabulary!r}; give a longer '
                     'data.mean_noise_span_length or fewer data.inputs_length')


def corrupt_spans(dataset, sentinel_id: int, sentinel_step: int = -1):
  """{'targets': raw tokens, 'seed': int64[2], 'noise_density', 'mean_noise_span_length', and
  optionally 'mode'} -> {'inputs', 'targets'}, each ending in EOS, the inputs starting with
  the mode's ids. Each example carries its own noise: a mixture's differ row by row.

  Split the text into chunks of `random_spans_helper(inputs_length)[0]` tokens first, as T5
  does, and the outputs have exactly inputs_length and targets_length tokens. Sentinel n is
  sentinel_id + n * sentinel_step.
  """
  def corrupt(example):
    tokens = example['targets']
    seeds = tf.random.experimental.stateless_split(example['seed'], 2)
    noise_mask = random_spans_noise_mask(tf.size(tokens), example['noise_density'],
                                         example['mean_noise_span_length'], seeds)
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {
        'inputs': tf.concat([*mode_ids(example, tokens.dtype),
                             noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id,
                                                           sentinel_step), eos],
                            axis=0),
        'targets': tf.concat(
            [nonnoise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id, sentinel_step),
             eos], axis=0),
    }

  return parallel_map(dataset, corrupt)


def mode_ids(example: dict, dtype) -> list:
  """The ids an example's inputs start with (UL2's mode token, e.g. the encoded text [NLU]),
  as a list of one tensor: its 'mode', padded with PAD_ID to the longest of its chain's; []
  without one (no op on a mode-less chain's examples)."""
  if 'mode' not in example:
    return []
  mode = tf.cast(example['mode'], dtype)
  return [tf.boolean_mask(mode, mode != PAD_ID)]


def random_spans_noise_mask(length, noise_density, mean_noise_span_length, seeds):
  """Boolean mask of `length` made of alternating non-noise/noise spans, non-noise first.
  (`noise_density` and `mean_noise_span_length`: floats, or an example's float32 scalars.)

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


def _random_segmentation(num_items, num_segments, seed):
  """Lengths of `num_segments` non-empty segments that partition `num_items`, all equally likely.

  Chooses num_segments - 1 distinct cut points among the num_items - 1 gaps.
  """
  gaps = tf.random.experimental.stateless_shuffle(tf.range(1, num_items), seed)
  bounds = tf.concat([[0], tf.sort(gaps[:num_segments - 1]), [num_items]], axis=0)
  return bounds[1:] - bounds[:-1]


def noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id: int, sentinel_step: int = -1):
  """Replaces each noise span with one sentinel, counting from `sentinel_id` (<extra_id_0>) by
  `sentinel_step` (T5's down, the byte vocabulary's up).

  tokens [A B C D E], noise_mask [0 1 1 0 1] -> [A <X0> D <X1>].
  """
  previous_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
  span_start = noise_mask & ~previous_is_noise
  spans_so_far = tf.cumsum(tf.cast(span_start, tokens.dtype))
  sentinels = sentinel_id + sentinel_step * (spans_so_far - 1)
  tokens = tf.where(span_start, sentinels, tokens)
  return tf.boolean_mask(tokens, ~(noise_mask & previous_is_noise))


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id: int,
                                     sentinel_step: int = -1):
  """The targets side: each non-noise span becomes a sentinel, noise tokens stay.

  tokens [A B C D E], noise_mask [0 1 1 0 1] -> [<X0> B C <X1> E].
  """
  return noise_span_to_unique_sentinel(tokens, ~noise_mask, sentinel_id, sentinel_step)


def random_spans_helper(inputs_length: int, noise_density: float = 0.15,
                        mean_noise_span_length: float = 3.0) -> tuple[int, int]:
  """(raw tokens per example, targets length) so that corrupted inputs fill `inputs_length`.

  Counts one sentinel per noise span in both inputs and targets and one EOS in each, as T5:
  512 -> (568, 114), 256 -> (284, 58), 1024 -> (1137, 229), 128 -> (141, 29). Where T5 counts
  no span (fewer noise tokens than half a mean span: 122 inputs at (0.15, 64)), this counts the
  one span the noise mask makes, so the inputs still fit their row.
  """
  def lengths(tokens_length):
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_noise_spans = max(1, int(round(num_noise_tokens / mean_noise_span_length)))
    return (tokens_length - num_noise_tokens + num_noise_spans + 1,
            num_noise_tokens + num_noise_spans + 1)

  tokens_length = inputs_length - 1
  while lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  targets_length = lengths(tokens_length)[1]
  if noise_density == 0.5 and targets_length > inputs_length:  # T5 keeps targets <= inputs here
    tokens_length, targets_length = tokens_length - 1, targets_length - 1
  return tokens_length, targets_length


OBJECTIVE = SpanCorruption()
