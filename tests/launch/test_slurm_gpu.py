"""launch/slurm_gpu.sbatch: its SLURM shape, the command srun gets, and XLA flags jaxlib accepts."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'launch', 'slurm_gpu.sbatch')


def run_with_fake_srun(tmp_path, *args, **env):
  """Run the batch script with an `srun` that records its arguments and XLA_FLAGS."""
  srun = tmp_path / 'srun'
  srun.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SLURM_SUBMIT_DIR/args"\n'
                  'printf "%s" "$XLA_FLAGS" > "$SLURM_SUBMIT_DIR/xla_flags"\n')
  srun.chmod(0o755)
  env = dict(os.environ, PATH=f'{tmp_path}:{os.environ["PATH"]}', SLURM_SUBMIT_DIR=str(tmp_path),
             **env)
  subprocess.run(['bash', SCRIPT, *args], env=env, check=True, timeout=10)
  return (tmp_path / 'args').read_text().splitlines(), (tmp_path / 'xla_flags').read_text()


def test_one_task_per_node_with_8_gpus():
  subprocess.run(['bash', '-n', SCRIPT], check=True)
  with open(SCRIPT, encoding='utf-8') as f:
    directives = [line.split()[1] for line in f if line.startswith('#SBATCH')]
  assert {'--ntasks-per-node=1', '--gpus-per-node=8', '--signal=TERM@300'} <= set(directives)


def test_srun_runs_t5lite_train_with_the_flags_unchanged(tmp_path):
  args, _ = run_with_fake_srun(tmp_path, '--config=configs/t5_tiny.py', '--workdir=/shared/r',
                               T5LITE_PYTHON='python3')
  assert args == ['--ntasks-per-node=1', '--kill-on-bad-exit=1', 'python3', '-m', 't5lite',
                  'train', '--multihost', '--config=configs/t5_tiny.py', '--workdir=/shared/r']


def test_jaxlib_knows_every_xla_flag_and_the_users_come_last(tmp_path):
  """An XLA flag that jaxlib does not know aborts every process at start-up."""
  _, flags = run_with_fake_srun(tmp_path, XLA_FLAGS='--xla_gpu_enable_command_buffer=FUSION')
  assert '--xla_gpu_enable_latency_hiding_scheduler=true' in flags.split()
  assert flags.split()[-1] == '--xla_gpu_enable_command_buffer=FUSION'
  check = subprocess.run([sys.executable, '-c', 'import jax; jax.devices()'], text=True,
                         capture_output=True, env=dict(os.environ, XLA_FLAGS=flags,
                                                       JAX_PLATFORMS='cpu'), timeout=60)
  assert check.returncode == 0, check.stderr[-2000:]
