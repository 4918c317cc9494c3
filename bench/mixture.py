"""What mixing costs the input pipeline: examples per CPU-second of a 3-component mixture and of
UL2's seven denoisers beside a single source with span corruption, side by side; JSON lines.

  .venv/bin/python bench/mixture.py [--examples=8192] [--repeats=3] [--settings=128,512]
      [--alone] [--source=TEXT] [--in_process]

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
  per example weighted by its rate) and `ul2_mixing_ratio` UL2's rate over it.
Each run is a child process of one pipeline at one setting, held to one core with one tf.data
thread (the steadiest measure on a shared machine). Runs alternate between pipelines, each repeat
in the other order; each line has every pipeline's medians over --repeats runs and the median
ratio to `single` of the runs made side by side. Rates are counted after WARMUP_BATCHES batches.

With --in_process, every pipeline (and `ul2_span`: UL2's six span-corruption denoisers alone, its
first chain) is built in one child process instead, without tf.data's prefetch or parallel maps
(so that none works ahead while another is timed), and they are timed --repeats rounds in turn:
runs minutes apart differ by up to 20% on a shared machine, rounds seconds apart less.
"""

import argparse
import collections
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_pipeline import machine  # pylint: disable=wrong-import-position  # bench/, beside this

PIPELINES = ('single', 'mixture', 'ul2')
SETTINGS = {'128': 128, '512': 512}  # inputs_length = targets_length
WARMUP_BATCHES = 32


def pipeline_data(name: str, length: int, source: str | None = None):
  """The data config of pipeline `name` at `length` inputs and targets ('alone:DENOISER': that
  UL2 denoiser as a single source), reading `source` (default: the bundled corpus)."""
  import ml_collections  # pylint: disable=import-outside-toplevel  # the child's
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel
  from t5lite.data import mixture  # pylint: disable=import-outside-toplevel
  data = config_lib.load(os.path.join(ROOT, 'configs', 'ul2_tiny.py')).data
  if name.startswith('alone:'):
    data = mixture.component_data(data, name.removeprefix('alone:'))
  elif name == 'ul2_span':  # UL2 without its prefix LM (S): one tf.data chain
    del data.mixture['s']
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


def measure(name: str, length: int, examples: int, source: str | None) -> dict:
  """Rates after WARMUP_BATCHES (tf.data's buffers filled, its autotuning settled)."""
  from t5lite.data import batches as batches_lib  # pylint: disable=import-outside-toplevel
  tic = time.perf_counter()
  batches = batches_lib.make_batches(pipeline_data(name, length, source), 'train', process_index=0,
                                     process_count=1)
  next(batches)
  startup = time.perf_counter() - tic
  for _ in range(WARMUP_BATCHES):
    next(batches)
  tic, cpu = time.perf_counter(), time.process_time()
  rows = 0
  while rows < examples:
    rows += len(next(batches)['encoder_input_tokens'])
  seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
  return {'examples_per_s': rows / seconds, 'examples_per_cpu_s': rows / cpu_seconds,
          'startup_s': startup}


def measure_in_turn(names: list[str], length: int, examples: int, rounds: int,
                    source: str | None) -> dict[str, list[float]]:
  """Examples per CPU-second of each pipeline, `rounds` times, timed in turn in this process;
  built without prefetch or parallel maps, so that only the timed one computes."""
  from t5lite.data import batches as batches_lib  # pylint: disable=import-outside-toplevel
  from t5lite.data.tf_setup import tf  # pylint: disable=import-outside-toplevel
  sequential_map = tf.data.Dataset.map
  tf.data.Dataset.prefetch = lambda self, *args, **kwargs: self
  tf.data.Dataset.map = lambda self, fn, *args, **kwargs: sequential_map(self, fn)
  pipelines = {name: batches_lib.make_batches(pipeline_data(name, length, source), 'train',
                                              process_index=0, process_count=1)
               for name in names}
  for batches in pipelines.values():
    for _ in range(WARMUP_BATCHES):
      next(batches)
  rates = collections.defaultdict(list)
  for repeat in range(rounds):
    for name in names if repeat % 2 == 0 else names[::-1]:
      cpu, rows = time.process_time(), 0
      while rows < examples:
        rows += len(next(pipelines[name])['encoder_input_tokens'])
      rates[name].append(rows / (time.process_time() - cpu))
  return rates


def child(names: list[str], setting: str, args, *flags: str) -> dict:
  """What a child process measuring pipelines `names` printed; it is held to this one's first
  core (sched_setaffinity, as taskset)."""
  core = sorted(os.sched_getaffinity(0))[:1]
  done = subprocess.run(
      [sys.executable, os.path.abspath(__file__), f'--child={",".join(names)}',
       f'--settings={setting}', f'--examples={args.examples}', *flags,
       *([f'--source={args.source}'] if args.source else [])],
      stdout=subprocess.PIPE, text=True, check=True,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'},
      preexec_fn=lambda: os.sched_setaffinity(0, core))
  return json.loads(done.stdout.splitlines()[-1])


def row_head(bench: str, setting: str, args) -> dict:
  return {'bench': bench, 'inputs_length': SETTINGS[setting], 'targets_length': SETTINGS[setting],
          'batch_size': 32, 'cores': 1, 'threads': 1, 'examples': args.examples}


def ul2_free_rates(alone: dict[str, list[float]]) -> list[float]:
  """free_rate of UL2 in each round (or run) k, from its denoisers' rates alone in that round
  (`alone['alone:NAME'][k]`)."""
  shares = ul2_rates()
  rounds = len(alone[f'alone:{next(iter(shares))}'])
  return [free_rate(shares, {name: alone[f'alone:{name}'][k] for name in shares})
          for k in range(rounds)]


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def in_process_row(names: list[str], setting: str, args) -> dict:
  """--in_process: one child measures every pipeline in turn; medians, and their ratios."""
  measured = child(names, setting, args, f'--repeats={args.repeats}', '--in_process')
  rates = measured['rates']
  row = {**row_head('mixture_in_process', setting, args), 'rounds': args.repeats,
         'examples_per_cpu_s': {name: round(statistics.median(values), 1)
                                for name, values in rates.items()},
         'ratio_to_single': {name: round(statistics.median(
             r / s for r, s in zip(rates[name], rates['single'])), 3) for name in names[1:]}}
  if any(name.startswith('alone:') for name in names):
    free = ul2_free_rates(rates)
    row['ul2_alone'] = round(statistics.median(free), 1)
    row['ul2_mixing_ratio'] = round(statistics.median(
        r / f for r, f in zip(rates['ul2'], free)), 3)
  return {**row, 'cpu': machine(), 'load_avg_1m': measured['load_avg_1m'], 'date': now()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--examples', type=int, default=8192, help='timed, per setting and run')
  parser.add_argument('--repeats', type=int, default=3, help='runs of each pipeline')
  parser.add_argument('--settings', default=','.join(SETTINGS), help='of ' + ','.join(SETTINGS))
  parser.add_argument('--source', help='the text every pipeline reads (default: the bundled '
                      'corpus, which each run tokenizes at start-up)')
  parser.add_argument('--alone', action='store_true', help="also each UL2 denoiser alone")
  parser.add_argument('--in_process', action='store_true',
                      help='every pipeline in one process, timed in turn (see above)')
  parser.add_argument('--child', help=argparse.SUPPRESS)  # a pipeline's name(s)
  args = parser.parse_args()
  settings = args.settings.split(',')
  pipelines = (PIPELINES + (('ul2_span',) if args.in_process else ())
               + (tuple(f'alone:{name}' for name in ul2_rates()) if args.alone else ()))
  if args.child and args.in_process:
    [setting] = settings
    rates = measure_in_turn(args.child.split(','), SETTINGS[setting], args.examples,
                            args.repeats, args.source)
    print(json.dumps({'load_avg_1m': os.getloadavg()[0], 'rates': rates}))
    return
  if args.in_process:
    for setting in settings:
      print(json.dumps(in_process_row(list(pipelines), setting, args)), flush=True)
    return
  if args.child:
    print(json.dumps({'load_avg_1m': os.getloadavg()[0], **{
        setting: measure(args.child, SETTINGS[setting], args.examples, args.source)
        for setting in settings}}))
    return
  runs = collections.defaultdict(list)
  for repeat in range(args.repeats):  # interleaved, each time in the other order
    for name in pipelines if repeat % 2 == 0 else pipelines[::-1]:
      for setting in settings:  # each in a process of its own
        runs[name].append(child([name], setting, args))
  date = now()
  loads = [r['load_avg_1m'] for name in pipelines for r in runs[name]]
  for setting in settings:
    row = {**row_head('mixture', setting, args), 'repeats': args.repeats}
    measured = {name: [r[setting] for r in runs[name] if setting in r] for name in pipelines}
    for name in pipelines:
      row[name] = {key: round(statistics.median(r[key] for r in measured[name]), 3)
                   for key in ('examples_per_cpu_s', 'examples_per_s', 'startup_s')}
    row['ratio_to_single'] = {
        name: round(statistics.median(
            r['examples_per_cpu_s'] / s['examples_per_cpu_s']
            for r, s in zip(measured[name], measured['single'])), 3) for name in PIPELINES[1:]}
    if args.alone:
      alone = ul2_free_rates({name: [r['examples_per_cpu_s'] for r in measured[name]]
                              for name in pipelines if name.startswith('alone:')})
      row['ul2_alone'] = {'examples_per_cpu_s': round(statistics.median(alone), 3),
                          **{name.removeprefix('alone:'): row.pop(name)['examples_per_cpu_s']
                             for name in pipelines if name.startswith('alone:')}}
      row['ul2_mixing_ratio'] = round(statistics.median(
          r['examples_per_cpu_s'] / a for r, a in zip(measured['ul2'], alone)), 3)
    row.update(cpu=machine(), load_avg_1m=[min(loads), max(loads)], date=date)
    print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
