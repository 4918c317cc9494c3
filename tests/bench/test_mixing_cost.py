"""bench/mixture.py end to end at a few examples: its three pipelines are what it says (one
source; three components at 5:3:2; UL2's seven denoisers) and every line has its ratios."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests import texts

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / 'bench'))


def test_the_pipelines_are_one_source_three_components_and_ul2():
  import mixture  # pylint: disable=import-outside-toplevel  # bench/mixture.py
  from t5lite.inputs import batches  # pylint: disable=import-outside-toplevel
  counts = {}
  for name in mixture.PIPELINES:
    data = mixture.pipeline_data(name, 128)
    assert data.inputs_length == data.targets_length == 128 and data.threads == 1
    batch = next(batches.make_batches(data, 'train', process_index=0, process_count=1))
    counts[name] = np.bincount(batch['component'].ravel()) if 'component' in batch else None
  assert counts['single'] is None
  assert counts['mixture'].tolist() == [16, 10, 6]  # books 5, code 3, web 2 of 32 rows
  assert len(counts['ul2']) == 7
  for name in mixture.ul2_rates():  # --alone: each denoiser a single source with its settings
    data = mixture.pipeline_data(f'alone:{name}', 128)
    assert not data.mixture and data.mode and data.objective in ('span_corruption', 'seq2seq_lm')
    assert 'component' not in next(batches.make_batches(data, 'train', process_index=0,
                                                        process_count=1))


def test_the_diagnostic_pipelines_differ_from_each_other_only_in_their_rows_lengths():
  """--diagnose: six components of R's span corruption alike, or with modes of 0, 1 and 2 texts
  (so of three raw lengths); nothing else differs."""
  import mixture  # pylint: disable=import-outside-toplevel  # bench/mixture.py
  from t5lite.inputs import mixture as mixture_lib  # pylint: disable=import-outside-toplevel
  lengths, settings = {}, {}
  for name in mixture.DIAGNOSTIC_MODES:
    data = mixture.pipeline_data(name, 512)
    components = mixture_lib.components(data)
    lengths[name] = [objective.raw_length(view) for _, view, objective in components]
    settings[name] = {(objective.name, view.noise_density, view.mean_noise_span_length,
                       data.mixture[component].weight)
                      for component, view, objective in components}
  assert lengths == {'same6': [567] * 6, 'lengths6': [568, 567, 566] * 2}
  assert settings['same6'] == settings['lengths6'] == {('span_corruption', 0.15, 3.0, 0.2)}


def test_mixing_for_free_weighs_each_components_time_per_example_by_its_share():
  import mixture  # pylint: disable=import-outside-toplevel  # bench/mixture.py
  # half the rows at 100 a second, half at 300: 150 rows a second, not the mean 200
  assert mixture.free_rate({'a': 0.5, 'b': 0.5}, {'a': 100.0, 'b': 300.0}) == pytest.approx(150)
  shares = mixture.ul2_rates()
  assert sum(shares.values()) == pytest.approx(1) and shares['s'] == pytest.approx(0.2)
  assert shares['r_3_15'] == pytest.approx(0.2) and shares['x_64_50'] == pytest.approx(0.1)


def test_a_round_pools_a_pipelines_children_rows_over_their_cpu_time():
  import mixture  # pylint: disable=import-outside-toplevel  # bench/mixture.py
  # 64 rows in 0.02 s and 64 in 0.06 s: 128 rows in 0.08 s, 1,600 a second (not the mean 2,133)
  assert mixture.pooled_rate([(64, 0.02), (64, 0.06)]) == pytest.approx(1600)
  assert mixture.pooled_rate([(64, 0.04)]) == pytest.approx(1600)


def test_ul2_for_free_is_computed_round_by_round_from_its_denoisers_alone():
  import mixture  # pylint: disable=import-outside-toplevel  # bench/mixture.py
  shares = mixture.ul2_rates()
  alone = {f'alone:{name}': [100.0, 200.0] for name in shares}  # every denoiser: 100, then 200
  alone['alone:s'] = [400.0, 400.0]
  # round 0: 80% of the rows at 100 a second, 20% at 400: 1 / (0.8 / 100 + 0.2 / 400) = 117.6
  assert mixture.ul2_free_rates(alone) == pytest.approx([1 / (0.8 / 100 + 0.2 / 400),
                                                         1 / (0.8 / 200 + 0.2 / 400)])


@pytest.mark.slow  # three child processes, each importing TensorFlow
def test_the_pipelines_are_timed_in_paired_rounds_and_every_line_has_its_ratios(tmp_path):
  source = texts.random_corpus(tmp_path / 'corpus.txt')  # not the bundled corpus's seconds a run
  done = subprocess.run([sys.executable, str(ROOT / 'bench' / 'mixture.py'), '--examples=64',
                         '--rounds=3', '--settings=128', f'--source={source}'],
                        cwd=ROOT, capture_output=True, text=True, timeout=900, check=True)
  [line] = done.stdout.splitlines()
  row = json.loads(line)
  assert row['bench'] == 'mixture' and row['inputs_length'] == 128 and row['rounds'] == 3
  assert row['children'] == 1
  assert list(row['examples_per_cpu_s']) == ['single', 'mixture', 'ul2']
  assert all(100 < rate < 100_000 for rate in row['examples_per_cpu_s'].values())
  assert all(0 < seconds < 600 for seconds in row['startup_s'].values())
  assert list(row['ratio_to_single']) == ['mixture', 'ul2']
  assert all(0.1 < ratio < 10 for ratio in row['ratio_to_single'].values())
  assert 'ul2_mixing_ratio' not in row  # the denoisers alone: with --alone
