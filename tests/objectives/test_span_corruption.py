"""Span corruption against T5's numbers, an independent numpy model of it, and reconstruction."""

import numpy as np
import pytest
import tensorflow as tf

from t5lite.objectives import span_corruption

SENTINEL = 8099  # <extra_id_0> of the bundled 8,100-id vocabulary
EOS = 1


def seeds(i):
  """Two stateless seeds for example i (an int or a scalar tensor)."""
  return tf.random.experimental.stateless_split(tf.stack([tf.constant(7, tf.int64),
                                                          tf.cast(i, tf.int64)]), 2)


def in_dataset(fn, *args):
  """Runs fn(*args) inside a tf.data map, the way the pipeline runs it."""
  ds = tf.data.Dataset.from_tensors(tuple(tf.constant(a) for a in args)).map(fn)
  return next(iter(ds))


@pytest.mark.parametrize('inputs_length, raw, targets', [(512, 568, 114), (256, 284, 58),
                                                         (1024, 1137, 229), (128, 141, 29)])
def test_random_spans_helper_matches_t5(inputs_length, raw, targets):
  assert span_corruption.random_spans_helper(inputs_length, 0.15, 3.0) == (raw, targets)


def test_noise_span_to_unique_sentinel_worked_example():
  tokens = tf.constant([10, 11, 12, 13, 14])
  mask = tf.constant([False, True, True, False, True])
  expected_inputs, expected_targets = [10, SENTINEL, 13, SENTINEL - 1], [SENTINEL, 11, 12,
                                                                         SENTINEL - 1, 14]
  for run in (lambda f, *a: f(*a), in_dataset):
    inputs = run(lambda t, m: span_corruption.noise_span_to_unique_sentinel(t, m, SENTINEL), tokens,
                 mask)
    targets = run(lambda t, m: span_corruption.nonnoise_span_to_unique_sentinel(t, m, SENTINEL),
                  tokens, mask)
    assert inputs.numpy().tolist() == expected_inputs
    assert targets.numpy().tolist() == expected_targets


@pytest.mark.parametrize('length', [1, 2, 10, 141, 568])
def test_noise_mask_counts_eagerly_and_in_tf_data(length):
  num_noise = min(max(round(max(length, 2) * 0.15), 1), max(length, 2) - 1)
  num_spans = max(round(num_noise / 3.0), 1)
  eager = span_corruption.random_spans_noise_mask(length, 0.15, 3.0, seeds(0)).numpy()
  traced = in_dataset(lambda s: span_corruption.random_spans_noise_mask(length, 0.15, 3.0, s),
                      seeds(0)).numpy()
  np.testing.assert_array_equal(eager, traced)  # stateless: same seed, same mask anywhere
  assert eager.shape == (length,)
  if length >= 10:
    assert eager.sum() == num_noise
    assert not eager[0] and eager[-1]  # non-noise first, noise last, as T5
    starts = eager & ~np.concatenate([[False], eager[:-1]])
    assert starts.sum() == num_spans


def reconstruct(inputs, targets):
  """The original tokens, from inputs with sentinels and targets that fill them in."""
  fills, sentinel = {}, None
  for t in targets[:-1]:
    if t > SENTINEL - 100:
      sentinel = t
      fills[sentinel] = []
    else:
      fills[sentinel].append(t)
  out = []
  for t in inputs[:-1]:
    out.extend(fills[t] if t > SENTINEL - 100 else [t])
  return out


def corrupted(num_examples: int, length: int):
  tokens = tf.range(3, 3 + length, dtype=tf.int32)
  ds = tf.data.Dataset.range(num_examples).map(lambda i: {
      'targets': tokens, 'seed': tf.random.experimental.stateless_fold_in([0, 0], i),
      'noise_density': 0.15, 'mean_noise_span_length': 3.0})
  return list(span_corruption.corrupt_spans(ds, SENTINEL).as_numpy_iterator())


def test_lengths_and_reconstruction():
  raw, targets_length = span_corruption.random_spans_helper(128)
  for example in corrupted(20, raw):
    assert len(example['inputs']) == 128 and len(example['targets']) == targets_length
    assert example['inputs'][-1] == EOS and example['targets'][-1] == EOS
    assert reconstruct(example['inputs'], example['targets']) == list(range(3, 3 + raw))


def span_lengths(mask):
  """Lengths of the runs of True in a boolean vector."""
  edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
  return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def noise_statistics(masks):
  """(noise density, mean noise span length, histogram of span lengths 1..11)."""
  lengths = np.concatenate([span_lengths(m) for m in masks])
  return masks.mean(), lengths.mean(), np.bincount(lengths, minlength=12)[1:12] / len(lengths)


def t5_masks_numpy(num: int, length: int, rng, mean_span: float = 3.0):
  """T5's random_spans_noise_mask written independently in numpy (shuffled 0/1 boundaries)."""
  num_noise = round(length * 0.15)
  num_spans = round(num_noise / mean_span)

  def segmentation(items):
    first = np.concatenate([[0], rng.permutation(np.arange(items - 1) < num_spans - 1)])
    return np.bincount(np.cumsum(first))

  masks = []
  for _ in range(num):
    spans = np.stack([segmentation(length - num_noise), segmentation(num_noise)], 1).ravel()
    masks.append(np.repeat(np.tile([False, True], num_spans), spans))
  return np.array(masks)


def test_noise_statistics_over_many_examples():
  """Density 0.15 and mean span 3 (Raffel et al.), span lengths distributed as T5's."""
  examples = corrupted(1200, 568)
  is_sentinel = [e['targets'][:-1] > SENTINEL - 100 for e in examples]  # targets minus EOS
  noise_tokens = sum(int((~s).sum()) for s in is_sentinel)
  noise_spans = sum(int(s.sum()) for s in is_sentinel)
  assert abs(noise_tokens / (568 * len(examples)) - 0.15) < 0.005
  assert abs(noise_tokens / noise_spans - 3.0) < 0.1
  masks = tf.data.Dataset.range(1200).map(
      lambda i: span_corruption.random_spans_noise_mask(568, 0.15, 3.0, seeds(i))).batch(1200)
  density, mean_span, histogram = noise_statistics(next(iter(masks)).numpy())
  _, _, t5_histogram = noise_statistics(t5_masks_numpy(1200, 568, np.random.default_rng(0)))
  assert abs(density - 0.15) < 0.005 and abs(mean_span - 3.0) < 0.1
  np.testing.assert_allclose(histogram, t5_histogram, atol=0.02)


def test_seeds_change_the_noise_and_only_they_do():
  a = span_corruption.random_spans_noise_mask(141, 0.15, 3.0, seeds(1)).numpy()
  b = span_corruption.random_spans_noise_mask(141, 0.15, 3.0, seeds(1)).numpy()
  c = span_corruption.random_spans_noise_mask(141, 0.15, 3.0, seeds(2)).numpy()
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()


BYTE_SENTINEL = 259  # the byte vocabulary's <extra_id_0>; its sentinels count up


def test_byte_span_corruption_statistics_at_byt5_settings():
  """ByT5's span corruption (1,024 inputs of bytes, density 0.15, mean span 20) over 10,000 rows
  of the noise mask, the function itself in tf.data: density and mean span within 5% of ByT5's,
  span lengths distributed as an independent numpy segmentation's."""
  raw, targets = span_corruption.random_spans_helper(1024, 0.15, 20.0)
  assert (raw, targets) == (1193, 189)  # ByT5's 1,024 inputs and 189 targets
  masks = next(iter(tf.data.Dataset.range(10_000).map(
      lambda i: span_corruption.random_spans_noise_mask(raw, 0.15, 20.0, seeds(i))
  ).batch(10_000))).numpy()
  lengths = np.concatenate([span_lengths(m) for m in masks])
  print(f'density {masks.mean():.4f}, mean span {lengths.mean():.2f} over {len(masks):,} rows')
  assert abs(masks.mean() / 0.15 - 1) < 0.05 and abs(lengths.mean() / 20 - 1) < 0.05
  reference = np.concatenate([span_lengths(m) for m in t5_masks_numpy(
      2000, raw, np.random.default_rng(0), mean_span=20.0)])
  bins = np.arange(1, 200, 10)
  np.testing.assert_allclose(np.histogram(lengths, bins)[0] / len(lengths),
                             np.histogram(reference, bins)[0] / len(reference), atol=0.02)


def test_byte_sentinels_count_up_and_reconstruct():
  """Each noise span's sentinel is 259, 260, ...: the byte vocabulary's <extra_id_0>, ..."""
  tokens = np.random.default_rng(0).integers(3, 259, 148)
  ds = tf.data.Dataset.range(5).map(lambda i: {
      'targets': tf.constant(tokens, tf.int32),
      'seed': tf.random.experimental.stateless_fold_in([0, 0], i),
      'noise_density': 0.15, 'mean_noise_span_length': 4.0})
  for example in span_corruption.corrupt_spans(ds, BYTE_SENTINEL, 1).as_numpy_iterator():
    inputs, targets = example['inputs'][:-1].tolist(), example['targets'][:-1].tolist()
    sentinels = [t for t in inputs if t >= BYTE_SENTINEL]
    assert sentinels == list(range(BYTE_SENTINEL, BYTE_SENTINEL + 6))  # 22 noise bytes, 6 spans
    fills, sentinel = {}, None
    for t in targets:
      sentinel = t if t >= BYTE_SENTINEL else sentinel
      fills.setdefault(sentinel, []).extend([] if t >= BYTE_SENTINEL else [t])
    assert [x for t in inputs for x in fills.get(t, [t])] == tokens.tolist()


def test_more_spans_than_the_byte_vocabulary_s_sentinels_are_refused():
  from t5lite import config as t5config
  data = t5config.base_config().data
  data.update(vocabulary='bytes', inputs_length=1024, targets_length=400,
              mean_noise_span_length=1.0)
  with pytest.raises(ValueError, match=r'^span corruption of 1024 inputs .* makes 153 spans an '
                     r"example, more than the 125 sentinels of data.vocabulary='bytes'"):
    span_corruption.OBJECTIVE.raw_length(data)
  data.mean_noise_span_length = 20.0
  assert span_corruption.OBJECTIVE.raw_length(data) == 1193
