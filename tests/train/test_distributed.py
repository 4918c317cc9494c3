"""Joining a multi-process run fails in one line, never hangs, when it cannot work."""

import os
import subprocess
import sys
import time

import jax
import pytest

from t5lite.train import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_unreachable_coordinator_times_out_with_one_line(tmp_path):
  started = time.monotonic()
  result = subprocess.run(
      [sys.executable, '-m', 't5lite', 'train', '--config=configs/t5_tiny.py',
       f'--workdir={tmp_path}', '--coordinator_address=127.0.0.1:9', '--num_processes=2',
       '--process_id=1', '--coordinator_timeout=5'],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert result.returncode == 2
  assert time.monotonic() - started < 90
  error = [line for line in result.stderr.splitlines() if line.startswith('t5lite train')]
  assert len(error) == 1
  assert 'could not join the run at 127.0.0.1:9 within 5s' in error[0]
  assert not os.listdir(tmp_path)  # nothing written


@pytest.mark.parametrize('kwargs, message', [
    (dict(coordinator_address='127.0.0.1:1234'), 'go together'),
    (dict(coordinator_address='127.0.0.1:1234', num_processes=2, process_id=2),
     '--process_id=2 must be in [0, --num_processes=2)'),
])
def test_inconsistent_process_flags(kwargs, message):
  with pytest.raises(ValueError, match=message.replace('[', r'\[').replace('(', r'\(').replace(
      ')', r'\)')):
    distributed.initialize(**kwargs)


@pytest.mark.parametrize('environment', [{}, {'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '1'}],
                         ids=['no cluster', 'one SLURM task'])
def test_a_single_process_without_a_cluster_does_nothing(monkeypatch, environment):
  for name in (*distributed.CLUSTER_HINTS, 'SLURM_NTASKS'):
    monkeypatch.delenv(name, raising=False)
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize', lambda **kwargs: calls.append(kwargs))
  monkeypatch.setattr(distributed, 'wait_for_coordinator', lambda *args: calls.append(args))
  distributed.initialize()
  assert calls == []
  assert (jax.process_count(), jax.process_index()) == (1, 0)
  distributed.initialize(multihost=True)  # what it would have called
  assert calls == [dict(coordinator_address=None, num_processes=None, process_id=None,
                        initialization_timeout=300)]
