"""The benchmark record: one JSON row per figure in bench/results/*.jsonl, and BENCHMARKS.md, the
table of the current ones, generated from them.

A bench prints JSON lines of figures and settings; `rows` turns one line into a row per figure,
each with the context that makes it a record (machine, load, commit, date, command).
bench/run_all.py appends the rows of what it runs; lines made elsewhere (bench/gpu.py's
$OUT/gpu.jsonl on a GPU machine) are added by hand:

  python bench/record.py --add=$OUT/gpu.jsonl \
      --machine='1x NVIDIA H100 80GB HBM3, 16 host cores' \
      --command='python bench/gpu.py --out=$OUT'      # -> bench/results/gpu.jsonl
  python bench/record.py --table                     # rewrites BENCHMARKS.md from the rows

A row's figure is current until a later row gives the same bench, setting, metric and machine
(the same machine string: reuse the record's); BENCHMARKS.md shows the current ones, GPU
machines first. tests/bench/test_record.py fails when
BENCHMARKS.md is not what the rows generate.
"""

import argparse
import datetime
import glob
import json
import os
import re
import subprocess

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
RESULTS = os.path.join(BENCH_DIR, 'results')
TABLE = os.path.join(ROOT, 'BENCHMARKS.md')

REQUIRED = ('bench', 'metric', 'value', 'unit', 'machine', 'load', 'commit', 'date', 'command')
OPTIONAL = ('setting', 'target', 'notes')  # notes: the docs/notes page that tells the story
# a line's keys that say where and when it ran, not what: the row's context has them; `units`
# names the unit of figures whose keys say none ({'saved_step': 'step'})
CONTEXT = {'bench', 'units', 'date', 'cpu', 'cores', 'jax', 'load_avg_1m', 'load_average', 'device',
           'png', 'workdir', 'peak_flops', 'peak_source', 'peak_flops_source'}
# the unit of a figure, from its key: the first pattern found in the outermost part of its dotted
# path that has one (ratio.examples_per_s is a ratio, examples_per_s.t5lite a rate)
UNITS = ((r'([a-z]+)_per_cpu_s($|_)', r'\1/CPU-s'), (r'([a-z]+)_per_s($|_)', r'\1/s'),
         (r'(^|_)ms($|_)', 'ms'), (r'(^|_)(s|seconds)($|_)', 's'), (r'mib', 'MiB'),
         (r'gib', 'GiB'), (r'mfu', 'MFU'), (r'flops', 'FLOP'),
         (r'ratio|speedup|_vs_|accuracy|loss|gap', ''))
GPUS = ('H100', 'H200')


def unit(path: str) -> str | None:
  """The unit of the figure at `path` (dotted keys), or None for a setting such as batch_size."""
  for part in path.split('.'):
    for pattern, name in UNITS:
      found = re.search(pattern, part)
      if found:
        return found.expand(name)
  return None


def flatten(line: dict, prefix: str = '') -> dict:
  """{'a': {'b': 1}} -> {'a.b': 1}; lists are left out (loss traces, not figures)."""
  flat = {}
  for key, value in line.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    elif not isinstance(value, list):
      flat[f'{prefix}{key}'] = value
  return flat


def rows(line: dict, context: dict) -> list[dict]:
  """A row per figure of one bench line: its numbers with a unit (the line's `units`, else the
  key's), the rest of the line (model, batch, ...) as the rows' setting, and `context`'s machine,
  load, commit, date and command."""
  flat = flatten({k: v for k, v in line.items() if k not in CONTEXT})
  units = {k: line.get('units', {}).get(k, unit(k)) for k in flat}
  figures = {k: v for k, v in flat.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and units[k] is not None}
  setting = ', '.join(f'{k}={v}' for k, v in flat.items() if k not in figures and v is not None)
  return [{'bench': line['bench'], 'metric': k, 'value': v, 'unit': units[k], **context,
           **({'setting': setting} if setting else {})} for k, v in figures.items()]


def check(row: dict) -> None:
  """Refuses a row that lacks a required key or has one the record does not know."""
  missing = [k for k in REQUIRED if k not in row]
  unknown = [k for k in row if k not in REQUIRED + OPTIONAL]
  if missing or unknown:
    raise ValueError(f'row {row}: missing {missing}, unknown {unknown}')


def append(path: str, new: list[dict]) -> None:
  for row in new:
    check(row)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'a', encoding='utf-8') as f:
    f.writelines(json.dumps(row) + '\n' for row in new)


def read(folder: str = RESULTS) -> list[dict]:
  """Every row of folder/*.jsonl, in file and line order; a row that fails `check` raises."""
  found = []
  for path in sorted(glob.glob(os.path.join(folder, '*.jsonl'))):
    with open(path, encoding='utf-8') as f:
      found += [json.loads(line) for line in f if line.strip()]
  for row in found:
    check(row)
  return found


def now() -> str:
  """The record's date of this minute, UTC: 2026-11-27T14:50Z."""
  return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%MZ')


def context(machine: str, command: str, load: str | None = None, date: str | None = None,
            commit: str | None = None) -> dict:
  """The rows' context; the date defaults to now and the commit to this checkout's HEAD."""
  if date is None:
    date = now()
  if commit is None:
    done = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, text=True,
                          capture_output=True, check=False)
    commit = done.stdout.strip() or None
  return {'machine': machine, 'load': load, 'commit': commit, 'date': date, 'command': command}


def current(record: list[dict]) -> list[dict]:
  """The latest row of each (bench, setting, metric, machine): machines in GPUS order first, each
  machine's newest first, a bench line's rows in their order."""
  latest = {}
  for row in record:
    key = (row['bench'], row.get('setting'), row['metric'], row['machine'])
    if key not in latest or row['date'] >= latest[key]['date']:
      latest[key] = row  # in its first figure's place
  newest = sorted(latest.values(), key=lambda row: row['date'], reverse=True)
  return sorted(newest, key=lambda row: next(
      (i for i, gpu in enumerate(GPUS) if gpu in row['machine']), len(GPUS)))


def value_text(row: dict) -> str:
  return f'{row["value"]:,} {row["unit"]}'.strip()


def table(record: list[dict]) -> str:
  """BENCHMARKS.md: the current figures, a row each; commands numbered below the table."""
  shown = current(record)
  commands = list(dict.fromkeys(row['command'] for row in shown if row['command']))
  lines = [
      '# Benchmarks', '',
      'The current figure of every measurement in the record, `bench/results/*.jsonl`, GPU',
      "machines first. GPU steps are bfloat16 at 512/114 tokens on synthetic batches; MFU is",
      "against the chip's peak (989 TFLOP/s for an H100 or H200 in bfloat16).",
      'Generated by `python bench/record.py --table`: do not edit by hand. How a figure gets',
      'here: [docs/benchmarks.md](docs/benchmarks.md); how each was found and what was tried:',
      'the linked pages of [docs/notes/](docs/notes/README.md).', '',
      '| what | value | target | machine | load | date | commit | command |',
      '|---|---|---|---|---|---|---|---|']
  for row in shown:
    what = f'`{row["bench"]}` {row["metric"]}' + (f' ({row["setting"]})'
                                                  if row.get('setting') else '')
    if row.get('notes'):
      what = f'[{what}]({row["notes"]})'
    cells = [what, value_text(row), row.get('target') or '', row['machine'], row['load'] or '',
             row['date'], row['commit'] or '',
             f'[{commands.index(row["command"]) + 1}]' if row['command'] else '']
    lines.append('| ' + ' | '.join(str(c).replace('|', '\\|') for c in cells) + ' |')
  lines += ['', 'Commands:', '']
  lines += [f'{i}. `{command}`' for i, command in enumerate(commands, 1)]
  return '\n'.join(lines) + '\n'


def write_table() -> None:
  with open(TABLE, 'w', encoding='utf-8') as f:
    f.write(table(read()))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--table', action='store_true', help='rewrite BENCHMARKS.md from the rows')
  parser.add_argument('--add', help="a bench's JSON lines (a file), appended as rows to "
                      'bench/results/ under the same file name')
  parser.add_argument('--machine', help='with --add: where they ran')
  parser.add_argument('--command', help='with --add: the command that made them')
  parser.add_argument('--load', help='with --add: the load average, e.g. 1.2-3.4')
  parser.add_argument('--date', help='with --add: when, e.g. 2026-11-27T14:50Z (default: now)')
  parser.add_argument('--commit', help="with --add: the code's commit (default: HEAD)")
  args = parser.parse_args(argv)
  if args.add:
    if not (args.machine and args.command):
      parser.error('--add needs --machine and --command')
    where = context(args.machine, args.command, args.load, args.date, args.commit)
    with open(args.add, encoding='utf-8') as f:
      new = [row for line in f if line.strip() for row in rows(json.loads(line), where)]
    append(os.path.join(RESULTS, os.path.basename(args.add)), new)
    print(f'appended {len(new)} rows to bench/results/{os.path.basename(args.add)}')
  if args.table:
    write_table()


if __name__ == '__main__':
  main()
