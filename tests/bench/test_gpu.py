"""bench/gpu.py's correctness part, as it runs on an accelerator, here on the CPU backend: the
same script a GPU machine runs, its checks computed and passed on real numbers."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.slow
def test_correctness_checks_run_and_pass_on_cpu(tmp_path):
  done = subprocess.run([sys.executable, str(ROOT / 'bench' / 'gpu.py'), '--parts=correctness',
                         f'--out={tmp_path}'], cwd=ROOT, env=dict(os.environ),
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / 'gpu.jsonl').read_text().splitlines()]
  header, *checks = rows
  assert header['backend'] == 'cpu'
  checks = {row['check']: row for row in checks}
  assert list(checks) == ['float32_device_equals_cpu', 'bfloat16_tracks_float32',
                          'attention_kernels_agree', 'greedy_equals_transformers']
  assert all(row['pass'] for row in checks.values())

  same = checks['float32_device_equals_cpu']
  assert len(same['device_losses']) == 5 and same['max_relative_difference'] <= 1e-4
  assert 8 < same['cpu_losses'][0] < 10  # about ln(8192) = 9.0 at init

  bf16 = checks['bfloat16_tracks_float32']
  assert bf16['float32_losses'][-1] < 1.0 < bf16['float32_losses'][0]  # it memorises the batch
  assert bf16['mean_loss_difference'] <= 0.02 and bf16['last_loss_difference'] <= 0.02
  assert 0 < bf16['max_step_difference']  # bfloat16 really computed in bfloat16

  kernels = checks['attention_kernels_agree']
  assert max(kernels['xla_float32'].values()) <= 1e-4
  assert kernels['cudnn'] == 'not run: needs a GPU'

  greedy = checks['greedy_equals_transformers']
  assert greedy['tokens_equal'] == greedy['tokens'] == 64
