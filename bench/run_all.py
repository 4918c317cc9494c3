"""Runs every benchmark in bench/ and records its JSON lines in BENCHMARKS.md (`make bench`).

Each `bench/*.py` prints one JSON line per measurement on stdout. This runner runs them one after
another (never together: they would slow each other down), prints their lines and appends a dated
section with the machine and the command to BENCHMARKS.md, so results keep their context.

  python bench/run_all.py                      # all of them, recorded
  python bench/run_all.py --only train_step    # one (comma-separate several)
  python bench/run_all.py --dry_run            # show what would run; run and record nothing
"""

import argparse
import datetime
import glob
import json
import os
import re
import shlex
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)


def benchmarks(only: str | None) -> list[str]:
  """Paths of bench/*.py except this runner, all or the ones `only` names (without .py)."""
  paths = sorted(p for p in glob.glob(os.path.join(BENCH_DIR, '*.py'))
                 if os.path.abspath(p) != os.path.abspath(__file__))
  if not only:
    return paths
  wanted = only.split(',')
  names = {os.path.splitext(os.path.basename(p))[0]: p for p in paths}
  unknown = [w for w in wanted if w not in names]
  if unknown:
    raise SystemExit(f'no benchmark named {", ".join(unknown)}; have {", ".join(names)}')
  return [names[w] for w in wanted]


def run(path: str) -> tuple[list[dict], int]:
  """The JSON lines one benchmark printed and its exit status; its stderr passes through."""
  done = subprocess.run([sys.executable, path], cwd=ROOT, stdout=subprocess.PIPE, text=True)
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
  return rows, done.returncode


def machine() -> str:
  """'CPU model, N cores, M GiB' of this machine, read from /proc (Linux)."""
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    cpu = re.search(r'model name\s*:\s*(.*)', f.read())
  with open('/proc/meminfo', encoding='utf-8') as f:
    memory_kib = int(re.search(r'MemTotal:\s+(\d+)', f.read()).group(1))
  cpu_name = cpu.group(1).strip() if cpu else 'unknown CPU'
  return f'{cpu_name}, {len(os.sched_getaffinity(0))} cores, {memory_kib / 2**20:.1f} GiB'


def section(results: dict, command: str, started: datetime.datetime) -> str:
  """A Markdown section: date, machine, command, then each benchmark's status and lines."""
  lines = [f'## {started:%Y-%m-%d %H:%M} UTC', '',
           f'Machine: {machine()}. Command: `{command}`.', '']
  for path, (rows, status) in results.items():
    name = os.path.relpath(path, ROOT)
    lines.append(f'`{name}`: ' + ('ok' if status == 0 else f'failed (exit status {status})'))
    if rows:
      lines += ['', '```json', *(json.dumps(row) for row in rows), '```']
    lines.append('')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', help='comma-separated benchmark names, e.g. train_step')
  parser.add_argument('--dry_run', action='store_true', help='print the commands, run nothing')
  parser.add_argument('--out', default=os.path.join(ROOT, 'BENCHMARKS.md'),
                      help='the Markdown file to append to')
  args = parser.parse_args(argv)
  paths = benchmarks(args.only)
  if args.dry_run:
    for path in paths:
      print(shlex.join([sys.executable, os.path.relpath(path, ROOT)]))
    return 0
  started = datetime.datetime.now(datetime.timezone.utc)
  results = {path: run(path) for path in paths}
  flags = sys.argv[1:] if argv is None else argv
  command = shlex.join(['python', 'bench/run_all.py', *flags])
  with open(args.out, 'a', encoding='utf-8') as f:
    f.write('\n' + section(results, command, started))
  print(f'appended {sum(len(rows) for rows, _ in results.values())} lines to {args.out}')
  return 0 if all(status == 0 for _, status in results.values()) else 1


if __name__ == '__main__':
  sys.exit(main())
