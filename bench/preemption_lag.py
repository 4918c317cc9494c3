"""How late a run acts on a stop notice: `t5lite train` in this process, sent SIGTERM from a
thread once the device has computed step --after_step's loss; one JSON line.

  .venv/bin/python bench/preemption_lag.py          # both loops below on SMALL, on one CPU device
  .venv/bin/python bench/preemption_lag.py --after_step=20 [--host_runs_ahead] -- \
      --workdir=/tmp/lag --config=configs/t5_1_1_base.py --config.data.source=synthetic \
      --config.train.steps=200 --config.train.log_every=100 --config.checkpoint.every_steps=200

The line gives the step saved (the one the loop acted at), how many steps the host had dispatched,
the seconds from the signal to the end of `train`, the exit status and the last logged row's
seconds a step. --after_step=0 sends nothing: the loop's speed alone. --host_runs_ahead replays
the loop as it was before it waited for each step's predecessor (jax.block_until_ready made a
no-op in t5lite/train/loop.py): the host then runs ahead to the next log line, and so does the
stop. tests/bench/test_preemption_lag.py runs it on CPU.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # t5lite

from t5lite import cli  # noqa: E402
from t5lite.train import loop  # noqa: E402
from t5lite.train import preemption  # noqa: E402

# t5_tiny at width 64, 1+1 layers, batch 32 of 64/16 tokens: on XLA:CPU a step is long enough
# beside its dispatch for a host that does not wait to run ahead; 60 steps, one log line and save.
SMALL = ['--config=' + os.path.join(ROOT, 'configs', 't5_tiny.py'), '--config.model.d_model=64',
         '--config.model.d_ff=128', '--config.model.num_heads=2', '--config.model.d_kv=32',
         '--config.model.num_encoder_layers=1', '--config.model.num_decoder_layers=1',
         '--config.data.source=synthetic', '--config.data.batch_size=32',
         '--config.data.inputs_length=64', '--config.data.targets_length=16',
         '--config.train.eval_every=0', '--config.train.steps=60', '--config.train.log_every=60',
         '--config.checkpoint.every_steps=60']


def both_loops_on_small() -> None:
  """Each loop in a process of its own (one patches the loop), on one CPU device."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=1')
  for variant in ([], ['--host_runs_ahead']):
    with tempfile.TemporaryDirectory() as folder:
      subprocess.run([sys.executable, os.path.abspath(__file__), '--after_step=3', *variant, '--',
                      f'--workdir={folder}/run', *SMALL], env=env, check=False)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--after_step', type=int, default=3)
  parser.add_argument('--host_runs_ahead', action='store_true')
  parser.add_argument('train_flags', nargs=argparse.REMAINDER)
  args = parser.parse_args()
  flags = [flag for flag in args.train_flags if flag != '--']
  if not flags:
    both_loops_on_small()
    return
  workdir = next(flag.split('=', 1)[1] for flag in flags if flag.startswith('--workdir='))

  losses, signalled = [], []
  compiled_train_step = loop.compiled_train_step

  def recorded(*step_args):
    step_fn, speed = compiled_train_step(*step_args)

    def step(state, batch):
      state, metrics = step_fn(state, batch)
      losses.append(metrics['loss'])
      return state, metrics
    return step, speed

  def notice():
    while len(losses) < args.after_step:
      time.sleep(0.001)
    losses[args.after_step - 1].block_until_ready()
    signalled.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGTERM)

  loop.compiled_train_step = recorded
  if args.host_runs_ahead:
    loop.jax = types.SimpleNamespace(**{**vars(loop.jax), 'block_until_ready': lambda x: x})
  if args.after_step:
    threading.Thread(target=notice, daemon=True).start()
  with contextlib.redirect_stdout(sys.stderr):  # train's config and log lines: stdout is JSON
    status = cli.main(['train', *flags])
  ended = time.perf_counter()
  if status not in (0, preemption.EXIT_STOPPED_EARLY):
    sys.exit(status)  # train said why, in one line
  folder = os.path.join(workdir, 'checkpoints')
  saved = sorted(int(name) for name in os.listdir(folder) if name.isdigit())
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    logged = [row for row in map(json.loads, f) if 'loss' in row]
  print(json.dumps({
      'bench': 'preemption_lag', 'after_step': args.after_step,
      'host_runs_ahead': args.host_runs_ahead, 'exit': status,
      'saved_step': saved[-1] if saved else None, 'dispatched': len(losses),
      'seconds_signal_to_end': round(ended - signalled[0], 3) if signalled else None,
      'logged_step': logged[-1]['step'], 'step_seconds': logged[-1]['step_seconds'],
      'device': str(loop.jax.devices()[0].device_kind),
      'units': {'saved_step': 'step', 'dispatched': 'steps', 'logged_step': 'step'}}), flush=True)
  sys.exit(status)


if __name__ == '__main__':
  main()
