"""One command on a bare GPU machine: is t5lite correct there, how fast is it, and against what.

  python bench/gpu.py --out=$OUT                       # all three parts, in under 8 minutes
  python bench/gpu.py --parts=correctness              # seconds; what CI runs, on CPU

Every check and measurement is one JSON line on stdout (and in --out/gpu.jsonl):
- correctness: 5 float32 steps of t5_tiny on the default device equal the same steps on the CPU
  backend (matmul precision 'highest', rtol 1e-4); bfloat16's losses within 2% of float32's over
  50 steps (memorising one batch, so that the loss moves); the attention kernels (`einsum`, the
  reference, `xla`, and `cudnn` where there is a GPU) agree with T5's relative bias and packed
  segment masks, forward and gradients; greedy decoding equals `transformers`' generate;
- speed: t5_1_1_base and t5_1_1_large in bfloat16 at 512/114 on synthetic batches, one setting
  changed at a time from a baseline (batch size, remat policy, scanned layers, attention kernel,
  loss_chunks): tokens/s, MFU by t5lite/train/flops.py against the device's peak, XLA's memory
  estimate, the allocator's peak, compile time;
- hf: the baseline beside Hugging Face's PyTorch T5, eager and compiled (bench/train_step.py),
  same shapes and batch, steps alternating.
On CPU, --parts=speed,hf run t5_tiny at small shapes (a smoke test of the code, not a figure).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# bench/train_step.py: the preset setup, the timed step and the PyTorch side; importing it first
# sets the environment both frameworks run in (JAX leaves GPU memory to torch) and puts the
# repository on the path
import train_step  # pylint: disable=wrong-import-order

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from t5lite import config as config_lib  # noqa: E402
from t5lite.data import batches as batches_lib  # noqa: E402
from t5lite.models import attention as attention_lib  # noqa: E402
from t5lite.models import decoding  # noqa: E402
from t5lite.models.positions import RelativePositionBias  # noqa: E402
from t5lite.train import flops as flops_lib  # noqa: E402
from t5lite.train import mesh as mesh_lib  # noqa: E402
from t5lite.train import run as run_lib  # noqa: E402

ONE_DEVICE = {'data': 1, 'fsdp': 1, 'tensor': 1}
PARTS = ('correctness', 'speed', 'hf')
# One setting changed at a time from each preset's baseline (bf16, 512/114, scanned, cuDNN).
SWEEP = {
    't5_1_1_base': {'batch_size': 128, 'variants': [
        {}, {'data.batch_size': 64}, {'data.batch_size': 256}, {'model.remat_policy': 'full'},
        {'model.scan_layers': False}, {'model.attention': 'xla'}, {'train.loss_chunks': 4}]},
    't5_1_1_large': {'batch_size': 64, 'variants': [
        {}, {'data.batch_size': 128}, {'model.remat_policy': 'save_dots'},
        {'model.attention': 'xla'}]},
}
CPU_SWEEP = {'t5_tiny': {'batch_size': 8, 'variants': [{}, {'model.scan_layers': False}]}}


def preset(name: str, *, dtype: str, batch_size: int, inputs_length: int, targets_length: int,
           **overrides):
  """bench/train_step.py's setup of a preset (synthetic batches at the given shapes, AdamW at a
  constant rate), without dropout, at a rate that memorises a batch in 50 steps, and with
  `overrides` ({'model.scan_layers': True, ...})."""
  shape = argparse.Namespace(dtype=dtype, batch_size=batch_size, inputs_length=inputs_length,
                             targets_length=targets_length, warmup=0, steps=1)
  config = train_step.run_config(name, shape, dropout=0.0)
  config.optim.learning_rate = 1e-3
  for key, value in overrides.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def first_batches(config, count: int) -> list[dict]:
  stream = batches_lib.make_batches(config.data, process_index=0, process_count=1)
  return [next(stream) for _ in range(count)]


def train(config, batches: list[dict], device) -> tuple[list[float], object]:
  """Losses of one train step per batch on `device` alone, and the last parameters."""
  run = run_lib.make_run(config, mesh_lib.make_mesh(ONE_DEVICE, [device]))
  with run.sharding():
    state = run.spec.init()
    step = run.jit_train_step(run.loss())
    losses = []
    for batch in batches:
      state, metrics = step(state, jax.device_put(batch, run.batch_sharding), None)
      losses.append(float(metrics['loss']))
  return losses, (run, state.params)


def relative_difference(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def check_device_equals_cpu() -> dict:
  config = preset('t5_tiny', dtype='float32', batch_size=8, inputs_length=64, targets_length=16)
  batches = first_batches(config, 5)
  with jax.default_matmul_precision('highest'):
    device, _ = train(config, batches, jax.devices()[0])
    cpu, _ = train(config, batches, jax.devices('cpu')[0])
  difference = relative_difference(device, cpu)
  return {'check': 'float32_device_equals_cpu', 'device_losses': device, 'cpu_losses': cpu,
          'max_relative_difference': difference, 'rtol': 1e-4, 'pass': difference <= 1e-4}


def check_bfloat16_tracks_float32() -> tuple[dict, object]:
  """50 steps on one batch in both dtypes; returns the float32 run too, for decoding."""
  losses, runs = {}, {}
  for dtype in ('float32', 'bfloat16'):
    config = preset('t5_tiny', dtype=dtype, batch_size=8, inputs_length=64, targets_length=16)
    batches = [train_step.synthetic_batch(config)] * 50
    losses[dtype], runs[dtype] = train(config, batches, jax.devices()[0])
  f32, bf16 = losses['float32'], losses['bfloat16']
  mean_difference = abs(np.mean(bf16) - np.mean(f32)) / np.mean(f32)
  last_difference = abs(bf16[-1] - f32[-1]) / f32[-1]
  row = {'check': 'bfloat16_tracks_float32', 'steps': 50, 'float32_losses': f32[::10] + f32[-1:],
         'bfloat16_losses': bf16[::10] + bf16[-1:], 'mean_loss_difference': mean_difference,
         'last_loss_difference': last_difference,
         'max_step_difference': relative_difference(bf16, f32), 'tolerance': 0.02,
         'pass': bool(mean_difference <= 0.02 and last_difference <= 0.02)}
  return row, runs['float32']


def check_attention_kernels() -> dict:
  """Every kernel against `einsum` with T5's bias and two packed examples plus padding."""
  cfg = config_lib.model_config(preset('t5_tiny', dtype='float32', batch_size=2,
                                       inputs_length=64, targets_length=16))
  length, heads, d = 64, cfg.num_heads, cfg.d_kv
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, cotangent = (jax.random.normal(key, (2, length, heads, d)) for key in keys)
  bias = RelativePositionBias(cfg, bidirectional=True, rngs=nnx.Rngs(1))(length, length)
  segments = jnp.array([[1] * 40 + [2] * 20 + [0] * 4, [1] * 64])
  mask = attention_lib.attention_mask(length, segments > 0, query_segment_ids=segments,
                                      key_segment_ids=segments)
  real = (segments > 0)[:, :, None, None]  # padding queries attend to nothing: left out

  def outputs(implementation, dtype):
    def loss(q, k, v, bias):
      out = attention_lib.dot_product_attention(
          q.astype(dtype), k.astype(dtype), v.astype(dtype), mask=mask, bias=bias,
          implementation=implementation)
      return jnp.sum(jnp.where(real, out.astype(jnp.float32) * cotangent, 0.0))
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    return [value, *grads]

  kernels = [('xla', jnp.float32, 1e-4)]
  if jax.default_backend() == 'gpu':
    kernels += [('xla', jnp.bfloat16, 2e-2), ('cudnn', jnp.bfloat16, 2e-2)]
  row, passed = {'check': 'attention_kernels_agree'}, True
  reference = {dtype: outputs('einsum', dtype) for dtype in {d for _, d, _ in kernels}}
  for implementation, dtype, tolerance in kernels:
    got = outputs(implementation, dtype)
    name = f'{implementation}_{jnp.dtype(dtype).name}'
    errors = [float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-12))
              for a, b in zip(got, reference[dtype])]
    row[name] = dict(zip(('forward', 'd_query', 'd_key', 'd_value', 'd_bias'), errors))
    passed &= max(errors) <= tolerance
  if jax.default_backend() != 'gpu':
    row['cudnn'] = 'not run: needs a GPU'
  return {**row, 'pass': bool(passed)}


def check_greedy_equals_transformers(run, params) -> dict:
  """Greedy decoding of the memorising float32 model, t5lite's against transformers'."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from t5lite.export import hf  # pylint: disable=import-outside-toplevel
  inputs = train_step.synthetic_batch(run.config)['encoder_input_tokens'][:4]
  with run.sharding(), jax.default_matmul_precision('highest'):
    ours = np.asarray(decoding.generate(run.model(params), jnp.asarray(inputs),
                                        max_decode_length=16))
  device = 'cuda' if jax.default_backend() == 'gpu' and torch.cuda.is_available() else 'cpu'
  torch.backends.cuda.matmul.allow_tf32 = False
  with tempfile.TemporaryDirectory() as folder:
    hf.export_hf(params, run.model_cfg, folder)
    model = transformers.T5ForConditionalGeneration.from_pretrained(folder).to(device).eval()
  ids = torch.as_tensor(inputs, dtype=torch.long, device=device)
  with torch.no_grad():
    theirs = model.generate(input_ids=ids, attention_mask=(ids > 0).long(), do_sample=False,
                            num_beams=1, max_new_tokens=16).cpu().numpy()[:, 1:]
  theirs = np.pad(theirs, ((0, 0), (0, 16 - theirs.shape[1])))
  eos = theirs == decoding.EOS_ID  # transformers pads after EOS with pad, we with pad too
  return {'check': 'greedy_equals_transformers', 'torch_device': device,
          'tokens_equal': int((ours == theirs).sum()), 'tokens': int(ours.size),
          'sequences_with_eos': int(eos.any(1).sum()), 'pass': bool((ours == theirs).all())}


def correctness() -> list[dict]:
  bfloat16, (run, params) = check_bfloat16_tracks_float32()
  return [check_device_equals_cpu(), bfloat16, check_attention_kernels(),
          check_greedy_equals_transformers(run, params)]


def measure(config, steps: int, warmup: int) -> dict:
  """One variant on one device: bench/train_step.py's compiled step, `steps` timed after
  `warmup`."""
  step, info = train_step.t5lite_step(config, train_step.synthetic_batch(config))
  seconds = train_step.interleaved_times({'t5lite': step}, warmup, steps)['t5lite'][0]
  data, step_s = config.data, statistics.median(seconds)
  peak, peak_name = flops_lib.peak_flops_per_device(jax.devices()[0])
  flops = flops_lib.train_flops_per_step(config_lib.model_config(config), data.inputs_length,
                                         data.targets_length, batch_size=data.batch_size)
  stats = jax.devices()[0].memory_stats() or {}
  return {'step_s': round(step_s, 4), 'step_s_min': round(min(seconds), 4),
          'tokens_per_s': round(data.batch_size * (data.inputs_length + data.targets_length)
                                / step_s, 1),
          'mfu': round(flops / step_s / peak, 4), 'peak_flops': peak, 'peak_source': peak_name,
          'compile_s': round(info['compile_s'], 2), 'xla_memory_mib': info['xla_memory_mib'],
          'peak_memory_gib': round(stats['peak_bytes_in_use'] / 2**30, 2)
                             if 'peak_bytes_in_use' in stats else None}


def shapes() -> dict:
  gpu = jax.default_backend() == 'gpu'
  return dict(dtype='bfloat16' if gpu else 'float32', inputs_length=512 if gpu else 64,
              targets_length=114 if gpu else 16)


def speed(args) -> list[dict]:
  sweep = SWEEP if jax.default_backend() == 'gpu' else CPU_SWEEP
  rows, deadline = [], time.monotonic() + args.speed_budget_s
  for name, plan in sweep.items():
    for change in plan['variants']:
      row = {'bench': 'gpu_speed', 'model': name, 'change': change or 'baseline'}
      if time.monotonic() > deadline:
        rows.append({**row, 'skipped': f'past --speed_budget_s={args.speed_budget_s}'})
        continue
      config = preset(name, batch_size=plan['batch_size'], **shapes(),
                      **{'model.scan_layers': True, 'model.attention': attention(), **change})
      try:
        rows.append({**row, 'batch_size': config.data.batch_size, **measure(
            config, args.steps, args.warmup)})
      except Exception as error:  # pylint: disable=broad-except  # e.g. out of memory: go on
        rows.append({**row, 'error': str(error).strip().splitlines()[0][:300]})
      print(json.dumps(rows[-1]), flush=True)
  return rows


def attention() -> str:
  return 'cudnn' if jax.default_backend() == 'gpu' else 'xla'


def side_by_side(args) -> list[dict]:
  """The first preset's baseline beside PyTorch's, via bench/train_step.py's comparison."""
  name, plan = next(iter((SWEEP if jax.default_backend() == 'gpu' else CPU_SWEEP).items()))
  step_args = train_step.parse_args([
      '--models', name, '--steps', str(args.steps), '--warmup', str(args.warmup),
      '--batch_size', str(plan['batch_size']), '--inputs_length',
      str(shapes()['inputs_length']), '--targets_length', str(shapes()['targets_length']),
      '--dtype', shapes()['dtype']])
  with tempfile.TemporaryDirectory() as cache:
    peak, sample = train_step.peak_sampler()
    row = train_step.compare(name, step_args, cache, sample, scan_layers=True,
                             attention=attention())
  train_step.add_mfu(row, *peak())
  return [{**row, 'bench': 'gpu_side_by_side'}]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--parts', default=','.join(PARTS), help='any of ' + ', '.join(PARTS))
  parser.add_argument('--out', help='a folder for gpu.jsonl')
  parser.add_argument('--steps', type=int, default=10, help='timed steps per variant')
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--speed_budget_s', type=float, default=300,
                      help='variants past this many seconds of the sweep are skipped')
  args = parser.parse_args(argv)
  parts = args.parts.split(',')
  if set(parts) - set(PARTS):
    parser.error(f'--parts: unknown {sorted(set(parts) - set(PARTS))}')
  header = {'bench': 'gpu', 'backend': jax.default_backend(),
            'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
            'date': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}
  rows = [header]
  print(json.dumps(header), flush=True)
  if 'correctness' in parts:
    for row in correctness():
      rows.append(row)
      print(json.dumps(row), flush=True)
  if 'hf' in parts:  # before the sweep, while JAX's allocator has not grown: torch needs room
    for row in side_by_side(args):
      rows.append(row)
      print(json.dumps(row), flush=True)
  if 'speed' in parts:
    rows += speed(args)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, 'gpu.jsonl'), 'w', encoding='utf-8') as f:
      f.writelines(json.dumps(row) + '\n' for row in rows)
  return 0 if all(row.get('pass', True) for row in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
