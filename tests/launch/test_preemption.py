"""Stopping a run early: SIGTERM to one of two processes stops both after the same step, saved
once, and the run resumes exactly; Ctrl-C on one process saves and exits 75, no traceback.

Real `t5lite train` processes of test_multiprocess_training's tiny model, the two through
launch/local.py, sharing a persistent compilation cache so that each run after the first skips
most of the compile.
"""

import os
import re
import signal
import subprocess
import sys

import pytest

from launch.local import launch_local
from t5lite.train import preemption
from test_multiprocess_training import FLAGS, ROOT, losses

STEPS = 40  # JAX's service polls for SIGTERM once a second: steps to spare after the signal
RUN = [*FLAGS, f'--config.train.steps={STEPS}', '--config.checkpoint.every_steps=1000']


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
def test_sigterm_to_one_of_two_processes_saves_one_step_on_both_and_resumes_exactly(tmp_path):
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
  step = saved[0][1]
  assert sorted(saved) == [('0', step), ('1', step)] and 2 < int(step) < STEPS
  checkpoints = stopped / 'checkpoints'
  assert os.listdir(checkpoints) == [step]
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(os.listdir(checkpoints / step / 'state'))

  assert launch_local([f'--workdir={stopped}', *RUN], 2, 2, env=env, timeout=300) == 0
  assert losses(stopped) == losses(reference)
  assert sorted(losses(stopped)) == list(range(1, STEPS + 1))


def test_ctrl_c_on_one_process_saves_and_exits_75_without_a_traceback(tmp_path):
  env = dict(JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=1')
  status, printed = run_until(
      [sys.executable, '-m', 't5lite', 'train', f'--workdir={tmp_path}', *FLAGS,
       '--config.train.steps=100000', '--config.checkpoint.every_steps=100000'],
      'step 2/', signal.SIGINT, env=env)
  assert status == preemption.EXIT_STOPPED_EARLY, printed[-3000:]
  assert 'Traceback' not in printed and 'KeyboardInterrupt' not in printed
  step = re.search(r'preempted: saved step (\d+)', printed).group(1)
  assert os.listdir(tmp_path / 'checkpoints') == [step] and int(step) >= 2


def test_a_second_ctrl_c_is_left_to_the_default_action():
  """Which ends the process at once, with no traceback, even inside a save or on the way out."""
  sigterm = signal.getsignal(signal.SIGTERM)
  preempted = preemption.Preempted(0)
  try:
    assert not preempted(1)
    os.kill(os.getpid(), signal.SIGINT)
    assert preempted(2) and signal.getsignal(signal.SIGINT) == signal.SIG_DFL
  finally:
    preempted.restore()
    restored = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
  assert restored == (signal.SIG_DFL, sigterm)
