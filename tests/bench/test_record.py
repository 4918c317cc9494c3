"""The benchmark record: bench lines become rows with their context, a row without a required key
is refused, BENCHMARKS.md is what the rows in bench/results/ generate, and bench/run_all.py
appends a bench's rows (a fake bench in a copy of bench/: no real benchmark runs)."""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / 'bench'))
import record  # pylint: disable=wrong-import-position  # bench/record.py

WHERE = {'machine': 'test box', 'load': '0.1-0.2', 'commit': 'abc1234',
         'date': '2026-11-28T09:00Z', 'command': 'python bench/fake.py'}


def row(value, date='2026-11-28T09:00Z', machine='test box', metric='step_s'):
  return {'bench': 'fake', 'metric': metric, 'value': value, 'unit': 's', 'machine': machine,
          'load': None, 'commit': None, 'date': date, 'command': 'python bench/fake.py'}


def test_a_line_becomes_a_row_per_figure_with_its_setting_and_context():
  line = {'bench': 'fake', 'model': 't5_tiny', 'batch_size': 8, 'scan_layers': True,
          'step_s': 0.25, 'tokens_per_s': 1234.5, 'ratio_to_single': {'ul2': 0.93},
          'fwd_bwd_ms': 5.04, 'peak_memory_gib': 22.75, 'mfu': 0.243, 'losses': [9.5, 9.4],
          'train_flops_per_step': 1.6e11, 'examples_per_cpu_s': {'store': 4377.0},
          'ratio': {'examples_per_s': 2.17}, 'after_step': 3, 'saved_step': 5,
          'units': {'saved_step': 'step'},
          'date': '2026-11-28T08:00:00Z', 'cpu': 'AMD EPYC', 'cores': 2}
  made = record.rows(line, WHERE)
  assert [(r['metric'], r['value'], r['unit']) for r in made] == [
      ('step_s', 0.25, 's'), ('tokens_per_s', 1234.5, 'tokens/s'),
      ('ratio_to_single.ul2', 0.93, ''), ('fwd_bwd_ms', 5.04, 'ms'),
      ('peak_memory_gib', 22.75, 'GiB'), ('mfu', 0.243, 'MFU'),
      ('train_flops_per_step', 1.6e11, 'FLOP'),
      ('examples_per_cpu_s.store', 4377.0, 'examples/CPU-s'), ('ratio.examples_per_s', 2.17, ''),
      ('saved_step', 5, 'step')]
  assert {r['setting'] for r in made} == {
      'model=t5_tiny, batch_size=8, scan_layers=True, after_step=3'}
  assert all(r['bench'] == 'fake' and r['date'] == '2026-11-28T09:00Z'
             and r['commit'] == 'abc1234' for r in made)


def test_a_row_missing_a_key_or_with_an_unknown_one_is_refused(tmp_path):
  for broken in ({k: v for k, v in row(1.0).items() if k != 'machine'},
                 {**row(1.0), 'comment': 'no such key'}):
    with pytest.raises(ValueError, match='missing|unknown'):
      record.check(broken)
    with pytest.raises(ValueError):
      record.append(str(tmp_path / 'fake.jsonl'), [broken])
    (tmp_path / 'bad.jsonl').write_text(json.dumps(broken) + '\n', encoding='utf-8')
    with pytest.raises(ValueError):
      record.read(str(tmp_path))
  assert not (tmp_path / 'fake.jsonl').exists()


def test_the_latest_figure_is_current_and_gpus_come_first():
  record_rows = [row(0.5, '2026-11-20'), row(2.0, machine='NVIDIA H200'),
                 row(0.4, '2026-11-22'), row(0.45, '2026-11-21'),
                 row(1.5, machine='NVIDIA H100'), row(9.0, metric='compile_s')]
  shown = record.current(record_rows)
  assert [(r['machine'], r['metric'], r['value']) for r in shown] == [
      ('NVIDIA H100', 'step_s', 1.5), ('NVIDIA H200', 'step_s', 2.0),
      ('test box', 'compile_s', 9.0), ('test box', 'step_s', 0.4)]
  text = record.table(record_rows)
  assert '| `fake` step_s | 0.4 s |  | test box |  | 2026-11-22 |  | [1] |' in text
  assert '0.45 s' not in text and '0.5 s' not in text
  assert text.endswith('Commands:\n\n1. `python bench/fake.py`\n')


def test_benchmarks_md_is_what_the_record_generates():
  rows = record.read()
  assert len(rows) >= 200
  on_h100 = [r for r in record.current(rows) if 'H100' in r['machine']]
  assert on_h100 and record.current(rows)[0] is on_h100[0]
  assert all((ROOT / row['notes']).exists() for row in rows if row.get('notes'))
  assert (ROOT / 'BENCHMARKS.md').read_text(encoding='utf-8') == record.table(rows), (
      'BENCHMARKS.md differs from the record: python bench/record.py --table')


def test_run_all_appends_a_benchs_rows_and_rewrites_the_table(tmp_path):
  bench = tmp_path / 'bench'
  bench.mkdir()
  for name in ('run_all.py', 'record.py'):
    shutil.copy(ROOT / 'bench' / name, bench / name)
  (bench / 'fake.py').write_text(
      'import json\nprint("chatter")\n'
      'print(json.dumps({"bench": "fake", "model": "m", "step_s": 0.25, "mfu": 0.5}))\n',
      encoding='utf-8')
  script = [sys.executable, str(bench / 'run_all.py')]
  dry = subprocess.run([*script, '--dry_run'], capture_output=True, text=True, check=True)
  assert dry.stdout.strip().endswith('bench/fake.py') and len(dry.stdout.splitlines()) == 1
  assert not (bench / 'results').exists()
  for _ in range(2):
    subprocess.run(script, capture_output=True, text=True, check=True)
  rows = [json.loads(line) for line in (bench / 'results' / 'fake.jsonl').read_text().splitlines()]
  assert [(r['metric'], r['value'], r['setting']) for r in rows] == [
      ('step_s', 0.25, 'model=m'), ('mfu', 0.5, 'model=m')] * 2
  assert {r['command'] for r in rows} == {'python bench/fake.py'} and all(
      r['machine'] and r['load'] and r['date'] for r in rows)
  table = (tmp_path / 'BENCHMARKS.md').read_text(encoding='utf-8')
  assert table.count('| `fake` ') == 2 and '| 0.25 s |' in table and '| 0.5 MFU |' in table


def test_add_records_lines_made_elsewhere_under_their_file_name(tmp_path, monkeypatch):
  monkeypatch.setattr(record, 'RESULTS', str(tmp_path / 'results'))
  lines = tmp_path / 'gpu.jsonl'
  lines.write_text(json.dumps({'bench': 'gpu', 'backend': 'gpu'}) + '\n' + json.dumps(
      {'bench': 'gpu_speed', 'model': 't5_1_1_base', 'change': 'model.attention=cudnn',
       'batch_size': 128, 'step_s': 0.2261, 'mfu': 0.2432, 'peak_flops': 989e12}) + '\n',
                   encoding='utf-8')
  record.main(['--add', str(lines), '--machine', '1x H100', '--command', 'python bench/gpu.py',
               '--date', '2026-11-27T14:50Z', '--commit', 'abc1234'])
  rows = record.read(str(tmp_path / 'results'))
  assert [(r['metric'], r['value'], r['unit']) for r in rows] == [('step_s', 0.2261, 's'),
                                                                 ('mfu', 0.2432, 'MFU')]
  assert rows[0] == {'bench': 'gpu_speed', 'metric': 'step_s', 'value': 0.2261, 'unit': 's',
                     'machine': '1x H100', 'load': None, 'commit': 'abc1234',
                     'date': '2026-11-27T14:50Z', 'command': 'python bench/gpu.py',
                     'setting': 'model=t5_1_1_base, change=model.attention=cudnn, batch_size=128'}
