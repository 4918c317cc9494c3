"""Train-step memory with the cross entropy in `train.loss_chunks` chunks against all at once.

XLA compiles the real train step of a preset for one CPU device from shapes alone, as
`t5lite plan --topology=cpu:1` does (nothing is allocated or run), once per chunk count, and
reads its temporary bytes (activations, gradients, logits: everything but the state and the
batch). The defaults are GPT-2 small at 16 x 1024 with full remat and scanned layers, a step
whose peak is the float32 logits (16, 1024, 50304): 3.1 GiB, and their gradient as much. T5 v1.1
base at its pretraining batch peaks in the encoder instead (and takes minutes to compile on CPU):

  python bench/loss_chunks.py
  python bench/loss_chunks.py --model=t5_1_1_base --batch_size=128 --inputs_length=512 \
      --targets_length=114 --remat_policy=none --no-scan_layers
"""

import argparse
import datetime
import json
import os
import re
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from t5lite import config as config_lib  # noqa: E402
from t5lite.commands import plan  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='gpt2_small', help='a preset in configs/')
  parser.add_argument('--chunks', default='0,8', help='comma-separated train.loss_chunks')
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--inputs_length', type=int, default=0)
  parser.add_argument('--targets_length', type=int, default=1024)
  parser.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
  parser.add_argument('--remat_policy', choices=('none', 'full', 'save_dots'), default='full')
  parser.add_argument('--scan_layers', action=argparse.BooleanOptionalAction, default=True)
  return parser.parse_args(argv)


def temp_bytes(args, chunks: int) -> tuple[int, float]:
  """(XLA's temporary bytes, compile seconds) of the preset's train step with `chunks`."""
  config = config_lib.load(os.path.join(ROOT, 'configs', f'{args.model}.py'))
  config.model.update(dtype=args.dtype, remat_policy=args.remat_policy,
                      scan_layers=args.scan_layers)
  config.data.update(batch_size=args.batch_size, inputs_length=args.inputs_length,
                     targets_length=args.targets_length)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  config.train.loss_chunks = chunks
  start = time.perf_counter()
  compiled = plan.plan(config, 'cpu:1')['compiled']
  return compiled['temp'], time.perf_counter() - start


def main(argv=None) -> None:
  args = parse_args(argv)
  row = {'bench': 'loss_chunks', 'model': args.model, 'batch_size': args.batch_size,
         'inputs_length': args.inputs_length, 'targets_length': args.targets_length,
         'dtype': args.dtype, 'remat_policy': args.remat_policy, 'scan_layers': args.scan_layers,
         'compiled_for': 'cpu:1'}
  for chunks in map(int, args.chunks.split(',')):
    temp, seconds = temp_bytes(args, chunks)
    row[f'temp_mib_chunks_{chunks}'] = round(temp / 2**20, 1)
    row[f'compile_s_chunks_{chunks}'] = round(seconds, 1)
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    cpu = re.search(r'model name\s*:\s*(.*)', f.read())
  row.update(cpu=cpu.group(1).strip() if cpu else '', cores=len(os.sched_getaffinity(0)),
             jax=jax.__version__,
             date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'))
  print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
