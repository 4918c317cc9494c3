"""The family's objectives: BERT's rates, dynamic masking, BART's noise statistics, the LM
features against seqio's worked examples; each op eagerly and inside tf.data alike."""

import math

import numpy as np
import pytest
import tensorflow as tf

from t5lite.data import packing
from t5lite.data import store
from t5lite.inputs import batches
from t5lite.inputs import pipeline
from t5lite.objectives import bart
from t5lite.objectives import causal_lm
from t5lite.objectives import mlm
from t5lite.objectives import mlm_nsp

MASK, CLS, SEP = 8099, 8098, 8097  # <extra_id_0, 1, 2> of the bundled 8,100-id vocabulary
NUM_PIECES = 8000
EOS = 1
PERIOD, BANG = 6, 108  # '.' and '!' of the bundled vocabulary


def seed(i):
  return tf.random.experimental.stateless_fold_in(tf.constant([3, 0], tf.int64), i)


def in_dataset(fn, *args):
  """fn(*args) inside a tf.data map, as the pipeline runs it."""
  return next(iter(tf.data.Dataset.from_tensors(args).map(fn)))


def raw_examples(tokens: np.ndarray) -> tf.data.Dataset:
  """{'targets', 'seed'} per row of tokens [num_examples, length], as the pipeline's chunks."""
  return tf.data.Dataset.from_tensor_slices(tokens).enumerate().map(
      lambda i, t: {'targets': t, 'seed': seed(i)})


def assert_equal_outputs(a, b):
  """Equal arrays, as many and under the same keys: zip alone would pass a missing output."""
  tf.nest.assert_same_structure(a, b, check_types=False)
  if isinstance(a, dict):
    assert sorted(a) == sorted(b)
  for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
    np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_ops_give_the_same_result_eagerly_and_in_tf_data():
  tokens = tf.constant([10, 11, PERIOD, 12, 13, BANG, 14, 15, 16, 17, 18, PERIOD], tf.int32)
  s = seed(5)
  seeds = tf.random.experimental.stateless_split(s, 2)
  ops = [
      (lambda t, s: mlm.bert_mask(t, s, MASK, NUM_PIECES, 0.5), tokens, s),
      (lambda n, s: causal_lm.random_prefix_mask(n, s), 12, s),
      (lambda t, s: bart.sentence_permutation(t, [PERIOD, BANG], s), tokens, s),
      (lambda n, s: bart.poisson_span_lengths(n, 3.0, s), 20, s),
      (lambda t, s: bart.text_infilling(t, MASK, 0.3, 3.0, s), tokens, seeds),
  ]
  for op, *args in ops:
    assert_equal_outputs(op(*[tf.constant(a) for a in args]), in_dataset(op, *args))


def test_mlm_selects_15_percent_and_splits_them_80_10_10():
  """BERT's rates over 4,000 examples of 200 tokens: 120,000 selected, so that 0.5 points is
  over 4 standard errors of the 80% and 10% rates."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, NUM_PIECES, size=(4000, 200), dtype=np.int32)
  out = next(iter(mlm.mask_tokens(raw_examples(tokens), MASK, NUM_PIECES).batch(4000)))
  inputs, targets = out['inputs'].numpy(), out['targets'].numpy()
  selected = targets > 0
  assert (selected.sum(1) == 30).all()  # round(0.15 * 200) per example, as BERT
  np.testing.assert_array_equal(targets[selected], tokens[selected])
  np.testing.assert_array_equal(inputs[~selected], tokens[~selected])
  masked = inputs[selected] == MASK
  kept = inputs[selected] == tokens[selected]
  replaced = ~masked & ~kept
  num_selected = selected.sum()
  for fraction, expected in ((masked, 0.8), (replaced, 0.1), (kept, 0.1)):
    standard_error = math.sqrt(expected * (1 - expected) / num_selected)
    assert 4 * standard_error < 0.005
    assert abs(fraction.mean() - expected) < 0.005, (fraction.mean(), expected)
  random_tokens = inputs[selected][replaced]
  assert random_tokens.min() >= 3 and random_tokens.max() < NUM_PIECES  # real pieces only
  # the random pieces are uniform: each tenth of the piece range gets a tenth of them
  deciles = np.bincount((random_tokens - 3) * 10 // (NUM_PIECES - 3), minlength=10)
  assert abs(deciles / deciles.sum() - 0.1).max() < 0.015


def test_masking_is_dynamic_a_new_mask_each_epoch(small_data):
  """The pipeline seeds example i of the stream: a chunk seen again is masked anew."""
  tokens = np.arange(100, 100 + 10 * 40, dtype=np.int32)  # 10 chunks of 40, no slack: fixed cuts
  chunks = pipeline._indexed_examples([pipeline._Stream(store.Tokens([tokens]), 40, {}, [0, 0])],
                                      small_data(batch_size=2), share=slice(0, 2), first_batch=0)
  masks = {}
  for i, example in enumerate(mlm.mask_tokens(chunks, MASK, NUM_PIECES).take(30)
                              .as_numpy_iterator()):
    original = np.where(example['targets'] > 0, example['targets'], example['inputs'])
    masks.setdefault(original[0], []).append((i // 10, tuple(example['targets'] > 0)))
  assert sorted(masks) == list(range(100, 500, 40))  # every chunk, whole, in each epoch
  for chunk, seen in masks.items():
    assert [epoch for epoch, _ in seen] == [0, 1, 2]
    assert len({mask for _, mask in seen}) == 3, chunk  # three epochs, three masks
  again = next(mlm.mask_tokens(chunks, MASK, NUM_PIECES).as_numpy_iterator())
  first = next(mlm.mask_tokens(chunks, MASK, NUM_PIECES).as_numpy_iterator())
  np.testing.assert_array_equal(again['inputs'], first['inputs'])  # yet deterministic


def test_mlm_nsp_pairs_half_next_half_random_with_bert_masking():
  """4,000 pairs of 128 tokens (125 of text): [CLS] A [SEP] B [SEP], A cut after a sentence end
  chosen uniformly, B the rest of the chunk or text from elsewhere (each within 2.5 points of half,
  over 4 standard errors), 15% of A and B selected and split 80/10/10 (within 0.5 points over
  76,000 selections), specials never selected."""
  rng = np.random.default_rng(1)
  n, count = 125, 4000
  def text(low, high):  # words from [low, high) with a '.' every 5 to 30 tokens
    tokens = rng.integers(low, high, size=(count, n), dtype=np.int32)
    tokens[rng.random((count, n)) < 1 / 15] = PERIOD
    return tokens
  tokens, other = text(200, 4000), text(4000, NUM_PIECES)  # two ranges: where B came from shows
  examples = tf.data.Dataset.from_tensor_slices((tokens, other)).enumerate().map(
      lambda i, pair: {'targets': pair[0], 'other': pair[1], 'seed': seed(i)})
  out = next(iter(mlm_nsp.sentence_pairs(examples, CLS, SEP, MASK, NUM_PIECES, [PERIOD]).batch(count)))
  inputs, targets, types, label = (out[k].numpy() for k in
                                   ('inputs', 'targets', 'token_types', 'next_sentence'))
  assert inputs.shape == targets.shape == types.shape == (count, n + 3) and label.shape == (count,)
  assert abs(label.mean() - 0.5) < 0.025, label.mean()
  original = np.where(targets > 0, targets, inputs)
  relative_cut = []
  for row in range(count):
    seps = np.flatnonzero(inputs[row] == SEP)
    assert inputs[row, 0] == CLS and seps[-1] == n + 2 and len(seps) == 2, inputs[row]
    cut = seps[0] - 1  # tokens of A
    np.testing.assert_array_equal(types[row], np.arange(n + 3) > cut + 1)
    a, b = original[row, 1:cut + 1], original[row, cut + 2:n + 2]
    np.testing.assert_array_equal(a, tokens[row, :cut])
    starts = np.flatnonzero(tokens[row, :-1] == PERIOD) + 1
    assert cut in starts  # A ends with a sentence end
    relative_cut.append(np.searchsorted(starts, cut) / max(len(starts) - 1, 1))
    if label[row]:  # B from the other text's first sentence on
      first = np.flatnonzero(other[row] == PERIOD)[0] + 1
      start = first if len(other[row]) - first >= len(b) else 0
      np.testing.assert_array_equal(b, other[row, start:start + len(b)])
    else:
      np.testing.assert_array_equal(b, tokens[row, cut:])
  assert abs(np.mean(relative_cut) - 0.5) < 0.02  # sentence ends chosen uniformly
  specials = (inputs == CLS) | (inputs == SEP)
  assert (targets[specials] == 0).all()
  selected = targets > 0
  assert (selected.sum(1) == round(0.15 * n)).all()  # 19 of A and B's 125 tokens
  masked = inputs[selected] == MASK
  kept = inputs[selected] == targets[selected]
  for fraction, expected in ((masked, 0.8), (~masked & ~kept, 0.1), (kept, 0.1)):
    assert abs(fraction.mean() - expected) < 0.005, (fraction.mean(), expected)


def test_bart_masks_30_percent_in_poisson_3_spans():
  """1,000 chunks of 511 tokens (512 targets): masked fraction and mean span length measured on
  the outputs; each mask stands for a span, empty spans included."""
  n = 511
  tokens = np.tile(np.arange(200, 200 + n, dtype=np.int32), (1000, 1))  # no '.', '!' or '?'
  out = next(iter(bart.permute_and_infill(raw_examples(tokens), MASK, [PERIOD, BANG]).padded_batch(
      1000)))
  inputs, targets = out['inputs'].numpy(), out['targets'].numpy()
  np.testing.assert_array_equal(targets, np.concatenate([tokens, np.ones((1000, 1), int)], 1))
  lengths = (inputs > 0).sum(1)
  assert (inputs[np.arange(1000), lengths - 1] == EOS).all()
  assert (lengths <= n + 1).all()  # never longer than the targets
  num_masks = (inputs == MASK).sum()
  num_masked = (n - ((inputs > 0) & (inputs != MASK) & (inputs != EOS)).sum(1)).sum()
  assert abs(num_masked / tokens.size - 0.3) < 0.005
  assert abs(num_masked / num_masks - 3.0) < 0.1, num_masked / num_masks
  for row in inputs[:100]:  # the kept tokens in order, a mask wherever some are missing
    previous, masks = 199, 0
    for t in row[(row > 0) & (row != EOS)].tolist() + [200 + n]:
      if t == MASK:
        masks += 1
        continue
      assert t > previous and (t == previous + 1 or masks > 0)
      previous, masks = t, 0


def test_poisson_span_lengths_follow_poisson_3():
  """Span lengths (the last of each draw, cut to fit, left out) against Poisson(3)'s pmf."""
  spans = tf.data.Dataset.range(2000).map(
      lambda i: bart.poisson_span_lengths(153, 3.0, seed(i)))
  sums, counts, lengths = [], [], []
  for draw in next(iter(spans.ragged_batch(2000))).numpy():
    sums.append(draw.sum())
    counts.append(len(draw))
    lengths.append(draw[:-1])
  assert set(sums) == {153} and max(counts) <= 153
  lengths = np.concatenate(lengths)
  pmf = [math.exp(-3) * 3**k / math.factorial(k) for k in range(10)]
  np.testing.assert_allclose(np.bincount(lengths, minlength=10)[:10] / len(lengths), pmf,
                             atol=0.006)
  assert abs(lengths.mean() - 3.0) < 0.05
  np.testing.assert_array_equal(bart.poisson_span_lengths(0, 3.0, seed(0)).numpy(), [])


def test_sentence_permutation_is_a_uniform_permutation_of_the_sentences():
  tokens = [10, 11, PERIOD, 12, BANG, 13, 14, 15, PERIOD, 16, 17]
  original = [(10, 11, PERIOD), (12, BANG), (13, 14, 15, PERIOD), (16, 17)]  # the last unended
  permuted = tf.data.Dataset.range(4000).map(
      lambda i: bart.sentence_permutation(tf.constant(tokens), [PERIOD, BANG], seed(i)))
  orders = []
  for row in next(iter(permuted.batch(4000))).numpy():
    order, rest = [], row.tolist()
    while rest:  # read the row back as whole sentences of the original
      sentence = next(s for s in original if tuple(rest[:len(s)]) == s and s not in order)
      order.append(sentence)
      rest = rest[len(sentence):]
    assert sorted(order) == sorted(original)
    orders.append(tuple(original.index(s) for s in order))
  assert len(set(orders)) == 24  # every order of the 4 sentences
  firsts = np.bincount([order[0] for order in orders]) / len(orders)
  assert abs(firsts - 0.25).max() < 0.025  # each sentence first a quarter of the time
  unchanged = bart.sentence_permutation(tf.constant(tokens), [], seed(0)).numpy()
  assert unchanged.tolist() == tokens  # no sentence ends: one sentence


def test_prefix_is_uniform_in_1_to_n_minus_1():
  prefixes = tf.data.Dataset.range(4000).map(lambda i: causal_lm.random_prefix_mask(5, seed(i)))
  p = next(iter(prefixes.batch(4000))).numpy().sum(1)
  assert set(p) == {1, 2, 3, 4}
  assert abs(np.bincount(p, minlength=5)[1:] / len(p) - 0.25).max() < 0.025


def packed(examples, lengths):
  ds = tf.data.Dataset.from_generator(
      lambda: iter(examples), output_signature={
          k: tf.TensorSpec([None], tf.int32) for k in examples[0]})
  return next(iter(packing.pack(ds, lengths, window=len(examples))))


def as_lists(features):
  return {k: v.numpy().tolist() for k, v in features.items()}


def test_prefix_lm_features_are_seqio_prefix_lm_feature_converter_example():
  """seqio's PrefixLMFeatureConverter docstring, example 1 (packed): inputs [7 8 5 1] and
  [8 4 9 3 1] before targets [3 9 1] and [4 1], in a row of 7 + 8."""
  row = packed([{'targets': [7, 8, 5, 1, 3, 9, 1], 'prefix': [1, 1, 1, 1, 0, 0, 0]},
                {'targets': [8, 4, 9, 3, 1, 4, 1], 'prefix': [1, 1, 1, 1, 1, 0, 0]}],
               {'targets': 15, 'prefix': 15})
  expected = {
      'decoder_target_tokens': [7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0],
      'decoder_input_tokens': [0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0],
      'decoder_loss_weights': [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0],
      'decoder_positions': [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0],
      'decoder_segment_ids': [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0],
      'decoder_causal_attention': [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
  }
  assert as_lists(packing.prefix_lm_features(row)) == expected
  assert as_lists(in_dataset(lambda r: packing.prefix_lm_features(r), row)) == expected


def test_causal_lm_and_mlm_features_worked_examples():
  """seqio's LMFeatureConverter layout (packed); an MLM row: loss on the selected tokens only."""
  row = packed([{'targets': [3, 9, 1]}, {'targets': [4, 1]}], {'targets': 6})
  expected = {
      'decoder_target_tokens': [3, 9, 1, 4, 1, 0],
      'decoder_input_tokens': [0, 3, 9, 0, 4, 0],
      'decoder_loss_weights': [1, 1, 1, 1, 1, 0],
      'decoder_positions': [0, 1, 2, 0, 1, 0],
      'decoder_segment_ids': [1, 1, 1, 2, 2, 0],
  }
  assert as_lists(packing.decoder_features(row)) == expected
  assert as_lists(in_dataset(lambda r: packing.decoder_features(r), row)) == expected
  row = packed([{'inputs': [7, MASK, 9], 'targets': [0, 8, 0]}], {'inputs': 4, 'targets': 4})
  assert as_lists(packing.encoder_features(row)) == {
      'encoder_input_tokens': [7, MASK, 9, 0],
      'encoder_target_tokens': [0, 8, 0, 0],
      'encoder_loss_weights': [0, 1, 0, 0],
      'encoder_segment_ids': [1, 1, 1, 0],
      'encoder_positions': [0, 1, 2, 0],
  }


@pytest.mark.parametrize('change, message', [
    (dict(objective='mlm'), 'data.targets_length=16: the mlm objective has no such feature'),
    (dict(objective='causal_lm'), 'data.inputs_length=64: the causal_lm objective has no such'),
    (dict(objective='prefix_lm', inputs_length=1, targets_length=0), 'at least 2 tokens'),
    (dict(objective='bart', inputs_length=16, targets_length=64), 'bart inputs can be as long'),
])
def test_lengths_an_objective_cannot_use_fail_with_one_line(small_data, change, message):
  with pytest.raises(ValueError, match=message) as error:
    batches.make_batches(small_data(**change), process_index=0, process_count=1)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('objective, lengths, features', [
    ('mlm', dict(inputs_length=64, targets_length=0),
     {'encoder_input_tokens': 64, 'encoder_target_tokens': 64, 'encoder_loss_weights': 64}),
    ('causal_lm', dict(inputs_length=0, targets_length=64), {'decoder_target_tokens': 64}),
    ('prefix_lm', dict(inputs_length=40, targets_length=24), {'decoder_causal_attention': 64}),
    ('bart', dict(inputs_length=64, targets_length=64),
     {'encoder_input_tokens': 64, 'decoder_target_tokens': 64}),
    ('mlm_nsp', dict(inputs_length=64, targets_length=0),
     {'encoder_input_tokens': 64, 'encoder_token_types': 64, 'next_sentence_labels': None}),
])
@pytest.mark.parametrize('streamed', [False, True])
def test_pipeline_batches_of_each_objective(small_data, tfds_dir, objective, lengths, features,
                                            streamed):
  """In memory and streamed (packed) alike: the model's features at the configured lengths,
  the loss on the share of tokens the objective predicts."""
  source = dict(source='tfds:t5lite_test_text/short', tfds_data_dir=tfds_dir) if streamed else {}
  data = small_data(objective=objective, **lengths, **source)
  batch = next(batches.make_batches(data, process_index=0, process_count=1))
  for name, length in features.items():
    assert batch[name].shape == (8,) + ((length,) if length else ())
    assert batch[name].dtype == np.int32
  side = 'encoder' if objective.startswith('mlm') else 'decoder'
  share = batch[f'{side}_loss_weights'].sum() / (batch[f'{side}_segment_ids'] > 0).sum()
  expected = {'mlm': 0.15, 'mlm_nsp': 0.15 * 61 / 64, 'causal_lm': 1.0, 'prefix_lm': 0.5,
              'bart': 1.0}[objective]
  assert abs(share - expected) < (0.2 if objective == 'prefix_lm' else 0.02), share
