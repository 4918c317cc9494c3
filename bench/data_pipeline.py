"""Throughput of the span-corruption input pipeline on the bundled corpus; prints one JSON line.

  .venv/bin/python bench/data_pipeline.py [--examples=6400] [--threads=0]

Measures the full pipeline (tokenized corpus -> chunks -> span corruption -> rows -> model
features, as the train step receives them) at t5_tiny's lengths (128/29, batch 32) and T5's
(512/114, batch 128), after the first batch (start-up, reported apart). tokens/s counts the
non-pad encoder and decoder tokens delivered; examples per CPU-second (all of the process's
threads) is the number to compare on a shared machine. Each pipeline to compare is one entry of
PIPELINES, a function (data config, number of batches) -> iterator of batches in the
EncDecFeatureConverter format; a seqio/t5 reference goes there.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from t5lite import config as config_lib  # pylint: disable=g-import-not-at-top
from t5lite.data import packing
from t5lite.data import pipeline

SETTINGS = {'128': dict(inputs_length=128, targets_length=29, batch_size=32),
            '512': dict(inputs_length=512, targets_length=114, batch_size=128)}


def t5lite_batches(data, num_batches: int):
  del num_batches  # the pipeline is endless
  return pipeline.make_pipeline(data, 'train', process_index=0, process_count=1)


PIPELINES = {'t5lite': t5lite_batches}


def measure(make_batches, data, num_batches: int) -> dict:
  tic = time.perf_counter()
  batches = make_batches(data, num_batches + 1)
  first = next(batches)
  startup = time.perf_counter() - tic
  tic, cpu = time.perf_counter(), time.process_time()
  timed = [next(batches) for _ in range(num_batches)]
  seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
  efficiency = packing.packing_efficiency([first] + timed)
  tokens = sum(int((b['encoder_segment_ids'] > 0).sum() + (b['decoder_segment_ids'] > 0).sum())
               for b in timed)
  return {'examples_per_s': round(num_batches * data.batch_size / seconds, 1),
          'tokens_per_s': round(tokens / seconds),
          'examples_per_cpu_s': round(num_batches * data.batch_size / cpu_seconds, 1),
          'startup_s': round(startup, 2),
          'packing_efficiency': {k: round(v, 4) for k, v in efficiency.items()}}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--examples', type=int, default=6400, help='timed, per setting')
  parser.add_argument('--threads', type=int, default=0, help='tf.data threads; 0: all cores')
  args = parser.parse_args()
  threads = args.threads or os.cpu_count()
  result = {'benchmark': 'data_pipeline', 'source': 'bundled', 'cpus': os.cpu_count(),
            'threads': threads, 'examples': args.examples}
  for name, make_batches in PIPELINES.items():
    for lengths, setting in SETTINGS.items():
      data = config_lib.base_config().data
      data.update(setting, threads=threads)
      num_batches = max(1, args.examples // data.batch_size)
      result[f'{name}_{lengths}'] = measure(make_batches, data, num_batches)
  print(json.dumps(result))


if __name__ == '__main__':
  main()
