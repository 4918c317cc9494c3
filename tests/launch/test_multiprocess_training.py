"""Two JAX processes on this machine train exactly as one, and their checkpoint resumes in one."""

import json
import os
import subprocess
import sys

import pytest

from launch.local import launch_local

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ['--config=' + os.path.join(ROOT, 'configs', 't5_tiny.py'),
         '--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
         '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
         '--config.model.num_decoder_layers=1', '--config.data.batch_size=8',
         '--config.data.inputs_length=32', '--config.data.targets_length=8',
         '--config.train.log_every=1', '--config.train.eval_every=0',
         '--config.checkpoint.every_steps=3']


def losses(workdir) -> dict[int, float]:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return {row['step']: row['loss'] for row in map(json.loads, f) if 'loss' in row}


def one_process(workdir, *flags):
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=4')
  return subprocess.run([sys.executable, '-m', 't5lite', 'train', f'--workdir={workdir}', *FLAGS,
                         *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_processes_of_two_devices_equal_one_process_of_four(tmp_path):
  two, one = tmp_path / 'two', tmp_path / 'one'
  assert launch_local([f'--workdir={two}', *FLAGS, '--config.train.steps=3'], num_processes=2,
                      devices_per_process=2, timeout=600) == 0
  result = one_process(one, '--config.train.steps=3')
  assert result.returncode == 0, result.stderr[-2000:]
  two_losses, one_losses = losses(two), losses(one)
  assert sorted(two_losses) == [1, 2, 3]
  for step, loss in one_losses.items():
    assert two_losses[step] == pytest.approx(loss, rel=1e-5), step

  # The 2-process checkpoint resumes in one process and continues as the 1-process run does.
  resumed = one_process(two, '--config.train.steps=5')
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  continued = one_process(one, '--config.train.steps=5')
  assert continued.returncode == 0, continued.stderr[-2000:]
  assert losses(two)[5] == pytest.approx(losses(one)[5], rel=1e-5)
