"""bench/tpu_plan.py on this CPU (topology cpu:1, t5_tiny at 32 and 64 inputs, the flash kernels
interpreted): its lines, the summary's ratios from them, and the record's rows."""

import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / 'bench'))

import record  # noqa: E402
import tpu_plan  # noqa: E402


@pytest.mark.slow  # four compiles of t5_tiny's step, two with interpreted kernels: 60-90 s
def test_the_plans_their_ratios_and_the_record_rows(tmp_path):
  out = tmp_path / 'tpu_plan.jsonl'
  tpu_plan.main([f'--out={out}', '--preset=t5_tiny', '--topologies=cpu:1', '--lengths=32,64'])
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  plans = {(line['attention'], line['inputs_length']): line for line in lines[:-1]}
  assert sorted(plans) == [('flash', 32), ('flash', 64), ('xla', 32), ('xla', 64)]
  for line in plans.values():
    assert line['fits'] is None and line['compiled_gib'] > 0 and line['batch_size'] == 8
  summary = lines[-1]
  assert summary['bench'] == 'tpu_plan/summary' and summary['longest_inputs'] == {
      'xla': 64, 'flash': 64}
  for length in (32, 64):
    assert summary[f'flash_vs_xla_memory_{length}'] == round(
        plans['flash', length]['compiled_gib'] / plans['xla', length]['compiled_gib'], 3)
  rows = record.rows(plans['flash', 64], record.context('cpu', 'python bench/tpu_plan.py'))
  assert {row['metric']: row['unit'] for row in rows} == {
      'compiled_gib': 'GiB', 'temp_gib': 'GiB', 'plan_s': 's'}
  assert 'attention=flash' in rows[0]['setting'] and 'inputs_length=64' in rows[0]['setting']
  units = {row['metric']: row['unit'] for row in record.rows(summary, record.context('cpu', 'x'))}
  assert units['longest_inputs.flash'] == 'tokens' and units['flash_vs_xla_memory_64'] == ''


@pytest.mark.skipif(importlib.util.find_spec('libtpu') is not None, reason='libtpu is installed')
def test_without_libtpu_it_says_so_and_measures_nothing(tmp_path, capsys):
  """As `make bench` runs it on a machine without the tpu extra."""
  out = tmp_path / 'tpu_plan.jsonl'
  tpu_plan.main([f'--out={out}'])
  captured = capsys.readouterr()
  assert captured.out == '' and not out.exists()
  assert captured.err == ('tpu_plan: nothing measured: compiling for TPUs needs libtpu '
                          '(pip install -e .[tpu])\n')
