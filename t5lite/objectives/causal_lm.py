"""Language modelling for decoder-only models: GPT's causal LM and T5's prefix LM.

- `causal_lm`: every token predicted from those before it; rows are cut from the concatenated
  text, so nothing ends and no EOS is appended.
    raw A B C D  ->  decoder inputs 0 A B C, targets A B C D, loss on all four
- `prefix_lm`: a random prefix of each row is read bidirectionally, without loss; the model
  predicts the rest (seqio's PrefixLM over inputs_length + targets_length tokens).
    raw A B C D E, prefix 2  ->  loss on C D E; attention bidirectional over A B (and C's input)
The loss is the token cross entropy on the decoder's targets.
"""

import ml_collections

from t5lite.data import packing
from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base


class CausalLM(base.Objective):
  name = 'causal_lm'
  sides = ('decoder',)

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """A chunk of targets_length tokens: the decoder's whole row."""
    base.check_unused_length(data, 'inputs_length')
    return base.at_least(data, 'targets_length', 1)

  def row_lengths(self, data):
    return {'targets': data.targets_length}

  def transform(self, examples, data, vocab):
    return causal_examples(examples)

  def convert(self, row):
    return packing.decoder_features(row)

  def features(self, data):
    return base.side_features('decoder', data.targets_length, targets=True)


class PrefixLM(base.Objective):
  name = 'prefix_lm'
  sides = ('decoder',)

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """A chunk of inputs_length + targets_length tokens, the decoder's row (as seqio's)."""
    if data.inputs_length < 0 or data.targets_length < 0 or (
        data.inputs_length + data.targets_length < 2):
      raise ValueError(f'data.inputs_length={data.inputs_length} + data.targets_length='
                       f'{data.targets_length}: prefix_lm needs a row of at least 2 tokens')
    return data.inputs_length + data.targets_length

  def row_lengths(self, data):
    return dict.fromkeys(('targets', 'prefix'), data.inputs_length + data.targets_length)

  def transform(self, examples, data, vocab):
    return prefix_examples(examples)

  def convert(self, row):
    return packing.prefix_lm_features(row)

  def features(self, data):
    length = data.inputs_length + data.targets_length
    # seqio's name: 1 where attention is bidirectional (the prefix)
    return {**base.side_features('decoder', length, targets=True),
            'decoder_causal_attention': length}


def causal_examples(dataset):
  """GPT's language modelling: {'targets': raw tokens, 'seed'} -> {'targets'}, every token
  predicted from those before it (the feature converter shifts the decoder inputs right):
    targets (raw) A B C D  ->  decoder inputs 0 A B C, targets A B C D, loss on all four.
  Chunks are cut from the concatenated text, so nothing ends: no EOS is appended.
  """
  return parallel_map(dataset, lambda example: {'targets': example['targets']})


def prefix_examples(dataset):
  """T5's prefix LM for a decoder-only model: {'targets', 'seed'} -> {'targets', 'prefix'}.

  The `random_prefix_mask` prefix is read bidirectionally, without loss; the model predicts the
  rest (see packing.prefix_lm_features).
    targets (raw) A B C D E  ->  targets A B C D E, prefix 1 1 0 0 0
  """
  def split(example):
    tokens = example['targets']
    return {'targets': tokens, 'prefix': random_prefix_mask(tf.size(tokens), example['seed'])}

  return parallel_map(dataset, split)


def random_prefix_mask(length, seed):
  """int32 (length,): 1 on a prefix of p tokens, p uniform in [1, length - 1] (T5's
  random_prefix_noise_mask, inverted); the whole of a 1-token example. E.g. 5, p = 2 -> 1 1 0 0 0.
  """
  p = tf.random.stateless_uniform([], seed, 1, tf.maximum(length, 2), dtype=tf.int32)
  return tf.cast(tf.range(length) < p, tf.int32)


CAUSAL_LM, PREFIX_LM = CausalLM(), PrefixLM()
