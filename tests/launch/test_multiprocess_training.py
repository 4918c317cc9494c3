"""Two JAX processes of two devices each, real `t5lite train` processes through launch/local.py:
SIGTERM to one stops both after the same step, saved once; the run resumes bitwise in two
processes, and its checkpoint in one process of four devices, which trains as the two do.
Synthetic batches: what is tested is the stop and the checkpoint, and a process that reads no
text never imports TensorFlow (the text pipeline's shares of a batch on any process count are
tests/inputs/test_pipeline.py's).

The runs share a persistent compilation cache, so each run after the first skips most of the
compile.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from launch.local import launch_local
from t5lite.train import preemption

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ['--config=' + os.path.join(ROOT, 'configs', 't5_tiny.py'),
         '--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
         '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
         '--config.model.num_decoder_layers=1', '--config.data.batch_size=8',
         '--config.data.inputs_length=32', '--config.data.targets_length=8',
         '--config.train.log_every=1', '--config.train.eval_every=0',
         '--config.checkpoint.every_steps=3', '--config.data.source=synthetic']
STEPS = 40  # JAX's service polls for SIGTERM once a second: steps to spare after the signal
RUN = [*FLAGS, f'--config.train.steps={STEPS}', '--config.checkpoint.every_steps=1000']


def losses(workdir) -> dict[int, float]:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return {row['step']: row['loss'] for row in map(json.loads, f) if 'loss' in row}


def cache_env(cache) -> dict:
  return dict(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')


def train_pid(workdir, process_id: int) -> int:
  """The pid of `t5lite train --process_id=process_id` of the run in `workdir`."""
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        args = f.read().decode().split('\0')
    except OSError:  # it ended meanwhile
      continue
    if f'--workdir={workdir}' in args and f'--process_id={process_id}' in args:
      return int(pid)
  raise AssertionError(f'no process {process_id} of {workdir}')


def run_until(command: list[str], line_start: str, signum, pid=None, env=None) -> tuple[int, str]:
  """Runs `command`, sends `signum` to `pid()` (default: the command) once a line starts with
  `line_start`; returns the exit status and everything it printed."""
  process = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, **(env or {})),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  printed = []
  for line in process.stdout:
    printed.append(line)
    if line.startswith(line_start):
      os.kill(pid() if pid else process.pid, signum)
      break
  printed.append(process.stdout.read())
  return process.wait(timeout=120), ''.join(printed)


@pytest.mark.slow
def test_sigterm_stops_both_processes_at_one_step_and_the_run_resumes_in_two_or_one(tmp_path):
  env, reference, stopped = cache_env(tmp_path / 'cache'), tmp_path / 'reference', tmp_path / 'run'
  assert launch_local([f'--workdir={reference}', *RUN], 2, 2, env=env, timeout=300) == 0

  status, printed = run_until(
      [sys.executable, 'launch/local.py', '--num_processes=2', '--devices_per_process=2',
       '--timeout=300', '--', f'--workdir={stopped}', *RUN],
      '[0] step 2/', signal.SIGTERM, pid=lambda: train_pid(stopped, 1), env=env)
  assert status == preemption.EXIT_STOPPED_EARLY, printed[-3000:]
  assert 'saved and stopped early' in printed and 'exited with status' not in printed
  assert 'Traceback' not in printed
  saved = re.findall(r'^\[(\d)\] .*preempted: saved step (\d+)', printed, re.MULTILINE)
  step = int(saved[0][1])
  assert sorted(saved) == [('0', str(step)), ('1', str(step))] and 2 < step < STEPS
  checkpoints = stopped / 'checkpoints'
  assert os.listdir(checkpoints) == [str(step)]
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(
      os.listdir(checkpoints / str(step) / 'state'))

  # The 2-process checkpoint in one process of 4 devices: its next steps are the two processes'.
  alone = tmp_path / 'alone'
  shutil.copytree(stopped, alone)
  result = subprocess.run(
      [sys.executable, '-m', 't5lite', 'train', f'--workdir={alone}', *RUN,
       f'--config.train.steps={step + 2}'], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env=dict(os.environ, **env, JAX_PLATFORMS='cpu',
                            XLA_FLAGS='--xla_force_host_platform_device_count=4'))
  assert result.returncode == 0, result.stderr[-2000:]
  for later in (step + 1, step + 2):
    assert losses(alone)[later] == pytest.approx(losses(reference)[later], rel=1e-5), later

  assert launch_local([f'--workdir={stopped}', *RUN], 2, 2, env=env, timeout=300) == 0
  assert losses(stopped) == losses(reference)  # bitwise
  assert sorted(losses(stopped)) == list(range(1, STEPS + 1))
