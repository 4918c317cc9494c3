"""Runs every benchmark in bench/ and records its figures in bench/results/ (`make bench`).

Each `bench/*.py` prints one JSON line per measurement on stdout. This runner runs them one after
another (never together: they would slow each other down), prints their lines and appends a row
per figure, with the machine, load, commit, date and command, to bench/results/NAME.jsonl
(bench/record.py), so results keep their context. `python bench/record.py --table` then makes
BENCHMARKS.md from the rows.

  python bench/run_all.py                      # all of them, recorded
  python bench/run_all.py --only train_step    # one (comma-separate several)
  python bench/run_all.py --dry_run            # show what would run; run and record nothing
"""

import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import record

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
# this runner, the record's module, and a tool that reads the traces bench/gpu.py leaves
NOT_BENCHES = ('run_all.py', 'record.py', 'step_profile.py')


def benchmarks(only: str | None) -> list[str]:
  """Paths of bench/*.py but NOT_BENCHES, all or the ones `only` names (without .py)."""
  paths = sorted(p for p in glob.glob(os.path.join(BENCH_DIR, '*.py'))
                 if os.path.basename(p) not in NOT_BENCHES)
  if not only:
    return paths
  wanted = only.split(',')
  names = {os.path.splitext(os.path.basename(p))[0]: p for p in paths}
  unknown = [w for w in wanted if w not in names]
  if unknown:
    raise SystemExit(f'no benchmark named {", ".join(unknown)}; have {", ".join(names)}')
  return [names[w] for w in wanted]


def run(path: str) -> tuple[list[dict], int, str]:
  """The JSON lines one benchmark printed, its exit status and the load average over its run
  (1-minute, at start and end); its stderr passes through."""
  before = os.getloadavg()[0]
  done = subprocess.run([sys.executable, path], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  after = os.getloadavg()[0]
  rows = []
  for line in done.stdout.splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      print(line)  # a benchmark's own chatter: show it, do not record it
      continue
    if isinstance(row, dict):
      rows.append(row)
      print(line, flush=True)
  return rows, done.returncode, f'{min(before, after):.1f}-{max(before, after):.1f}'


def machine() -> str:
  """'CPU model, N cores, M GiB' of this machine, read from /proc (Linux)."""
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    cpu = re.search(r'model name\s*:\s*(.*)', f.read())
  with open('/proc/meminfo', encoding='utf-8') as f:
    memory_kib = int(re.search(r'MemTotal:\s+(\d+)', f.read()).group(1))
  cpu_name = cpu.group(1).strip() if cpu else 'unknown CPU'
  return f'{cpu_name}, {len(os.sched_getaffinity(0))} cores, {memory_kib / 2**20:.1f} GiB'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', help='comma-separated benchmark names, e.g. train_step')
  parser.add_argument('--dry_run', action='store_true', help='print the commands, run nothing')
  args = parser.parse_args(argv)
  paths = benchmarks(args.only)
  if args.dry_run:
    for path in paths:
      print(shlex.join([sys.executable, os.path.relpath(path, ROOT)]))
    return 0
  statuses = []
  for path in paths:
    started = record.now()
    lines, status, load = run(path)
    command = shlex.join(['python', os.path.relpath(path, ROOT)])
    new = [row for line in lines
           for row in record.rows(line, record.context(machine(), command, load, started))]
    name = os.path.splitext(os.path.basename(path))[0]
    record.append(os.path.join(record.RESULTS, f'{name}.jsonl'), new)
    print(f'{name}: exit status {status}, {len(new)} rows appended to bench/results/{name}.jsonl')
    statuses.append(status)
  record.write_table()
  print(f'{os.path.relpath(record.TABLE, ROOT)}: the current figures, rewritten from the record')
  return 0 if not any(statuses) else 1


if __name__ == '__main__':
  sys.exit(main())
