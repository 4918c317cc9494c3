"""launch/local.py with stand-in commands: flags, environment, output routing, failure, timeout,
an early stop and the signals it passes on."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from launch import local
from t5lite.train import preemption

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHOW = """
import os, sys
print(' '.join(sys.argv[1:]))
print(os.environ['XLA_FLAGS'], os.environ['JAX_PLATFORMS'], os.environ['T5LITE_TEST'])
"""
# Two real JAX processes: the coordinator flags and fake devices that launch_local hands out work.
JAX_PROCESS = """
import sys
import jax, numpy as np
from jax.experimental import multihost_utils
flags = dict(arg[2:].split('=', 1) for arg in sys.argv[1:])
jax.distributed.initialize(flags['coordinator_address'], int(flags['num_processes']),
                           int(flags['process_id']))
ids = multihost_utils.process_allgather(np.array([jax.process_index()])).ravel().tolist()
# one write: the processes run unbuffered, and in a CI run Gloo's log, from a C++ thread, landed
# between the pieces that print() writes
sys.stdout.write(f'result {jax.process_index()} {jax.local_device_count()} {jax.device_count()} '
                 f'{ids}\\n')
"""
# Stops as `t5lite train` does on SIGTERM or Ctrl-C: says which, and exits 75.
STOPPABLE = """
import signal, sys, time
def stop(signum, frame):
  print('stopped by', signal.Signals(signum).name, flush=True)
  sys.exit(75)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print('ready', flush=True)
time.sleep(60)
"""


def python(code: str) -> list[str]:
  return [sys.executable, '-c', code]


def test_each_process_gets_the_coordinator_its_id_and_its_devices(capsys):
  env = dict(XLA_FLAGS='--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false',
             T5LITE_TEST='yes')
  assert local.launch_local(['--workdir=runs/x'], 2, 3, env=env, command=python(SHOW)) == 0
  printed = capsys.readouterr()
  (args0, env0), (args1, env1) = printed.out.splitlines(), printed.err.splitlines()
  port = args0.split()[2].rsplit(':', 1)[1]
  assert args0 == (f'[0] --workdir=runs/x --coordinator_address=127.0.0.1:{port} '
                   '--num_processes=2 --process_id=0')
  assert args1 == args0.replace('[0]', '[1]').replace('process_id=0', 'process_id=1')
  assert env0 == env1.replace('[1]', '[0]') == (
      '[0] --xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=3 cpu yes')


def test_real_jax_processes_see_each_other(capsys):
  assert local.launch_local([], 2, 3, command=python(JAX_PROCESS), timeout=60) == 0
  printed = capsys.readouterr()
  results = [line for line in (printed.out + printed.err).splitlines() if 'result' in line]
  assert sorted(results) == ['[0] result 0 3 6 [0, 1]', '[1] result 1 3 6 [0, 1]']


def test_one_failure_stops_the_others_with_one_line(capsys):
  fail_second = "import sys, time\nif sys.argv[-1] == '--process_id=1': sys.exit(3)\ntime.sleep(60)"
  start = time.monotonic()
  assert local.launch_local([], 3, 1, command=python(fail_second)) == 3
  assert time.monotonic() - start < 10
  assert capsys.readouterr().err == (
      'launch/local.py: process 1 exited with status 3; stopped the 2 still running\n')


def test_timeout_stops_everything(capsys):
  sleep = python('import time; time.sleep(60)')
  assert local.launch_local([], 2, 1, timeout=0.2, command=sleep) == 124
  assert capsys.readouterr().err.endswith('timed out after 0.2 s; stopped the 2 still running\n')


def test_cli_rejects_a_zero_process_count(capsys):
  with pytest.raises(SystemExit) as exit_:
    local.main(['--num_processes=0'])
  assert exit_.value.code == 2
  assert "'0' is not a positive integer" in capsys.readouterr().err


def test_all_stopping_early_is_status_75_with_one_line(capsys):
  assert local.EXIT_STOPPED_EARLY == preemption.EXIT_STOPPED_EARLY
  early = python('import sys, time; time.sleep(0.5 * (sys.argv[-1] == "--process_id=0")); '
                 'sys.exit(75)')
  assert local.launch_local([], 2, 1, command=early) == 75
  assert capsys.readouterr().err == ('launch/local.py: the processes saved and stopped early '
                                     '(status 75); the same command resumes the run\n')


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT], ids=['SIGTERM', 'SIGINT'])
def test_a_signal_to_the_launcher_goes_on_to_every_process(signum):
  launcher = subprocess.Popen(
      [sys.executable, 'launch/local.py', '--num_processes=2', '--devices_per_process=1',
       '--command', shlex.join(python(STOPPABLE))],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  ready = 0
  for line in launcher.stdout:  # both have their handlers
    ready += line.endswith('ready\n')
    if ready == 2:
      break
  launcher.send_signal(signum)
  printed = sorted(launcher.stdout.read().splitlines())
  assert launcher.wait(timeout=30) == 75
  name = signal.Signals(signum).name
  assert printed == [f'[0] stopped by {name}', f'[1] stopped by {name}',
                     'launch/local.py: the processes saved and stopped early (status 75); the '
                     'same command resumes the run']
