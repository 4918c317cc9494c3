"""What mixing costs the input pipeline: examples per CPU-second of a 3-component mixture and of
UL2's seven denoisers beside a single source with span corruption, side by side; JSON lines.

  .venv/bin/python bench/mixture.py [--examples=2048] [--rounds=15] [--settings=128,512]
      [--alone] [--diagnose] [--children=1] [--source=TEXT]

All read the bundled corpus, or --source (tokenized at start-up, which is reported, not timed), at
inputs and targets of 128 (configs/ul2_tiny.py's) and of 512 (UL2's), batch 32:
- single: span corruption of `data.source`, as t5_tiny trains;
- mixture: three components of that corpus, weights 5:3:2, each in its own order (keyed by its
  name), with span corruption: the mixing alone (the schedule's lookup, one stream per
  component, each row taken from its component's stream);
- ul2: configs/ul2_tiny.py's seven denoisers, each its own objective, settings and mode tokens;
- with --alone, each denoiser alone as a single source: UL2's rows are more work than span
  corruption's (at 512: 654 raw tokens a row on average, not 568, and X's targets 506 tokens,
  not 114), so `ul2_alone` is the rate UL2 would have if mixing cost nothing (each denoiser's time
  per example weighted by its rate) and `ul2_mixing_ratio` UL2's rate over it;
- with --diagnose, where UL2's mixing cost is: `single_again` (the single source in a second
  child: the method's noise floor), `same6` (six components of R's span corruption (0.15, 3) with
  its mode, [NLU]: mixing one objective's rows alike) and `lengths6` (the same six, but with modes
  of 0, 1 and 2 texts: rows of three raw lengths, 568, 567 and 566 at 512 (568, 561 and 554
  with bundled-v1's seven-piece modes), and nothing else different).

How: paired rounds. Each pipeline runs as it trains (parallel maps, prefetch, one tf.data
thread) in a child process of its own, every child held to this process's first core. All are
started and warmed up (WARMUP_BATCHES), then stopped (SIGSTOP); in each of --rounds rounds, each
child in turn is continued, reads --examples rows and is stopped again, so the pipelines are
timed seconds apart and never beside each other. A round's rate is its rows over the child's CPU
time since its last round ended (the work it did ahead then is counted with the rows it made).
Each line has the medians over rounds and the median of each round's ratio to `single`: on a
shared machine, runs of one pipeline minutes apart differ by 20% and more, and one process per
run cannot see a 10% difference. A process also keeps its own speed for its life (the single
source in two children differed by up to 6%, run after run): with --children=N each pipeline is
served by N children, and a round's rate is their rows over their CPU time together.
"""

import argparse
import collections
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_pipeline import machine  # pylint: disable=wrong-import-position  # bench/, beside this

PIPELINES = ('single', 'mixture', 'ul2')
# --diagnose's six components of R's span corruption: each one's mode
DIAGNOSTIC_MODES = {'same6': ['[NLU]'] * 6, 'lengths6': ['', '[NLU]', '[NLU] [NLG]'] * 2}
DIAGNOSTIC = ('single_again', *DIAGNOSTIC_MODES)
SETTINGS = {'128': 128, '512': 512}  # inputs_length = targets_length
WARMUP_BATCHES = 32


def pipeline_data(name: str, length: int, source: str | None = None):
  """The data config of pipeline `name` at `length` inputs and targets ('alone:DENOISER': that
  UL2 denoiser as a single source), reading `source` (default: the bundled corpus)."""
  import ml_collections  # pylint: disable=import-outside-toplevel  # the child's
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel
  from t5lite.inputs import mixture  # pylint: disable=import-outside-toplevel
  data = config_lib.load(os.path.join(ROOT, 'configs', 'ul2_tiny.py')).data
  if name.startswith('alone:'):
    data = mixture.component_data(data, name.removeprefix('alone:'))
  elif name in DIAGNOSTIC_MODES:
    r_denoiser = data.mixture.r_3_15.to_dict()
    data.mixture = ml_collections.ConfigDict({f'r{k}': {**r_denoiser, 'mode': mode}
                                              for k, mode in enumerate(DIAGNOSTIC_MODES[name])})
  elif name != 'ul2':
    data.mixture = ml_collections.ConfigDict()
  if name == 'mixture':
    for component, weight in (('books', 5.0), ('code', 3.0), ('web', 2.0)):
      data.mixture[component] = dict(weight=weight)
  data.update(inputs_length=length, targets_length=length, batch_size=32, threads=1)
  if source:
    data.source = source
  return data


def ul2_rates() -> dict[str, float]:
  """UL2's denoisers and their shares of the rows (configs/ul2_tiny.py's mixture)."""
  from t5lite.objectives import ul2  # pylint: disable=import-outside-toplevel
  weights = {name: component.weight for name, component in ul2.mixture().items()}
  return {name: weight / sum(weights.values()) for name, weight in weights.items()}


def free_rate(shares: dict[str, float], alone: dict[str, float]) -> float:
  """Examples per CPU-second of a mixture if mixing cost nothing: its components' times per
  example (1 / their rates `alone`) weighted by their `shares` of the rows."""
  return 1 / sum(share / alone[name] for name, share in shares.items())


def serve(name: str, length: int, examples: int, source: str | None) -> None:
  """A child: builds pipeline `name`, warms it up, says how long that took; then, for each line
  on stdin, reads `examples` rows and prints its CPU time so far (all its threads)."""
  from t5lite.inputs import batches as batches_lib  # pylint: disable=import-outside-toplevel
  tic = time.perf_counter()
  data = pipeline_data(name.removesuffix('_again'), length, source)
  batches = batches_lib.make_batches(data, 'train', process_index=0, process_count=1)
  for _ in range(WARMUP_BATCHES):
    next(batches)
  print(json.dumps({'startup_s': time.perf_counter() - tic, 'cpu_s': time.process_time()}),
        flush=True)
  for _ in sys.stdin:
    rows = 0
    while rows < examples:
      rows += len(next(batches)['encoder_input_tokens'])
    print(json.dumps({'rows': rows, 'cpu_s': time.process_time()}), flush=True)


class Child:
  """One pipeline's child process, held to `core`, stopped (SIGSTOP) but while it reads."""

  def __init__(self, name: str, setting: str, args, core: set[int]):
    self.process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), f'--child={name}', f'--settings={setting}',
         f'--examples={args.examples}', *([f'--source={args.source}'] if args.source else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'},
        preexec_fn=lambda: os.sched_setaffinity(0, core))

  def ready(self) -> float:
    """Waits for the warm-up; stops the child; its start-up seconds."""
    said = self.answer()
    self.cpu_s = said['cpu_s']
    os.kill(self.process.pid, signal.SIGSTOP)
    return said['startup_s']

  def round(self) -> tuple[int, float]:
    """The rows of one round and the CPU-seconds they took."""
    os.kill(self.process.pid, signal.SIGCONT)
    self.process.stdin.write('\n')
    self.process.stdin.flush()
    said = self.answer()
    os.kill(self.process.pid, signal.SIGSTOP)
    rows, cpu_s = said['rows'], said['cpu_s'] - self.cpu_s
    self.cpu_s = said['cpu_s']
    return rows, cpu_s

  def answer(self) -> dict:
    line = self.process.stdout.readline()
    if not line:
      raise RuntimeError(f'a child exited with status {self.process.wait()}')
    return json.loads(line)

  def close(self):
    if self.process.poll() is None:
      os.kill(self.process.pid, signal.SIGCONT)
      self.process.stdin.close()
    self.process.wait()


def paired_rounds(names: list[str], setting: str, args) -> tuple[dict, dict, list[float]]:
  """({name: its rate in each round}, {name: start-up seconds}, the load average at each round)."""
  core = set(sorted(os.sched_getaffinity(0))[:1])
  children = {name: [Child(name, setting, args, core) for _ in range(args.children)]
              for name in names}
  try:
    startup = {name: round(statistics.median(child.ready() for child in served), 2)
               for name, served in children.items()}
    rates, loads = collections.defaultdict(list), []
    for k in range(args.rounds):  # each round in the other order
      for name in names if k % 2 == 0 else names[::-1]:
        rates[name].append(pooled_rate([child.round() for child in children[name]]))
      loads.append(os.getloadavg()[0])
  finally:
    for served in children.values():
      for child in served:
        child.close()
  return rates, startup, loads


def pooled_rate(rounds: list[tuple[int, float]]) -> float:
  """Rows per CPU-second of a pipeline's children in one round, from each one's (rows, CPU-s)."""
  return sum(rows for rows, _ in rounds) / sum(cpu_s for _, cpu_s in rounds)


def ul2_free_rates(alone: dict[str, list[float]]) -> list[float]:
  """free_rate of UL2 in each round k, from its denoisers' rates alone in that round
  (`alone['alone:NAME'][k]`)."""
  shares = ul2_rates()
  rounds = len(alone[f'alone:{next(iter(shares))}'])
  return [free_rate(shares, {name: alone[f'alone:{name}'][k] for name in shares})
          for k in range(rounds)]


def median_ratio(rates: list[float], to: list[float]) -> float:
  return round(statistics.median(r / t for r, t in zip(rates, to)), 3)


def row(names: list[str], setting: str, args) -> dict:
  """One setting's line: every pipeline timed in paired rounds; medians, and their ratios."""
  rates, startup, loads = paired_rounds(names, setting, args)
  line = {'bench': 'mixture', 'inputs_length': SETTINGS[setting],
          'targets_length': SETTINGS[setting], 'batch_size': 32, 'cores': 1, 'threads': 1,
          'examples': args.examples, 'rounds': args.rounds, 'children': args.children,
          'examples_per_cpu_s': {name: round(statistics.median(rates[name]), 1)
                                 for name in names},
          'ratio_to_single': {name: median_ratio(rates[name], rates['single'])
                              for name in names if name in PIPELINES[1:] + DIAGNOSTIC}}
  if args.alone:
    free = ul2_free_rates(rates)
    line['ul2_alone'] = round(statistics.median(free), 1)
    line['ul2_mixing_ratio'] = median_ratio(rates['ul2'], free)
  return {**line, 'startup_s': startup, 'cpu': machine(), 'load_avg_1m': [min(loads), max(loads)],
          'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--examples', type=int, default=2048, help='rows a pipeline reads a round')
  parser.add_argument('--rounds', type=int, default=15)
  parser.add_argument('--children', type=int, default=1, help='processes serving each pipeline')
  parser.add_argument('--settings', default=','.join(SETTINGS), help='of ' + ','.join(SETTINGS))
  parser.add_argument('--source', help='the text every pipeline reads (default: the bundled '
                      'corpus, which each child tokenizes at start-up)')
  parser.add_argument('--alone', action='store_true', help="also each UL2 denoiser alone")
  parser.add_argument('--diagnose', action='store_true',
                      help=f'also {", ".join(DIAGNOSTIC)}: where mixing costs')
  parser.add_argument('--child', help=argparse.SUPPRESS)  # the pipeline a child serves
  args = parser.parse_args()
  if args.child:
    serve(args.child, SETTINGS[args.settings], args.examples, args.source)
    return
  names = [*PIPELINES, *(DIAGNOSTIC if args.diagnose else ()),
           *([f'alone:{name}' for name in ul2_rates()] if args.alone else ())]
  for setting in args.settings.split(','):
    print(json.dumps(row(names, setting, args)), flush=True)


if __name__ == '__main__':
  main()
