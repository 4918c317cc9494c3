"""Encoder forward and backward of a preset's model from 2,048 to 8,192 input tokens: LongT5's
local and transient-global encoders and T5's dense one, side by side in one process.

The model is the preset's (long_t5_tiny: 128 wide, 2 encoder layers, radius 127, global blocks
of 16) with `model.encoder_attention` set to each of the three; one step is the gradient of a
random projection of the encoder's output with respect to every parameter, jitted. Every
(attention, length) is compiled first, then timed in turns, `--repeats` times each, so that the
machine's load falls on all alike; a line per attention gives the median milliseconds at each
length and the growth from the first length to the last. Targets (issue #55): local <= 5x,
transient-global <= 6x from 2,048 to 8,192 tokens; dense attention grows about 16x. Dense runs up
to --dense_max_length (4,096): at 8,192 its step needs 17 GiB of XLA:CPU temporaries (scores,
bias and probabilities of (heads, l, l) per layer), against 0.6 GiB local and 1.0 GiB TGlobal.

  python bench/long_attention.py
  python bench/long_attention.py --lengths=1024,4096 --repeats=3
"""

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from flax import nnx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from t5lite import config as config_lib  # noqa: E402
from t5lite.models import Features, build  # noqa: E402

ATTENTIONS = ('local', 'transient_global', 'dense')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='long_t5_tiny', help='a preset in configs/')
  parser.add_argument('--lengths', default='2048,4096,8192', help='comma-separated input lengths')
  parser.add_argument('--batch_size', type=int, default=1)
  parser.add_argument('--repeats', type=int, default=5, help='timed runs of each, in turns')
  parser.add_argument('--dense_max_length', type=int, default=4096,
                      help="the longest input dense attention runs at (its memory is l^2's)")
  return parser.parse_args(argv)


def encoder_step(model_name: str, attention: str, batch_size: int, length: int):
  """A jitted encoder forward and backward of the preset's model with `attention`, and its
  arguments: () -> gradients, blocked on."""
  config = config_lib.load(os.path.join(ROOT, 'configs', f'{model_name}.py'))
  config.model.update(encoder_attention=attention, attention='xla')
  model = build(config_lib.model_config(config), nnx.Rngs(0))
  key = jax.random.key(1)
  tokens = jax.random.randint(key, (batch_size, length), 2, config.model.vocab_size)
  weights = jax.random.normal(key, (batch_size, length, config.model.d_model))

  @nnx.jit
  def step(model, tokens, weights):
    def loss(model):
      return jnp.sum(model.encode(Features(tokens)).astype(jnp.float32) * weights)
    return nnx.grad(loss)(model)

  return lambda: jax.block_until_ready(step(model, tokens, weights))


def main(argv=None) -> None:
  args = parse_args(argv)
  lengths = [int(n) for n in args.lengths.split(',')]
  lengths_of = {attention: [n for n in lengths
                            if attention != 'dense' or n <= args.dense_max_length]
                for attention in ATTENTIONS}
  steps = {(attention, length): encoder_step(args.model, attention, args.batch_size, length)
           for attention in ATTENTIONS for length in lengths_of[attention]}
  for step in steps.values():
    step()  # compile
  times = {key: [] for key in steps}
  for _ in range(args.repeats):
    for key, step in steps.items():
      start = time.perf_counter()
      step()
      times[key].append(time.perf_counter() - start)
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    cpu = re.search(r'model name\s*:\s*(.*)', f.read())
  context = dict(cpu=cpu.group(1).strip() if cpu else '', cores=len(os.sched_getaffinity(0)),
                 jax=jax.__version__, load_avg_1m=round(os.getloadavg()[0], 1),
                 date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'))
  for attention in ATTENTIONS:
    own = lengths_of[attention]
    ms = {length: 1000 * statistics.median(times[attention, length]) for length in own}
    line = {'bench': 'long_attention', 'model': args.model, 'attention': attention,
            'batch_size': args.batch_size, 'repeats': args.repeats,
            **{f'fwd_bwd_ms_{length}': round(ms[length], 1) for length in own},
            f'growth_ratio_{own[0]}_to_{own[-1]}': round(ms[own[-1]] / ms[own[0]], 2),
            **context}
    print(json.dumps(line), flush=True)


if __name__ == '__main__':
  main()
