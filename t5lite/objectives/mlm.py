"""BERT's masked LM (Devlin et al. 2019), for encoder-only models (BERT, RoBERTa).

15% of the tokens selected, each replaced by a mask (`<extra_id_0>`) 80% of the time, a random
piece 10%, kept 10%; the loss is the token cross entropy at the selected positions alone.
  raw A B C D E  ->  inputs A <M> C D E, targets 0 B 0 0 0 (0: no loss)
"""

import ml_collections

from t5lite.objectives import base


class MaskedLM(base.Objective):
  name = 'mlm'
  sides = ('encoder',)

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """A chunk of inputs_length tokens, masked in place; the targets have the same length."""
    base.check_unused_length(data, 'targets_length')
    return base.at_least(data, 'inputs_length', 1)

  def row_lengths(self, data):
    return {'inputs': data.inputs_length, 'targets': data.inputs_length}

  def transform(self, examples, data, vocab):
    from t5lite.data import noise
    return noise.mlm(examples, vocab.sentinel_id(0), vocab.num_pieces, data.noise_density)

  def convert(self, row):
    from t5lite.data import packing
    return packing.encoder_features(row)

  def features(self, data):
    return base.side_features('encoder', data.inputs_length, targets=True)

  def check(self, config, model_cfg):
    super().check(config, model_cfg)
    if model_cfg.next_sentence:
      raise ValueError(f"model.next_sentence=True trains with data.objective='mlm_nsp', not "
                       f'{self.name!r}')


OBJECTIVE = MaskedLM()
