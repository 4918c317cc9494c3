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
"""

import ml_collections

from t5lite.objectives import base


class SpanCorruption(base.EncoderDecoderObjective):
  name = 'span_corruption'
  row_settings = ('noise_density', 'mean_noise_span_length', 'mode')

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
    return raw_length

  def transform(self, examples, data, vocab):
    from t5lite.data import noise
    return noise.span_corruption(examples, vocab.sentinel_id(0))


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
