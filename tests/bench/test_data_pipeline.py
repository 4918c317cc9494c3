"""bench/data_pipeline.py's own arithmetic: the example statistics and the side-by-side ratios.

The bench itself (and its seqio venv) never runs in tests; these check the numbers it reports.
"""

import importlib.util
import pathlib

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).parents[2] / 'bench' / 'data_pipeline.py'
_SPEC = importlib.util.spec_from_file_location('bench_data_pipeline', _PATH)
data_pipeline = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(data_pipeline)

VOCAB_SIZE = 200  # sentinels are ids 100..199: <extra_id_0> = 199, <extra_id_1> = 198
X0, X1, EOS = 199, 198, 1


def packed(rows, length):
  """Rows of segments (lists of tokens) -> tokens and segment ids padded to `length`."""
  tokens = np.zeros([len(rows), length], np.int32)
  segment_ids = np.zeros_like(tokens)
  for r, segments in enumerate(rows):
    flat = [t for segment in segments for t in segment]
    tokens[r, :len(flat)] = flat
    segment_ids[r, :len(flat)] = [s + 1 for s, segment in enumerate(segments) for _ in segment]
  return tokens, segment_ids


def test_example_statistics_counts_noise_spans_and_sentinel_order():
  # Row 0: objectives.py's worked example (raw A..J = 20..29, noise [C D] [I J]), then a
  # 3-token example with noise [31]. Row 1: one example whose only sentinel is <extra_id_1>.
  inputs = [[[20, 21, X0, 24, 25, 26, 27, X1, EOS], [30, X0, 32, EOS]], [[40, X1, 42, EOS]]]
  targets = [[[X0, 22, 23, X1, 28, 29, EOS], [X0, 31, EOS]], [[X1, 41, EOS]]]
  batch = {}
  batch['encoder_input_tokens'], batch['encoder_segment_ids'] = packed(inputs, 14)
  batch['decoder_target_tokens'], batch['decoder_segment_ids'] = packed(targets, 10)
  stats = data_pipeline.example_statistics([batch], VOCAB_SIZE)
  assert stats['examples'] == 3
  assert stats['examples_per_row'] == 1.5
  assert stats['inputs_per_example'] == pytest.approx(17 / 3)
  assert stats['targets_per_example'] == pytest.approx(13 / 3)
  assert stats['noise_density'] == pytest.approx((4 + 1 + 1) / (10 + 3 + 3))
  assert stats['mean_noise_span_length'] == pytest.approx(6 / 4)
  assert stats['well_formed'] == pytest.approx(2 / 3)


def test_ratios_are_medians_of_runs_made_side_by_side():
  def runs(examples_per_s):
    return [{'examples_per_s': x, 'tokens_per_s': 100 * x, 'examples_per_cpu_s': 2 * x}
            for x in examples_per_s]
  # Per repeat 10/1, 2/2, 3/3 -> median 1.0 (the ratio of the medians would say 3/2).
  ratios = data_pipeline.ratios(runs([10, 2, 3]), runs([1, 2, 3]))
  assert ratios == {'examples_per_s': 1.0, 'tokens_per_s': 1.0, 'examples_per_cpu_s': 1.0}
