"""Packing examples into fixed-length rows, and the features each model family reads.

`pack` puts several short examples into one row, each a segment with its own id and positions
(attention never crosses segments); `pad_rows` gives an example that fills its row the same
layout. The feature converters name the rows' features as seqio's do: `encoder_decoder_features`
(EncDecFeatureConverter), `encoder_features` (EncoderFeatureConverter), `decoder_features`
(DecoderFeatureConverter) and `prefix_lm_features` (PrefixLMFeatureConverter).
"""

from __future__ import annotations  # `tf.data.Dataset` below is not a use of TensorFlow

import numpy as np
from t5lite.data.tf_setup import parallel_map, tf
from t5lite.token_ids import PAD_ID


def pack(dataset: tf.data.Dataset, lengths: dict[str, int], window: int) -> tf.data.Dataset:
  """Packs examples greedily, in order, into rows of `lengths`, looking at `window` at a time.

  Each example goes into the current row if all its features fit there, else it starts a new
  row; features longer than their length are cut. A row never mixes windows, so the rows of a
  window are a function of that window alone (what makes resuming from a window exact).
  lengths {'inputs': 5, 'targets': 3}, window 3:
    {'inputs': [8, 9, 1], 'targets': [4, 1]}
    {'inputs': [7, 1],    'targets': [1]}           fits beside the first
    {'inputs': [6, 1],    'targets': [5, 1]}        the row is full: a new row
  ->
    {'inputs': [8, 9, 1, 7, 1], 'inputs_segment_ids': [1, 1, 1, 2, 2],
     'inputs_positions': [0, 1, 2, 0, 1],
     'targets': [4, 1, 1], 'targets_segment_ids': [1, 1, 2], 'targets_positions': [0, 1, 0]}
    {'inputs': [6, 1, 0, 0, 0], 'inputs_segment_ids': [1, 1, 0, 0, 0],
     'inputs_positions': [0, 1, 0, 0, 0],
     'targets': [5, 1, 0], 'targets_segment_ids': [1, 1, 0], 'targets_positions': [0, 1, 0]}
  """
  windows = dataset.ragged_batch(window)
  return parallel_map(windows, lambda w: _pack_window(w, lengths)).unbatch()


def _ragged(tokens):
  """ragged_batch keeps features of a fixed length dense."""
  return tokens if isinstance(tokens, tf.RaggedTensor) else tf.RaggedTensor.from_tensor(tokens)


def _row_assignment(example_lengths, lengths):
  """Next-fit: (row, offset per key) of each example; example_lengths is [n, num_keys]."""
  capacity = tf.constant(lengths, tf.int32)

  def place(state, example_length):
    row, used = state
    fits = tf.reduce_all(used + example_length <= capacity)
    row = tf.where(fits, row, row + 1)
    offset = tf.where(fits, used, tf.zeros_like(used))
    return row, offset + example_length

  initial = (tf.constant(0), tf.zeros_like(capacity))
  rows, ends = tf.scan(place, example_lengths, initializer=initial)
  return rows, ends - example_lengths


def _pack_window(window: dict, lengths: dict[str, int]) -> dict:
  """One window of examples (RaggedTensors [n, (len)]) -> packed rows [num_rows, length]."""
  keys = list(lengths)
  window = {k: _ragged(window[k])[:, :lengths[k]] for k in keys}  # cut what cannot fit
  example_lengths = tf.stack([tf.cast(window[k].row_lengths(), tf.int32) for k in keys], axis=1)
  rows, offsets = _row_assignment(example_lengths, [lengths[k] for k in keys])
  num_rows = rows[-1] + 1
  # Segment ids count examples within their row from 1: index minus the row's first index.
  examples = tf.range(tf.size(rows))
  segment_ids = examples - tf.searchsorted(rows, rows, side='left') + 1
  packed = {}
  for i, key in enumerate(keys):
    tokens = window[key]
    example = tf.cast(tokens.value_rowids(), tf.int32)  # [num_tokens] example of each token
    position = tf.range(tf.size(example)) - tf.gather(tf.cast(tokens.row_starts(), tf.int32),
                                                      example)
    where = tf.stack([tf.gather(rows, example), tf.gather(offsets[:, i], example) + position], 1)
    shape = tf.stack([num_rows, lengths[key]])
    packed[key] = tf.scatter_nd(where, tokens.flat_values, shape)
    packed[f'{key}_segment_ids'] = tf.scatter_nd(where, tf.gather(segment_ids, example), shape)
    packed[f'{key}_positions'] = tf.scatter_nd(where, position, shape)
  return packed


def pad_rows(examples: dict, lengths: dict[str, int]) -> dict:
  """Each example its own row: features [..., n] padded to `lengths`, segment id 1 on tokens.

  The packed layout without packing, for examples that fill their rows, as span corruption's
  do; works on one example or a batch of equally long ones. Features without a length (a
  per-example label) pass through.
  {'inputs': [8, 9, 1], 'targets': [4, 1]}, lengths {'inputs': 4, 'targets': 3} ->
  {'inputs': [8, 9, 1, 0], 'inputs_segment_ids': [1, 1, 1, 0], 'inputs_positions': [0, 1, 2, 0],
   'targets': [4, 1, 0], 'targets_segment_ids': [1, 1, 0], 'targets_positions': [0, 1, 0]}
  """
  rows = {key: value for key, value in examples.items() if key not in lengths}
  for key, length in lengths.items():
    tokens = examples[key][..., :length]
    padding = length - tf.shape(tokens)[-1]
    rows[key] = tf.pad(tokens, [[0, 0]] * (len(tokens.shape) - 1) + [[0, padding]])
    is_token = tf.range(length) < tf.shape(tokens)[-1]
    rows[f'{key}_segment_ids'] = tf.broadcast_to(tf.cast(is_token, tf.int32), tf.shape(rows[key]))
    rows[f'{key}_positions'] = tf.broadcast_to(tf.where(is_token, tf.range(length), 0),
                                               tf.shape(rows[key]))
  return rows


def shift_right(targets, segment_ids):
  """Decoder inputs: targets shifted one to the right, 0 (T5's start token) at each segment start.

  targets [4 1 5 1 0], segment_ids [1 1 2 2 0] -> [0 4 0 5 0].
  """
  shifted = tf.pad(targets[..., :-1], [[0, 0]] * (len(targets.shape) - 1) + [[1, 0]])
  previous_segment = tf.pad(segment_ids[..., :-1],
                            [[0, 0]] * (len(segment_ids.shape) - 1) + [[1, 0]])
  return tf.where(segment_ids == previous_segment, shifted, tf.zeros_like(shifted))


def _int32(features: dict) -> dict:
  return {name: tf.cast(value, tf.int32) for name, value in features.items()}


def decoder_features(row: dict) -> dict:
  """A packed row of 'targets' -> seqio's DecoderFeatureConverter features, int32 (packed).

  targets [4 1 5 1 0], segment ids [1 1 2 2 0] -> decoder_target_tokens [4 1 5 1 0],
  decoder_input_tokens [0 4 0 5 0], decoder_loss_weights [1 1 1 1 0], segment ids, positions.
  """
  return _int32({
      'decoder_input_tokens': shift_right(row['targets'], row['targets_segment_ids']),
      'decoder_target_tokens': row['targets'],
      'decoder_segment_ids': row['targets_segment_ids'],
      'decoder_positions': row['targets_positions'],
      'decoder_loss_weights': row['targets'] != PAD_ID,
  })


def encoder_decoder_features(row: dict) -> dict:
  """A packed row -> the int32 features of seqio's EncDecFeatureConverter (packed)."""
  return _int32({
      'encoder_input_tokens': row['inputs'],
      'encoder_segment_ids': row['inputs_segment_ids'],
      'encoder_positions': row['inputs_positions'],
      **decoder_features(row),
  })


def encoder_features(row: dict) -> dict:
  """A packed row of 'inputs' and 'targets' -> seqio's EncoderFeatureConverter features, int32.

  Loss where targets are not padding: MLM's targets are 0 except at the selected tokens.
  inputs [7 <M> 9], targets [0 8 0] -> encoder_input_tokens [7 <M> 9],
  encoder_target_tokens [0 8 0], encoder_loss_weights [0 1 0], segment ids, positions.
  """
  return _int32({
      'encoder_input_tokens': row['inputs'],
      'encoder_target_tokens': row['targets'],
      'encoder_segment_ids': row['inputs_segment_ids'],
      'encoder_positions': row['inputs_positions'],
      'encoder_loss_weights': row['targets'] != PAD_ID,
  })


def encoder_pair_features(row: dict) -> dict:
  """`encoder_features` plus BERT's segment A/B of each token and next-sentence label per row:
  encoder_token_types (b, l) and next_sentence_labels (b,), 0 if B follows A, 1 if random."""
  features = encoder_features(row)
  features.update(_int32({'encoder_token_types': row['token_types'],
                          'next_sentence_labels': row['next_sentence']}))
  return features


def prefix_lm_features(row: dict) -> dict:
  """A packed row of 'targets' and 'prefix' -> seqio's PrefixLMFeatureConverter features.

  No loss on the prefix; `decoder_causal_attention` is 1 over the prefix and one position more
  (the decoder input there is the prefix's last token), where attention is bidirectional.
  targets [7 8 5 3 9 0], prefix [1 1 1 0 0 0] ->
    decoder_input_tokens     [0 7 8 5 3 0]
    decoder_loss_weights     [0 0 0 1 1 0]
    decoder_causal_attention [1 1 1 1 0 0]
  """
  features = decoder_features(row)
  prefix = row['prefix'] > 0
  shifted = shift_right(row['prefix'], row['targets_segment_ids']) > 0
  features['decoder_loss_weights'] *= tf.cast(~prefix, tf.int32)
  features['decoder_causal_attention'] = tf.cast(prefix | shifted, tf.int32)
  return features


def packing_efficiency(batches) -> dict[str, float]:
  """Fraction of non-pad tokens in the encoder and decoder rows of numpy batches."""
  counts = np.zeros(4)
  for batch in batches:
    counts += [np.count_nonzero(batch['encoder_segment_ids']), batch['encoder_segment_ids'].size,
               np.count_nonzero(batch['decoder_segment_ids']), batch['decoder_segment_ids'].size]
  return {'encoder': counts[0] / counts[1], 'decoder': counts[2] / counts[3]}
