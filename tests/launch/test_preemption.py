"""Stopping a run early: Ctrl-C on one process saves and exits 75, no traceback; a second
Ctrl-C is the default action. (SIGTERM to one of two processes: test_multiprocess_training.)

A real `t5lite train` process of test_multiprocess_training's tiny model.
"""

import os
import re
import signal
import sys

from t5lite.train import preemption
from test_multiprocess_training import FLAGS, run_until


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
