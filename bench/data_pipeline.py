"""The span-corruption input pipeline beside T5's own (seqio + t5), in one run; prints JSON lines.

  .venv/bin/python bench/data_pipeline.py [--examples=6400] [--repeats=3] [--cores=1,2]

Each entry of PIPELINES turns (lengths and batch, tf.data threads) into an iterator of batches in
seqio's packed EncDecFeatureConverter format and its vocabulary size. Both read every document
of the bundled corpus and tokenize them once with the bundled SentencePiece model plus 100
sentinels, at t5_tiny's lengths (128/29, batch 32) and T5's (512/114, batch 128):
- t5lite: `t5lite.inputs.batches.make_batches`;
- seqio: T5's C4 span-corruption task as it trains from its cache: `t5.data.preprocessors.
  span_corruption`, `seqio.preprocessors.append_eos_after_trim`, `seqio.EncDecFeatureConverter(
  pack=True)`, `seqio.SentencePieceVocabulary(extra_ids=100)`. It runs in its own venv,
  `.bench/seqio`, made on first use (pip, from PyPI) with the pins of
  `bench/seqio_requirements.txt`.

Each measurement is a child process (this file with --child) held to the first N cores of the
machine, as `taskset` does, with N tf.data threads. Runs alternate between pipelines and core
counts, each repeat in the other order; each line has both pipelines' medians over --repeats runs
and the median ratio t5lite / seqio of the runs made side by side. Rates are counted after the
first batch (start-up is reported apart): examples and non-pad tokens (encoder + decoder) per
second, and examples per CPU-second of the process (all its threads), the steadier number on a
shared machine. Statistics of the examples measured (noise density, mean noise span length,
sentinels in order) show that both do the same work.
"""

import argparse
import collections
import datetime
import json
import lzma
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BUNDLED = os.path.join(ROOT, 't5lite', 'data', 'bundled')
REFERENCE_VENV = os.path.join(ROOT, '.bench', 'seqio')
REFERENCE_PINS = os.path.join(ROOT, 'bench', 'seqio_requirements.txt')
NUM_SENTINELS, EOS_ID, SEED = 100, 1, 0
SETTINGS = {'128': dict(inputs_length=128, targets_length=29, batch_size=32),
            '512': dict(inputs_length=512, targets_length=114, batch_size=128)}


def t5lite_batches(setting: dict, threads: int):
  from t5lite import config as config_lib  # pylint: disable=g-import-not-at-top; t5lite's venv
  from t5lite.inputs import batches as batches_lib
  from t5lite.data import vocabulary
  data = config_lib.base_config().data
  data.update(setting, threads=threads, seed=SEED)
  batches = batches_lib.make_batches(data, 'all', process_index=0, process_count=1)
  return batches, vocabulary.load_vocabulary(data.vocabulary).vocab_size


def seqio_batches(setting: dict, threads: int):
  """T5's c4_v220_span_corruption task after its cache step, on the bundled corpus."""
  import seqio  # pylint: disable=g-import-not-at-top; the .bench/seqio venv
  from t5.data import preprocessors as t5_preprocessors
  import tensorflow as tf
  vocab = seqio.SentencePieceVocabulary(os.path.join(BUNDLED, 'vocab.model'),
                                        extra_ids=NUM_SENTINELS)
  features = {'inputs': seqio.Feature(vocab, add_eos=True, required=False),
              'targets': seqio.Feature(vocab, add_eos=True)}
  # The task's pre-cache steps (tokenize), run once and kept in memory as t5lite does.
  with lzma.open(os.path.join(BUNDLED, 'corpus.jsonl.xz'), 'rt', encoding='utf-8') as f:
    texts = tf.data.Dataset.from_tensor_slices({'targets': [json.loads(line)['text']
                                                            for line in f]})
  tokens = [d['targets'] for d in seqio.preprocessors.tokenize(texts, features).as_numpy_iterator()]
  documents = tf.data.Dataset.from_tensor_slices({'targets': tf.RaggedTensor.from_row_lengths(
      np.concatenate(tokens), [len(t) for t in tokens])})

  def dataset_fn(split, shuffle_files, seed=None):
    del split
    return documents.shuffle(len(tokens), seed) if shuffle_files else documents

  task = seqio.Task(
      'bundled_span_corruption', seqio.FunctionDataSource(dataset_fn, splits=['train']),
      output_features=features,
      preprocessors=[t5_preprocessors.span_corruption, seqio.preprocessors.append_eos_after_trim])
  batches = seqio.get_dataset(
      task, {'inputs': setting['inputs_length'], 'targets': setting['targets_length']},
      seqio.EncDecFeatureConverter(pack=True), shuffle=True, num_epochs=None, seed=SEED,
      batch_size=setting['batch_size'])
  options = tf.data.Options()  # the threading t5lite's pipeline sets from data.threads
  options.threading.private_threadpool_size = threads
  options.threading.max_intra_op_parallelism = 1
  return batches.with_options(options).as_numpy_iterator(), vocab.vocab_size


PIPELINES = {'t5lite': t5lite_batches, 'seqio': seqio_batches}


def example_statistics(batches, vocab_size: int) -> dict:
  """Counts over the examples (segments) of packed batches that span corruption fixes.

  Each example's sentinels, in the inputs and in the targets alike, must be <extra_id_0>,
  <extra_id_1>, ... (vocab_size - 1, vocab_size - 2, ...) and both must end in EOS; the noise
  tokens are the targets' other tokens, the raw tokens those plus the inputs' other tokens.
  """
  count = collections.Counter()
  for batch in batches:
    for row in range(len(batch['encoder_segment_ids'])):
      inputs_segments = batch['encoder_segment_ids'][row]
      targets_segments = batch['decoder_segment_ids'][row]
      for segment in range(1, inputs_segments.max() + 1):
        inputs = batch['encoder_input_tokens'][row][inputs_segments == segment]
        targets = batch['decoder_target_tokens'][row][targets_segments == segment]
        inputs_sentinels = inputs[inputs >= vocab_size - NUM_SENTINELS]
        targets_sentinels = targets[targets >= vocab_size - NUM_SENTINELS]
        in_order = vocab_size - 1 - np.arange(len(targets_sentinels))
        noise = len(targets) - len(targets_sentinels) - 1
        count.update(
            examples=1, inputs=len(inputs), targets=len(targets), noise=noise,
            spans=len(targets_sentinels), raw=len(inputs) - len(inputs_sentinels) - 1 + noise,
            well_formed=int(np.array_equal(inputs_sentinels, in_order)
                            and np.array_equal(targets_sentinels, in_order)
                            and inputs[-1] == targets[-1] == EOS_ID))
  rows = sum(len(batch['encoder_segment_ids']) for batch in batches)
  return {'examples': count['examples'], 'examples_per_row': count['examples'] / rows,
          'inputs_per_example': count['inputs'] / count['examples'],
          'targets_per_example': count['targets'] / count['examples'],
          'noise_density': count['noise'] / count['raw'],
          'mean_noise_span_length': count['noise'] / count['spans'],
          'well_formed': count['well_formed'] / count['examples']}


def measure(make_batches, setting: dict, threads: int, examples: int) -> dict:
  """Rates of one pipeline at one setting after its first batch, and its example statistics."""
  tic = time.perf_counter()
  batches, vocab_size = make_batches(setting, threads)
  next(batches)
  startup = time.perf_counter() - tic
  num_batches = max(1, examples // setting['batch_size'])
  tic, cpu = time.perf_counter(), time.process_time()
  timed = [next(batches) for _ in range(num_batches)]
  seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
  tokens, slots = np.sum([[np.count_nonzero(b[k]), b[k].size] for b in timed
                          for k in ('encoder_segment_ids', 'decoder_segment_ids')], axis=0)
  stats = example_statistics(timed, vocab_size)
  return {'examples_per_s': stats['examples'] / seconds, 'tokens_per_s': tokens / seconds,
          'examples_per_cpu_s': stats['examples'] / cpu_seconds, 'startup_s': startup,
          'packing_efficiency': tokens / slots, **stats}


def child(name: str, cores: int, examples: int) -> dict:
  """One run of one pipeline on `cores` cores (this process is held to them): both settings."""
  load = os.getloadavg()[0]
  return {'load_avg_1m': load, **{lengths: measure(PIPELINES[name], setting, cores, examples)
                                  for lengths, setting in SETTINGS.items()}}


def reference_python() -> str:
  """The python of `.bench/seqio`, made (again, if the pins changed) with pip on first use."""
  python = os.path.join(REFERENCE_VENV, 'bin', 'python')
  installed = os.path.join(REFERENCE_VENV, 'installed-pins.txt')
  with open(REFERENCE_PINS, encoding='utf-8') as f:
    pins = f.read()
  if os.path.exists(installed):
    with open(installed, encoding='utf-8') as f:
      if f.read() == pins:
        return python
  print(f'bench: making {os.path.relpath(REFERENCE_VENV, ROOT)} for the seqio/t5 reference '
        '(pip from PyPI, a few minutes)', file=sys.stderr, flush=True)
  subprocess.run([sys.executable, '-m', 'venv', '--clear', REFERENCE_VENV], check=True)
  subprocess.run([python, '-m', 'pip', 'install', '--quiet', '--no-deps', '-r', REFERENCE_PINS],
                 check=True)
  with open(installed, 'w', encoding='utf-8') as f:
    f.write(pins)
  return python


def run(python: str, name: str, cores: int, examples: int) -> dict:
  """A child process on the first `cores` cores of this one (sched_setaffinity, as taskset)."""
  cpus = sorted(os.sched_getaffinity(0))[:cores]
  done = subprocess.run(
      [python, os.path.abspath(__file__), f'--child={name}', f'--cores={cores}',
       f'--examples={examples}'],
      stdout=subprocess.PIPE, text=True, check=True,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'},
      preexec_fn=lambda: os.sched_setaffinity(0, cpus))
  return json.loads(done.stdout.splitlines()[-1])


def summary(runs: list[dict]) -> dict:
  """Medians over runs of every number, and the runs' tokens/s."""
  row = {key: round(statistics.median(run[key] for run in runs), 4) for key in runs[0]}
  row['tokens_per_s_runs'] = [round(run['tokens_per_s']) for run in runs]
  return row


def ratios(ours: list[dict], theirs: list[dict]) -> dict:
  """Median over repeats of t5lite's rate / seqio's in the same repeat (next to each other)."""
  return {key: round(statistics.median(a[key] / b[key] for a, b in zip(ours, theirs)), 3)
          for key in ('examples_per_s', 'tokens_per_s', 'examples_per_cpu_s')}


def machine() -> str:
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    cpu = re.search(r'model name\s*:\s*(.*)', f.read())
  return cpu.group(1).strip() if cpu else 'unknown CPU'


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--examples', type=int, default=6400, help='timed, per setting and run')
  parser.add_argument('--repeats', type=int, default=3, help='runs of each pipeline and cores')
  parser.add_argument('--cores', default='1,2', help='core counts to measure on')
  parser.add_argument('--pipelines', default=','.join(PIPELINES), help='of ' + ','.join(PIPELINES))
  parser.add_argument('--child', choices=PIPELINES, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(args.child, int(args.cores), args.examples)))
    return
  names = args.pipelines.split(',')
  pythons = {name: reference_python() if name == 'seqio' else sys.executable for name in names}
  core_counts = [int(c) for c in args.cores.split(',') if int(c) <= len(os.sched_getaffinity(0))]
  runs = collections.defaultdict(list)
  for repeat in range(args.repeats):  # interleaved, each time in the other order
    for cores in core_counts:
      for name in names if repeat % 2 == 0 else names[::-1]:
        runs[name, cores].append(run(pythons[name], name, cores, args.examples))
  date = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
  for cores in core_counts:
    for lengths, setting in SETTINGS.items():
      row = {'bench': 'data_pipeline', 'cores': cores, 'threads': cores, **setting,
             'examples': args.examples, 'repeats': args.repeats}
      for name in names:
        row[name] = summary([r[lengths] for r in runs[name, cores]])
      if 't5lite' in row and 'seqio' in row:
        row['ratio'] = ratios([r[lengths] for r in runs['t5lite', cores]],
                              [r[lengths] for r in runs['seqio', cores]])
      loads = [r['load_avg_1m'] for name in names for r in runs[name, cores]]
      row.update(cpu=machine(), load_avg_1m=[min(loads), max(loads)], date=date)
      print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
