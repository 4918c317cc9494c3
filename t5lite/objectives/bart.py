"""BART's denoising (Lewis et al. 2020), for encoder-decoder models.

The sentences of a chunk permuted, then text infilling: 30% of the tokens in Poisson(3) spans,
each span (an empty one too) one mask (`<extra_id_0>`); the decoder reconstructs the original.
  raw A B . C D .  ->  inputs C <M> A B . EOS, targets A B . C D . EOS
The loss is the token cross entropy on the decoder's targets.
"""

import ml_collections

from t5lite.objectives import base


class Bart(base.EncoderDecoderObjective):
  name = 'bart'

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """targets_length - 1 tokens (the original + EOS); the noised inputs are never longer."""
    targets_length = base.at_least(data, 'targets_length', 2)
    if data.inputs_length < targets_length:
      raise ValueError(f'data.inputs_length={data.inputs_length} is shorter than data.'
                       f'targets_length={targets_length}: bart inputs can be as long as the '
                       'targets')
    return targets_length - 1

  def transform(self, examples, data, vocab):
    from t5lite.data import noise
    return noise.bart(examples, vocab.sentinel_id(0), vocab.sentence_end_ids(),
                      data.noise_density, data.mean_noise_span_length)


OBJECTIVE = Bart()
