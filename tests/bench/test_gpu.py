"""bench/gpu.py as a GPU machine runs it, here on the CPU backend at tiny shapes: every kind of
job in its own process, its checks computed and passed on real numbers, so that no path of the
one command a lent GPU runs is first run there. Of the speed sweep, the baseline and a change
under XLA flags run; every change's config is built and validated in process (the rest of a
speed job is the baseline's path)."""

import json
import os
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / 'bench'))


# rows fed their segment ids and a scan unrolled by 2 (cuDNN's changes run with XLA's kernel on
# CPU)
JOBS = ('correctness', 'attention', 'attention_speed', 'profile', 'hf', 'hf_alone:32',
        'speed:t5_tiny:baseline', 'speed:t5_tiny:xla=maxtext', 'speed:t5_tiny:rows=packed',
        'speed:t5_tiny:model.scan_unroll=2', 'resume', 'plan', 'resume:flash', 'resume:auto')


@pytest.fixture(scope='module')
def rows(tmp_path_factory):
  """{job: [rows]} of one run of every job, and the --out folder."""
  out = tmp_path_factory.mktemp('gpu_out')
  # One device, as a GPU; torch.compile a no-op (TORCH_COMPILE_DISABLE: on a CPU its C++ build
  # took 2 of the hf job's 2.5 minutes, and it is not a GPU's Triton path), so `hf_torch_compile`
  # runs its SDPA model and fused AdamW eagerly.
  one_device = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1',
                    TORCH_COMPILE_DISABLE='1')
  done = subprocess.run([sys.executable, str(ROOT / 'bench' / 'gpu.py'), f'--out={out}',
                         f'--jobs={",".join(JOBS)}', '--steps=2', '--warmup=1',
                         '--budget_s=1500'], cwd=ROOT,
                        env=one_device, capture_output=True, text=True, timeout=1800)
  assert done.returncode == 0, done.stderr[-3000:]
  by_job = {}
  for line in (out / 'gpu.jsonl').read_text().splitlines():
    row = json.loads(line)
    by_job.setdefault(row.get('job', 'header'), []).append(row)
  return by_job, out


@pytest.mark.slow
def test_correctness_checks_pass_on_cpu(rows):
  by_job, _ = rows
  assert by_job['header'][0]['backend'] == 'cpu'
  checks = {row['check']: row for row in by_job['correctness'] + by_job['attention']}
  assert list(checks) == ['float32_device_equals_cpu', 'bfloat16_tracks_float32',
                          'greedy_equals_transformers', 'attention_kernels_agree']
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
  assert max(kernels['xla_float32_causal'].values()) <= 1e-4
  assert max(kernels['flash_float32'].values()) <= 1e-4  # in Pallas' interpreter
  assert max(kernels['flash_float32_causal'].values()) <= 1e-4
  assert min(kernels['flash_float32'].values()) < max(kernels['flash_float32'].values())
  assert kernels['cudnn'] == 'not run: needs a GPU'

  greedy = checks['greedy_equals_transformers']
  assert greedy['tokens_equal'] == greedy['tokens'] == 64


@pytest.mark.slow
def test_the_attention_timings_check_each_kernel_against_float32_einsum(rows):
  by_job, _ = rows
  timed = {(row['case'], row['kernel']): row for row in by_job['attention_speed']}
  cases = ('encoder', 'decoder', 'cross', 'encoder_64', 'decoder_64', 'cross_64')
  assert set(timed) == {(case, kernel) for case in cases
                        for kernel in ('einsum', 'xla', 'flash')}  # cuDNN's need a GPU
  for (case, _), row in timed.items():
    assert row['finite'] and row['fwd_bwd_ms'] > 0 and row['temp_mib'] >= 0
    errors = [row[k] for k in ('value', 'd_query', 'd_key', 'd_value', 'd_table') if k in row]
    assert len(errors) == (4 if case.startswith('cross') else 5)  # cross-attention: no bias
    assert max(errors) <= 1e-5  # float32 on CPU: the same function as the reference


def test_packed_segments_are_cudnn_lengths_and_offsets():
  import gpu  # pylint: disable=import-outside-toplevel
  segments = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]], np.int32)
  lengths, offsets = gpu.packed_segments(segments, 3)
  np.testing.assert_array_equal(lengths, [[3, 2, -1], [6, -1, -1]])
  np.testing.assert_array_equal(offsets, [[0, 3, -1, -1], [0, -1, -1, -1]])
  rows = gpu.packed_rows(64, 40, 4, seed=0)
  for row in rows:  # 1 to 4 examples in order, then padding only
    examples = row[row > 0]
    assert 1 <= examples.max() <= 4 and np.all(np.diff(examples) >= 0)
    assert set(np.unique(examples)) == set(range(1, examples.max() + 1))
    assert np.all(row[len(examples):] == 0)
  assert {row.max() for row in rows} == {1, 2, 3, 4} and (rows == 0).any()


@pytest.mark.slow
def test_the_speed_jobs_and_the_side_by_side_measure(rows):
  by_job, _ = rows
  import gpu  # pylint: disable=import-outside-toplevel
  speed = {name: found[0] for name, found in by_job.items() if name.startswith('speed:')}
  batch, _ = gpu.SWEEP['t5_1_1_base']
  assert sorted(speed) == ['speed:t5_tiny:baseline', 'speed:t5_tiny:model.scan_unroll=2',
                           'speed:t5_tiny:rows=packed', 'speed:t5_tiny:xla=maxtext']
  for row in speed.values():
    assert 'error' not in row, row
    assert row['step_s'] > 0 and row['tokens_per_s'] > 0 and 0 < row['mfu'] < 1
    assert row['batch_size'] == batch // 32  # the first preset's, at a 32nd of its batch
    assert row['attention'] == 'xla' and row['cudnn_forward_calls'] == 0
  alone = by_job['hf_alone:32'][0]
  assert alone['framework'] == 'hf_torch_compile' and alone['attention'] == 'sdpa'
  assert alone['batch_size'] == 1 and alone['step_s'] > 0 and 0 < alone['mfu'] < 1
  side = by_job['hf'][0]
  for framework in ('t5lite', 'hf_torch', 'hf_torch_compile'):
    assert side[f'{framework}_step_s'] > 0 and 0 < side[f'{framework}_mfu'] < 1
  assert side['batch_size'] == batch // 32 and side['hf_torch_compile_attention'] == 'sdpa'


@pytest.mark.slow
def test_the_profile_maps_device_time_to_source_lines(rows):
  by_job, out = rows
  profile = by_job['profile:t5_tiny:baseline'][0]
  assert profile['instructions'] > 100 and profile['device_ms_per_step'] > 0
  phases = dict((name, ms) for name, ms, _ in profile['by_phase'])
  assert set(phases) == {'forward', 'backward', 'update'}
  assert phases['backward'] > phases['forward'] > 0  # the backward pass does twice the matmuls
  lines = [line for line, _, _ in profile['by_line']]
  assert any(line.startswith('t5lite/models/layers.py:') and 'Dense' in line for line in lines)
  assert any(line.startswith('t5lite/models/attention.py:') for line in lines)
  assert profile['change'] == 'baseline' and profile['peak_memory_gib'] is None  # CPU: no stats
  for archive in ('trace_baseline.tar.gz', 'xla_dump_baseline.tar.gz'):
    with tarfile.open(out / archive) as tar:
      assert len(tar.getnames()) > 1
  assert not (out / 'trace').exists() and not (out / 'xla_dump').exists()


@pytest.mark.slow
def test_a_killed_run_resumes_bitwise_and_plan_sees_its_memory(rows):
  by_job, _ = rows
  resume = by_job['resume'][0]
  assert resume['pass'] and resume['saved_states_equal']
  assert resume['saved_states_differing_leaves'] == []
  assert resume['equal_losses'] == resume['steps'] == 8 and resume['first_differing_step'] is None
  assert resume['resumed_from_step'] in (2, 4, 6)  # a complete checkpoint, every 2 steps
  assert resume['killed_after_step'] > resume['resumed_from_step']  # steps were done again
  own = resume['own_save_resumed_steps']  # the uninterrupted run, resumed from its own save
  assert own == 8 - resume['resumed_from_step'] == resume['own_save_resumed_equal_losses']
  assert resume['losses']['once'] == resume['losses']['resumed']
  assert all(8 < loss < 11 for loss in resume['losses']['once'])  # about ln(8192) = 9.0
  flash = by_job['resume:flash'][0]  # the flash kernel, interpreted: bitwise too
  assert flash['pass'] and flash['equal_losses'] == 8 and '--config.model.attention=flash' in (
      flash['flags'])
  assert flash['saved_states_differing_leaves'] == []
  auto = by_job['resume:auto'][0]  # the default kernel; 'auto' is XLA's here
  assert auto['pass'] and auto['equal_losses'] == 8 and auto['saved_states_differing_leaves'] == []
  assert '--config.model.attention=auto' in auto['flags']
  plan = by_job['plan'][0]
  assert plan['topology'] == 'cpu:1' and plan['compiled'] and plan['planned_gib'] > 0
  assert plan['run_peak_memory_gib'] is None  # XLA:CPU keeps no allocator statistics


def test_every_speed_change_makes_a_valid_config():
  """Each change of the sweep, on the CPU's (t5_tiny) and as a GPU runs it (its preset), is a
  config that validates, with the change in it."""
  import gpu  # pylint: disable=import-outside-toplevel
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel
  cpu_sweep = gpu.sweep()
  [(cpu_model, (_, cpu_changes))] = cpu_sweep.items()
  # the first preset's changes, cuDNN's with the baseline's kernel, each once (batch sizes a
  # 32nd; flash runs interpreted)
  without_cudnn = {gpu.change_name({k: v for k, v in change.items() if v != 'cudnn'})
                   for change in gpu.SWEEP['t5_1_1_base'][1]}
  assert len(cpu_changes) == len(without_cudnn) == 17
  assert not any('cudnn' in change.values() for change in cpu_changes)
  variants = [(cpu_model, change, gpu.variant_config(cpu_model, change)) for change in cpu_changes]
  for name, (batch, changes) in gpu.SWEEP.items():
    for change in changes:
      overrides = {**gpu.BASELINE, **{k: v for k, v in change.items() if k not in gpu.BENCH_KEYS}}
      variants.append((name, change, gpu.preset(name, dtype='bfloat16', batch_size=batch,
                                                inputs_length=512, targets_length=114,
                                                **overrides)))
  assert len(variants) == 17 + 20 + 7
  for name, change, config in variants:
    config_lib.validate(config)
    config_lib.model_config(config)
    for key, value in change.items():
      if key == 'xla':
        assert value in gpu.XLA_FLAGS
      elif key == 'rows':
        assert value == 'packed'
      else:
        section, field = key.split('.')
        assert config[section][field] == value, (name, change)


def test_jobs_are_chosen_by_name_else_by_prefix(monkeypatch):
  """A job's whole name picks it alone, though it prefixes others, and a prefix picks every job
  it starts."""
  import gpu  # pylint: disable=import-outside-toplevel
  names = [job.name for job in gpu.selected('attention,speed:t5_tiny:data,attention')]
  assert names == ['attention', 'speed:t5_tiny:data.batch_size=8',
                   'speed:t5_tiny:data.batch_size=2', 'speed:t5_tiny:data.batch_size=1']
  assert [job.name for job in gpu.selected('attention_')] == ['attention_speed']
  monkeypatch.setattr(gpu, 'on_gpu', lambda: True)  # the GPU's sweep: changes of two fields
  unrolled = 'speed:t5_1_1_base:model.attention=cudnn+model.scan_layers=False'
  assert [job.name for job in gpu.selected(f'{unrolled},hf')] == [unrolled, 'hf']
  with pytest.raises(SystemExit, match="--jobs: no job starts with 'nothing'"):
    gpu.selected('nothing')


def test_a_job_that_fails_costs_one_row_not_the_run(tmp_path):
  """A job that crashes or outlives its timeout is a row with its error; the jobs after it
  still run."""
  import gpu  # pylint: disable=import-outside-toplevel
  import argparse  # pylint: disable=import-outside-toplevel
  args = argparse.Namespace(out=str(tmp_path), budget_s=60, steps=1, warmup=0)
  crash = gpu.Job('crash', None, 30)
  hang = gpu.Job('hang', None, 1)
  ok = gpu.Job('ok', None, 30)
  scripts = {'crash': 'import sys; print("boom", file=sys.stderr); raise SystemExit(3)',
             'hang': 'import time; time.sleep(60)',
             'ok': f'open({str(tmp_path / "gpu.jsonl")!r}, "a").write(\'{{"job": "ok"}}\\n\')'}
  gpu.run_jobs([crash, hang, ok], args, command=lambda job: [sys.executable, '-c',
                                                             scripts[job.name]])
  rows = [json.loads(line) for line in (tmp_path / 'gpu.jsonl').read_text().splitlines()]
  assert [row['job'] for row in rows] == ['crash', 'hang', 'ok']
  assert rows[0]['error'].startswith('3 after') and rows[1]['error'].startswith('timeout after')
  assert rows[0]['stderr_tail'] == 'boom' and rows[1]['stderr_tail'] == ''  # each its own
  assert 'error' not in rows[2]
