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
    from t5lite.data import noise
    return noise.causal_lm(examples)

  def convert(self, row):
    from t5lite.data import packing
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
    from t5lite.data import noise
    return noise.prefix_lm(examples)

  def convert(self, row):
    from t5lite.data import packing
    return packing.prefix_lm_features(row)

  def features(self, data):
    length = data.inputs_length + data.targets_length
    # seqio's name: 1 where attention is bidirectional (the prefix)
    return {**base.side_features('decoder', length, targets=True),
            'decoder_causal_attention': length}


CAUSAL_LM, PREFIX_LM = CausalLM(), PrefixLM()
