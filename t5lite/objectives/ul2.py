"""UL2's mixture of denoisers (Tay et al. 2022), and its S-denoiser: T5's prefix LM for an
encoder-decoder, objective `seq2seq_lm`.

UL2 trains a T5 v1.1 encoder-decoder on seven denoisers of one corpus, each a component of
`data.mixture` (t5lite/inputs/mixture.py) with its own objective, settings and mode token, the
text its inputs start with:

  component   objective         (noise density, mean span)   mode    UL2     UL2R
  r_3_15      span_corruption   (0.15, 3)                    [NLU]   20%     12.5%
  r_8_15      span_corruption   (0.15, 8)                    [NLU]   20%     12.5%
  x_3_50      span_corruption   (0.5, 3)                     [NLG]   10%     6.25%
  x_8_50      span_corruption   (0.5, 8)                     [NLG]   10%     6.25%
  x_64_15     span_corruption   (0.15, 64)                   [NLG]   10%     6.25%
  x_64_50     span_corruption   (0.5, 64)                    [NLG]   10%     6.25%
  s           seq2seq_lm        a prefix of 1 to n-1 tokens   [S2S]   20%     50%

UL2's rates: R 40% and X 40%, each spread evenly over its denoisers, S 20% (the paper's
section 4.5); UL2R (U-PaLM, Tay et al. 2022b): S 50%, R 25%, X 25%. Each denoiser's raw chunk
is the one whose noised inputs, after its mode tokens, fill `data.inputs_length` exactly
(random_spans_helper; the S-denoiser's: inputs_length - the mode's tokens, so that its longest
prefix, n - 1 tokens, and EOS fill them), and the targets take as many as the longest denoiser
needs (UL2: 512 and 512). Every denoiser reads the whole corpus in its own order (seqio's
ul2_objective with shard_ds=False); the six span corruptions are read in one tf.data chain, each
chunk carrying its own noise and mode (`row_settings`).
T5's span arithmetic holds as it is: at 512 inputs (0.15, 64) makes one span of 90 tokens, and
(0.5, 3) 126 spans, more than T5's 100 sentinels, so that, as in T5, the sentinel ids count on
down into the vocabulary's last pieces.
"""

import ml_collections

from t5lite.data import vocabulary
from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base
from t5lite.objectives import causal_lm
from t5lite.objectives import span_corruption
from t5lite.token_ids import EOS_ID

MODES = dict(zip('RXS', vocabulary.MODE_TOKENS))  # {'R': '[NLU]', 'X': '[NLG]', 'S': '[S2S]'}
# name: (kind, noise density, mean noise span length); the S-denoiser has neither
DENOISERS = {
    'r_3_15': ('R', 0.15, 3.0), 'r_8_15': ('R', 0.15, 8.0),
    'x_3_50': ('X', 0.5, 3.0), 'x_8_50': ('X', 0.5, 8.0),
    'x_64_15': ('X', 0.15, 64.0), 'x_64_50': ('X', 0.5, 64.0),
    's': ('S', None, None),
}
RATES = {'ul2': {'R': 0.4, 'X': 0.4, 'S': 0.2}, 'ul2r': {'R': 0.25, 'X': 0.25, 'S': 0.5}}


def mixture(rates: str = 'ul2') -> ml_collections.ConfigDict:
  """The seven denoisers as `data.mixture` components of data's source, at RATES[rates]."""
  if rates not in RATES:
    raise ValueError(f'UL2 rates {rates!r} are not one of {", ".join(RATES)}')
  per_kind = {kind: sum(k == kind for k, *_ in DENOISERS.values()) for kind in MODES}
  components = ml_collections.ConfigDict()
  for name, (kind, density, span) in DENOISERS.items():
    component = dict(weight=RATES[rates][kind] / per_kind[kind], mode=MODES[kind])
    if kind == 'S':
      component.update(objective=S_DENOISER.name)
    else:
      component.update(objective=span_corruption.OBJECTIVE.name, noise_density=density,
                       mean_noise_span_length=span)
    components[name] = component
  return components


class SeqToSeqLM(base.EncoderDecoderObjective):
  """T5's prefix LM for an encoder-decoder: the encoder reads a random prefix of the chunk, the
  decoder writes the rest (`prefix_to_targets`).
    raw A B C D E, prefix 2  ->  inputs A B EOS, targets C D E EOS
  """
  name = 'seq2seq_lm'
  settings = row_settings = ('mode',)

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """The inputs the mode tokens leave: the longest prefix (all the chunk but one token) and
    EOS fill them; the targets hold up to the same, the rest of the chunk and EOS."""
    mode = len(base.mode_tokens(data))
    base.at_least(data, 'inputs_length', mode + 2)  # a chunk of two tokens
    raw_length = data.inputs_length - mode
    if data.targets_length < raw_length:
      raise ValueError(f'data.targets_length={data.targets_length} is too short for '
                       f'{self.name} of {data.inputs_length} inputs: its targets take up to '
                       f'{raw_length}')
    return raw_length

  def transform(self, examples, data, vocab):
    return prefix_to_targets(examples)


def prefix_to_targets(dataset):
  """T5's prefix LM for an encoder-decoder (its `prefix_lm` preprocessor, UL2's S-denoiser):
  {'targets': n raw tokens, 'seed', and optionally 'mode'} -> {'inputs': the mode's ids, a
  `causal_lm.random_prefix_mask` prefix of p tokens and EOS, 'targets': the other n - p + EOS}, p uniform
  in [1, n - 1].
    targets (raw) A B C D E, p = 2  ->  inputs A B EOS, targets C D E EOS
  """
  def split(example):
    tokens = example['targets']
    p = tf.reduce_sum(causal_lm.random_prefix_mask(tf.size(tokens), example['seed']))
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {'inputs': tf.concat([*span_corruption.mode_ids(example, tokens.dtype), tokens[:p], eos], 0),
            'targets': tf.concat([tokens[p:], eos], 0)}

  return parallel_map(dataset, split)


S_DENOISER = SeqToSeqLM()
