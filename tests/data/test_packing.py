"""Packing, padding and EncDecFeatureConverter features, eagerly and inside tf.data."""

import numpy as np
import pytest
import tensorflow as tf

from t5lite.data import packing

LENGTHS = {'inputs': 5, 'targets': 3}


def dataset(examples):
  return tf.data.Dataset.from_generator(
      lambda: iter(examples),
      output_signature={k: tf.TensorSpec([None], tf.int32) for k in ('inputs', 'targets')})


def test_pack_worked_example_from_the_docstring():
  examples = [{'inputs': [8, 9, 1], 'targets': [4, 1]}, {'inputs': [7, 1], 'targets': [1]},
              {'inputs': [6, 1], 'targets': [5, 1]}]
  rows = list(packing.pack(dataset(examples), LENGTHS, window=3).as_numpy_iterator())
  assert len(rows) == 2
  expected = [
      {'inputs': [8, 9, 1, 7, 1], 'inputs_segment_ids': [1, 1, 1, 2, 2],
       'inputs_positions': [0, 1, 2, 0, 1], 'targets': [4, 1, 1],
       'targets_segment_ids': [1, 1, 2], 'targets_positions': [0, 1, 0]},
      {'inputs': [6, 1, 0, 0, 0], 'inputs_segment_ids': [1, 1, 0, 0, 0],
       'inputs_positions': [0, 1, 0, 0, 0], 'targets': [5, 1, 0],
       'targets_segment_ids': [1, 1, 0], 'targets_positions': [0, 1, 0]}]
  for row, want in zip(rows, expected):
    assert {k: v.tolist() for k, v in row.items()} == want


def random_examples(count, rng):
  return [{'inputs': rng.integers(2, 100, rng.integers(1, 9)).astype(np.int32),
           'targets': rng.integers(2, 100, rng.integers(1, 6)).astype(np.int32)}
          for _ in range(count)]


@pytest.mark.parametrize('window', [1, 4, 64])
def test_pack_keeps_every_token_in_order_and_never_crosses_a_window(window):
  lengths = {'inputs': 12, 'targets': 8}
  examples = random_examples(200, np.random.default_rng(window))
  rows = list(packing.pack(dataset(examples), lengths, window).as_numpy_iterator())
  unpacked = []
  for row in rows:
    for segment in range(1, row['inputs_segment_ids'].max() + 1):
      example = {}
      for key in lengths:
        here = row[f'{key}_segment_ids'] == segment
        np.testing.assert_array_equal(row[f'{key}_positions'][here], np.arange(here.sum()))
        example[key] = row[key][here].tolist()
      unpacked.append(example)
  assert unpacked == [{k: v.tolist() for k, v in e.items()} for e in examples]
  counts = np.array([r['inputs_segment_ids'].max() for r in rows])
  firsts = np.cumsum(counts) - counts  # index of each row's first example
  np.testing.assert_array_equal(firsts // window, (firsts + counts - 1) // window)
  assert packing.packing_efficiency(
      [{'encoder_segment_ids': r['inputs_segment_ids'], 'decoder_segment_ids':
        r['targets_segment_ids']} for r in rows])['encoder'] > (0.6 if window > 1 else 0.0)


def test_pack_cuts_examples_longer_than_a_row():
  rows = list(packing.pack(dataset([{'inputs': list(range(2, 12)), 'targets': [3, 1]}]),
                           LENGTHS, window=2).as_numpy_iterator())
  assert rows[0]['inputs'].tolist() == [2, 3, 4, 5, 6]


def test_pad_rows_eagerly_and_in_tf_data():
  batch = {'inputs': tf.constant([[8, 9, 1], [5, 6, 1]]), 'targets': tf.constant([[4, 1],
                                                                                  [7, 1]])}
  eager = packing.pad_rows(batch, {'inputs': 4, 'targets': 3})
  traced = next(iter(tf.data.Dataset.from_tensors(batch).map(
      lambda b: packing.pad_rows(b, {'inputs': 4, 'targets': 3}))))
  for rows in (eager, traced):
    assert rows['inputs'].numpy().tolist() == [[8, 9, 1, 0], [5, 6, 1, 0]]
    assert rows['inputs_segment_ids'].numpy().tolist() == [[1, 1, 1, 0]] * 2
    assert rows['targets_positions'].numpy().tolist() == [[0, 1, 0]] * 2


def test_shift_right_restarts_at_each_segment():
  targets = tf.constant([[4, 1, 5, 1, 0]])
  segment_ids = tf.constant([[1, 1, 2, 2, 0]])
  traced = next(iter(tf.data.Dataset.from_tensors((targets, segment_ids)).map(
      packing.shift_right)))
  for shifted in (packing.shift_right(targets, segment_ids), traced):
    assert shifted.numpy().tolist() == [[0, 4, 0, 5, 0]]


def test_encoder_decoder_features_are_seqio_names_int32():
  row = next(iter(packing.pack(dataset([{'inputs': [8, 1], 'targets': [4, 1]}]), LENGTHS, 1)))
  features = packing.encoder_decoder_features(row)
  assert set(features) == {
      'encoder_input_tokens', 'encoder_segment_ids', 'encoder_positions', 'decoder_input_tokens',
      'decoder_target_tokens', 'decoder_segment_ids', 'decoder_positions', 'decoder_loss_weights'}
  assert all(v.dtype == tf.int32 for v in features.values())
  assert features['decoder_input_tokens'].numpy().tolist() == [0, 4, 0]
  assert features['decoder_loss_weights'].numpy().tolist() == [1, 1, 0]
