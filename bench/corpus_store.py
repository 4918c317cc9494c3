"""Token stores at scale, side by side in one run; prints JSON lines.

  .venv/bin/python bench/corpus_store.py [--gigabytes=1] [--repeats=3] [--baseline_tree=DIR]

It writes a corpus of --gigabytes of JSONL in 16 files under a temporary folder (documents of
paragraphs drawn at random from the bundled corpus, so that the text tokenizes like real prose),
measures, and removes it all. Each measurement is a child process:

- prepare: `t5lite prepare` of the whole corpus on every core, in tokens per second per core
  from the command's start once its imports are done (and with them, `ratio_with_start_up`),
  against SentencePiece's own multithreaded encode of the same documents on as many threads
  (timing the encode calls only: the physical limit of tokenizing here).
- reads: training batches at 512/114 (span corruption, batch 128) in examples per CPU-second of
  the process (all its threads), from a store of the bundled corpus, from the bundled corpus in
  memory and from the big store; and windows of 568 tokens alone, read at random places of the
  big store, per CPU-second. With --baseline_tree (a checkout of an earlier t5lite), that tree
  reads the bundled corpus in memory, and prepares the big corpus into a store of its own format
  and reads it (before 2026-11-28: no checksums to verify), side by side.
- start: `t5lite data --num_batches=1` from the big store and from a 10 MB one: wall time to the
  batch written and peak resident memory (the median of --repeats runs each, alternating).
"""

import argparse
import contextlib
import datetime
import importlib
import json
import lzma
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED_CORPUS = os.path.join(ROOT, 't5lite', 'data', 'bundled', 'corpus.jsonl.xz')
FILES = 16
READS = dict(inputs_length=512, targets_length=114, batch_size=128)


def machine() -> dict:
  return {'cores': os.cpu_count(), 'load_average': round(os.getloadavg()[0], 2),
          'date': datetime.date.today().isoformat()}


def write_corpus(folder: str, gigabytes: float, files: int = FILES, seed: int = 0) -> list[str]:
  """`files` JSONL files of documents of 3 to 30 random paragraphs of the bundled corpus."""
  with lzma.open(BUNDLED_CORPUS, 'rt', encoding='utf-8') as f:
    paragraphs = [p for line in f for p in json.loads(line)['text'].split('\n\n') if p.strip()]
  rng = np.random.default_rng(seed)
  per_file = gigabytes * 1e9 / files
  names = []
  for i in range(files):
    name = os.path.join(folder, f'corpus-{i:02d}.jsonl')
    written = 0
    with open(name, 'w', encoding='utf-8') as f:
      while written < per_file:
        picks = rng.integers(0, len(paragraphs), rng.integers(3, 31))
        line = json.dumps({'text': '\n\n'.join(paragraphs[p] for p in picks)}) + '\n'
        f.write(line)
        written += len(line)
    names.append(name)
  return names


def child(command: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess,
                                                                  float, float]:
  """(the finished process, wall seconds, its peak resident memory in MiB)."""
  start = time.perf_counter()
  process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  _, status, usage = os.wait4(process.pid, 0)
  wall = time.perf_counter() - start
  stdout, stderr = process.stdout.read(), process.stderr.read()
  process.returncode = os.waitstatus_to_exitcode(status)
  if process.returncode:
    raise SystemExit(f'{" ".join(command)} failed ({process.returncode}):\n{stderr[-3000:]}')
  return subprocess.CompletedProcess(command, 0, stdout, stderr), wall, usage.ru_maxrss / 1024


def t5lite(*args) -> list[str]:
  return [sys.executable, '-m', 't5lite', *args]


def prepare(source: str, out: str, tree: str = ROOT, vocabulary: str = 'bundled'
            ) -> tuple[int, float, float]:
  """(tokens, wall seconds of `t5lite prepare` on every core, seconds of its work after the
  imports): the command, of the t5lite in `tree`, runs in a child that times the call."""
  done, wall, _ = child([sys.executable, __file__, '--child=prepare', f'--source={source}',
                         f'--out={out}', f'--vocabulary={vocabulary}'],
                        dict(os.environ, PYTHONPATH=tree))
  with open(os.path.join(out, 'part-00000-of-00001.json'), encoding='utf-8') as f:
    return sum(json.load(f)['tokens'].values()), wall, json.loads(done.stdout)['seconds']


def prepare_child(source: str, out: str, vocabulary: str) -> None:
  from t5lite import cli  # pylint: disable=import-outside-toplevel
  importlib.import_module('t5lite.commands.prepare')  # and TensorFlow, before the clock starts
  start = time.perf_counter()
  with contextlib.redirect_stdout(sys.stderr):
    status = cli.main(['prepare', f'--source={source}', f'--out={out}',
                       f'--vocabulary={vocabulary}'])
  print(json.dumps({'seconds': time.perf_counter() - start}))
  sys.exit(status)


def sentencepiece_encode(names: list[str]) -> tuple[int, float]:
  """(tokens, seconds inside SentencePiece's encode) of the files' documents, on every core."""
  done, _, _ = child([sys.executable, __file__, '--child=encode', *names])
  row = json.loads(done.stdout)
  return row['tokens'], row['seconds']


def encode_child(names: list[str]) -> None:
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  sp = spm.SentencePieceProcessor(
      model_file=os.path.join(ROOT, 't5lite', 'data', 'bundled', 'vocab.model'))
  tokens, seconds = 0, 0.0
  for name in names:
    with open(name, encoding='utf-8') as f:
      while texts := [json.loads(line)['text'] for _, line in zip(range(512), f)]:
        start = time.perf_counter()
        encoded = sp.encode(texts, num_threads=os.cpu_count())
        seconds += time.perf_counter() - start
        tokens += sum(map(len, encoded))
  print(json.dumps({'tokens': tokens, 'seconds': seconds}))


def reads(source: str, batches: int, tree: str = ROOT) -> float:
  """Examples per CPU-second of training batches from `source`, by the t5lite in `tree`."""
  env = dict(os.environ, PYTHONPATH=tree)
  done, _, _ = child([sys.executable, __file__, '--child=reads', f'--source={source}',
                      f'--batches={batches}'], env)
  return json.loads(done.stdout)['examples_per_cpu_s']


def reads_child(source: str, num_batches: int) -> None:
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel
  from t5lite.inputs import batches as batches_lib  # pylint: disable=import-outside-toplevel
  data = config_lib.base_config().data
  data.update(READS, source=source)
  batches = batches_lib.make_batches(data, 'train', process_index=0, process_count=1)
  for _ in range(2):  # the first batches fill tf.data's buffers
    next(batches)
  before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
  for _ in range(num_batches):
    next(batches)
  after = resource.getrusage(resource.RUSAGE_SELF)
  cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
  print(json.dumps({'examples_per_cpu_s': num_batches * data.batch_size / cpu,
                    'wall_s': time.perf_counter() - start}))


def window_reads(store: str, tree: str = ROOT) -> float:
  """Windows of 568 tokens (512/114's raw length) read per CPU-second from `store`, at random
  places, by the t5lite in `tree`: the reads alone, without the pipeline around them."""
  done, _, _ = child([sys.executable, __file__, '--child=windows', f'--source={store}'],
                     dict(os.environ, PYTHONPATH=tree))
  return json.loads(done.stdout)['windows_per_cpu_s']


def windows_child(source: str, calls: int = 200, per_call: int = 512) -> None:
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel
  from t5lite.data import store  # pylint: disable=import-outside-toplevel
  data = config_lib.base_config().data
  data.source = source
  tokens = store.split_tokens(data, 'train')
  begins = np.random.default_rng(0).integers(0, tokens.size - 568, (calls, per_call))
  before = resource.getrusage(resource.RUSAGE_SELF)
  for places in begins:
    tokens.windows(places, 568)
  after = resource.getrusage(resource.RUSAGE_SELF)
  cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
  print(json.dumps({'windows_per_cpu_s': begins.size / cpu}))


def start_up(store: str, scratch: str) -> tuple[float, float]:
  """(wall seconds, peak MiB) of `t5lite data --num_batches=1` from `store`."""
  out = os.path.join(scratch, 'batch.npz')
  _, wall, peak = child(t5lite('data', f'--config={ROOT}/configs/t5_tiny.py', '--num_batches=1',
                               f'--out={out}', '--overwrite', f'--config.data.source={store}'))
  return wall, peak


def main() -> None:
  flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  flags.add_argument('--gigabytes', type=float, default=1.0, help='size of the generated corpus')
  flags.add_argument('--repeats', type=int, default=3, help='runs of each start-up measurement')
  flags.add_argument('--read_batches', type=int, default=20, help='batches timed per read run')
  flags.add_argument('--baseline_tree', help='an earlier t5lite checkout: it reads the bundled '
                     'corpus in memory, and prepares and reads the big store its own way')
  flags.add_argument('--parts', default='prepare,reads,start',
                     help='which measurements, comma-separated (the big store is always made)')
  flags.add_argument('--child', choices=('encode', 'reads', 'prepare', 'windows'),
                     help=argparse.SUPPRESS)
  flags.add_argument('--source', help=argparse.SUPPRESS)
  flags.add_argument('--out', help=argparse.SUPPRESS)
  flags.add_argument('--vocabulary', default='bundled', help=argparse.SUPPRESS)
  flags.add_argument('--batches', type=int, help=argparse.SUPPRESS)
  args, names = flags.parse_known_args()
  if args.child == 'encode':
    return encode_child(names)
  if args.child == 'reads':
    return reads_child(args.source, args.batches)
  if args.child == 'prepare':
    return prepare_child(args.source, args.out, args.vocabulary)
  if args.child == 'windows':
    return windows_child(args.source)

  scratch = tempfile.mkdtemp(prefix='t5lite-corpus-store-')
  try:
    text = os.path.join(scratch, 'text')
    os.mkdir(text)
    names = write_corpus(text, args.gigabytes)
    text_bytes = sum(os.path.getsize(n) for n in names)
    big = os.path.join(scratch, 'big')
    tokens, wall, work = prepare(os.path.join(text, '*.jsonl'), big)
    parts = args.parts.split(',')
    if 'prepare' in parts:
      print_prepare(names, text_bytes, tokens, wall, work)
    if 'reads' in parts:
      print_reads(big, scratch, args)
    if 'start' in parts:
      print_start(big, scratch, args)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def print_prepare(names, text_bytes: int, tokens: int, wall: float, work: float) -> None:
  encoded, encode_s = sentencepiece_encode(names)
  assert encoded == tokens, (encoded, tokens)  # the same documents, the same tokens
  cores = os.cpu_count()
  print(json.dumps({
      'bench': 'corpus_store/prepare', 'text_bytes': text_bytes, 'tokens': tokens,
      'prepare_s': round(wall, 1), 'prepare_after_imports_s': round(work, 1),
      'sentencepiece_encode_s': round(encode_s, 1),
      'prepare_tokens_per_s_per_core': round(tokens / work / cores),
      'sentencepiece_tokens_per_s_per_core': round(tokens / encode_s / cores),
      'ratio': round(encode_s / work, 3), 'ratio_with_start_up': round(encode_s / wall, 3),
      **machine()}), flush=True)


def print_reads(big: str, scratch: str, args) -> None:
  bundled = os.path.join(scratch, 'bundled')
  prepare('bundled', bundled)
  sources = {'bundled_store': (bundled, ROOT), 'bundled_in_memory': ('bundled', ROOT),
             'big_store': (big, ROOT)}
  if args.baseline_tree:
    baseline = os.path.abspath(args.baseline_tree)
    big_baseline = os.path.join(scratch, 'big_baseline')  # the same tokens, in its format
    prepare(os.path.join(scratch, 'text', '*.jsonl'), big_baseline, baseline)
    sources.update(bundled_in_memory_baseline=('bundled', baseline),
                   big_store_baseline=(big_baseline, baseline))
  rates = {name: [] for name in sources}
  windows = {name: [] for name in sources if name.startswith('big_store')}
  for repeat in range(args.repeats):
    for name in (sources if repeat % 2 == 0 else reversed(sources)):
      rates[name].append(reads(sources[name][0], args.read_batches, sources[name][1]))
      if name in windows:
        windows[name].append(window_reads(*sources[name]))
  medians = {name: round(statistics.median(r), 1) for name, r in rates.items()}
  window_medians = {name: round(statistics.median(r)) for name, r in windows.items()}
  print(json.dumps({
      'bench': 'corpus_store/reads', 'setting': READS, 'examples_per_cpu_s': medians,
      'windows_per_cpu_s': window_medians,
      'store_vs_in_memory': round(medians['bundled_store'] / medians['bundled_in_memory'], 3),
      **({'store_vs_baseline_in_memory': round(
          medians['bundled_store'] / medians['bundled_in_memory_baseline'], 3),
          'big_store_vs_baseline': round(medians['big_store'] / medians['big_store_baseline'], 3),
          'big_store_windows_vs_baseline': round(
              window_medians['big_store'] / window_medians['big_store_baseline'], 3)}
         if args.baseline_tree else {}),
      'runs': args.repeats, **machine()}), flush=True)


def print_start(big: str, scratch: str, args) -> None:
  small, small_text = os.path.join(scratch, 'small'), os.path.join(scratch, 'small_text')
  os.mkdir(small_text)
  prepare(write_corpus(small_text, 0.01, files=1, seed=1)[0], small)
  runs = {'big': [], 'small': []}
  for repeat in range(args.repeats):
    for name in ('big', 'small') if repeat % 2 == 0 else ('small', 'big'):
      runs[name].append(start_up(big if name == 'big' else small, scratch))
  wall = {name: statistics.median(w for w, _ in r) for name, r in runs.items()}
  peak = {name: statistics.median(p for _, p in r) for name, r in runs.items()}
  print(json.dumps({
      'bench': 'corpus_store/start', 'store_bytes': {
          name: sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
          for name, path in (('big', big), ('small', small))},
      'first_batch_s': {k: round(v, 2) for k, v in wall.items()},
      'peak_rss_mib': {k: round(v) for k, v in peak.items()},
      'first_batch_s_difference': round(wall['big'] - wall['small'], 2),
      'peak_rss_ratio': round(peak['big'] / peak['small'], 3), 'runs': args.repeats,
      **machine()}), flush=True)


if __name__ == '__main__':
  main()
