"""Train-step speed of t5lite against Hugging Face's PyTorch T5, side by side in one process.

Both frameworks train the same preset dimensions on the same synthetic batch (`data.source=
synthetic`) with AdamW and global-norm clipping at 1.0 (the preset's clip). PyTorch runs twice:
eager, as most HF users train (`hf_torch`), and at its fastest (`hf_torch_compile`):
`torch.compile`, SDPA attention and fused AdamW. Their steps alternate (A B C A B C ...) and the
medians are reported, so that load from other processes on a shared machine hits both alike;
median process CPU seconds per step (`*_step_cpu_s`) are the steadier number on a busy machine.
Both use every core: XLA's CPU client by default, torch by `set_num_threads`.
On CPU, peak memory is the resident-set high-water mark (VmHWM) while steps run, measured in a
fresh child process per framework (after compilation for t5lite, which the child reads from this
run's compilation cache). On GPU it is each allocator's peak. MFU is the analytic matmul count of
`t5lite.train.flops` over the measured float32 matmul rate (CPU) or the published bf16 peak.

  python bench/train_step.py                       # CPU: t5_tiny, t5_1_1_small, float32
  python bench/train_step.py --models t5_1_1_small --steps 20 --batch_size 16
  python bench/train_step.py                       # GPU: t5_1_1_base, bfloat16, 512/114
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# JAX would otherwise take 75% of GPU memory up front and leave torch none.
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
# Idle torch (OpenMP) threads sleep instead of spinning: on a shared CPU, spinning threads take
# cores from the other framework's step and from each other (4-10x slower steps, measured).
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

import flax  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
# torch and transformers are imported where used: they take about 5 s to import on a 2-core
# machine, which bench/gpu.py's jobs that time t5lite alone (one process each) do not pay.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from t5lite import config as config_lib  # noqa: E402
from t5lite import objectives  # noqa: E402
from t5lite.inputs import batches as batches_lib  # noqa: E402
from t5lite.train import flops as flops_lib  # noqa: E402
from t5lite.train import mesh as mesh_lib  # noqa: E402
from t5lite.train import run as run_lib  # noqa: E402

# Defaults by JAX backend: a few minutes on a 2-core CPU; T5 v1.1 base at its pretraining lengths.
DEFAULTS = {
    'cpu': dict(models='t5_tiny,t5_1_1_small', dtype='float32', batch_size=8, inputs_length=128,
                targets_length=32, steps=10, warmup=2),
    'gpu': dict(models='t5_1_1_base', dtype='bfloat16', batch_size=32, inputs_length=512,
                targets_length=114, steps=20, warmup=3),
}
LEARNING_RATE = 1e-4
FRAMEWORKS = ('t5lite', 'hf_torch', 'hf_torch_compile')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', help='comma-separated presets from configs/')
  parser.add_argument('--steps', type=int, help='timed steps per framework')
  parser.add_argument('--warmup', type=int, help='untimed steps per framework first')
  parser.add_argument('--batch_size', type=int)
  parser.add_argument('--inputs_length', type=int)
  parser.add_argument('--targets_length', type=int)
  parser.add_argument('--dtype', choices=('float32', 'bfloat16'), help='compute dtype')
  parser.add_argument('--probe', choices=FRAMEWORKS, help=argparse.SUPPRESS)  # memory child
  args = parser.parse_args(argv)
  backend = 'gpu' if jax.default_backend() == 'gpu' else 'cpu'
  for name, value in DEFAULTS[backend].items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  return args


def run_config(name: str, args, **model):
  """The preset with the benchmark's batch, lengths and dtype, AdamW at a constant rate, and
  t5lite's `model` settings changed (e.g. scan_layers=True)."""
  config = config_lib.load(os.path.join(ROOT, 'configs', f'{name}.py'))
  config.model.update(dtype=args.dtype, **model)
  config.data.update(batch_size=args.batch_size, inputs_length=args.inputs_length,
                     targets_length=args.targets_length, source=batches_lib.SYNTHETIC)
  config.train.steps = args.warmup + args.steps
  config.optim.update(name='adamw', schedule='constant', learning_rate=LEARNING_RATE,
                      weight_decay=0.0)
  return config


def synthetic_batch(config) -> dict:
  """The run's first synthetic batch: random tokens, no padding, shifted right as T5 feeds them."""
  return next(batches_lib.make_batches(config.data, process_index=0, process_count=1))


def t5lite_step(config, batch: dict, *, packed: bool = False):
  """(step, info): `step()` runs one jitted train step on one device and waits for its loss.
  `packed` gives the model the rows' segment ids, which a pretraining run leaves out."""
  run = run_lib.make_run(config, mesh_lib.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1},
                                                     jax.devices()[:1]), reads_text=False)
  loss = (objectives.for_run(config, run.model_cfg).loss(run.model_cfg, config.train) if packed
          else run.loss())
  with run.sharding():
    state = run.spec.init()
    device_batch = {k: jax.device_put(v, run.batch_sharding) for k, v in batch.items()}
    start = time.perf_counter()
    compiled = run.jit_train_step(loss).lower(state, device_batch, None).compile()
    compile_s = time.perf_counter() - start
  memory = compiled.memory_analysis()
  holder = {'state': state}

  def step() -> float:
    holder['state'], metrics = compiled(holder['state'], device_batch, None)
    return float(metrics['loss'])  # waits for the step

  xla_bytes = (memory.argument_size_in_bytes + memory.output_size_in_bytes
               - memory.alias_size_in_bytes + memory.temp_size_in_bytes) if memory else None
  return step, {'compile_s': round(compile_s, 2), 'xla_memory_mib': mib(xla_bytes),
                'attention': run.model_cfg.attention, **fused_attention_calls(compiled.as_text())}


def fused_attention_calls(hlo: str) -> dict:
  """cuDNN's fused attention calls in a compiled step (a scanned stack's once for all its
  layers): forward calls past the forward pass's three are remat recomputing attention."""
  targets = re.findall(r'custom_call_target="__cudnn\$fmha([A-Za-z]*)"', hlo)
  backward = sum('Backward' in target for target in targets)
  return {'cudnn_forward_calls': len(targets) - backward, 'cudnn_backward_calls': backward}


def hf_config(model_cfg, attention: str = 'eager') -> 'transformers.T5Config':
  """The Hugging Face T5Config of a t5lite T5 preset (same dims, activation and tying)."""
  import transformers  # pylint: disable=import-outside-toplevel
  return transformers.T5Config(
      vocab_size=model_cfg.vocab_size, d_model=model_cfg.d_model, d_kv=model_cfg.d_kv,
      d_ff=model_cfg.d_ff, num_layers=model_cfg.num_encoder_layers,
      num_decoder_layers=model_cfg.num_decoder_layers, num_heads=model_cfg.num_heads,
      relative_attention_num_buckets=model_cfg.relative_buckets,
      relative_attention_max_distance=model_cfg.relative_max_distance,
      dropout_rate=model_cfg.dropout, layer_norm_epsilon=model_cfg.norm_eps,
      feed_forward_proj=model_cfg.activation, tie_word_embeddings=model_cfg.tie_embeddings,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, attn_implementation=attention)


def torch_step(config, batch: dict, device: str, *, fastest: bool = False):
  """(step, info): `step()` runs forward, backward, clipping and AdamW, as eager HF users do, or
  `fastest`: the model under torch.compile, SDPA attention, fused AdamW (compiled at the first
  steps, which the benchmark's warmup leaves out)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(config.train.seed)
  model = transformers.T5ForConditionalGeneration(hf_config(
      config_lib.model_config(config), attention='sdpa' if fastest else 'eager'))
  model.to(device).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.999),
                                eps=1e-8, weight_decay=0.0, fused=fastest)
  forward = torch.compile(model) if fastest else model
  inputs = torch_inputs(batch, device)
  autocast = (torch.autocast(device, dtype=torch.bfloat16) if config.model.dtype == 'bfloat16'
              else contextlib.nullcontext())

  def step() -> float:
    optimizer.zero_grad(set_to_none=True)
    with autocast:
      loss = forward(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()  # waits for the step (CUDA too)

  return step, {'attention': model.config._attn_implementation}  # pylint: disable=protected-access


def torch_inputs(batch: dict, device: str) -> dict:
  """A t5lite encoder-decoder batch as `T5ForConditionalGeneration`'s keyword arguments: the
  encoder attends to its tokens, not to padding (id 0), and the labels are -100 (ignored) where
  the loss weight is 0. For rows of one example each (HF's T5 cannot read packed rows)."""
  import torch  # pylint: disable=import-outside-toplevel
  tensors = {k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in batch.items()}
  return dict(input_ids=tensors['encoder_input_tokens'],
              attention_mask=tensors['encoder_input_tokens'] != 0,
              decoder_input_ids=tensors['decoder_input_tokens'],
              labels=tensors['decoder_target_tokens'].masked_fill(
                  tensors['decoder_loss_weights'] == 0, -100))


def torch_device() -> str | None:
  """Where torch runs: beside JAX's device kind, or nowhere if JAX has a GPU and torch has not."""
  import torch  # pylint: disable=import-outside-toplevel
  if jax.default_backend() != 'gpu':
    return 'cpu'
  return 'cuda' if torch.cuda.is_available() else None


def interleaved_times(steps: dict, warmup: int, timed: int, each_round=None) -> dict:
  """Per-framework (wall, process CPU) seconds per step, one step of each in turn: A B A B ...

  CPU time counts this process's threads only, so it moves less than wall time when other
  processes share the cores; wall time is what a run waits for. `each_round()` runs once
  per timed round, between the steps.
  """
  times = {name: ([], []) for name in steps}
  for i in range(warmup + timed):
    if i >= warmup and each_round:
      each_round()
    for name, step in steps.items():
      wall, cpu = time.perf_counter(), time.process_time()
      loss = step()
      if i >= warmup:
        times[name][0].append(time.perf_counter() - wall)
        times[name][1].append(time.process_time() - cpu)
      if not np.isfinite(loss):
        raise FloatingPointError(f'{name} loss is {loss} at step {i}')
  return times


def peak_sampler():
  """(peak(), sample): the device's peak FLOP/s; on CPU the best of flops.py's matmul rate over
  every `sample()`, since one measurement on a shared machine can land in a busy moment."""
  device = jax.devices()[0]
  if device.platform != 'cpu':
    return lambda: flops_lib.peak_flops_per_device(device), None
  rates = [flops_lib.measured_matmul_flops(device)]
  def sample():
    rates.append(flops_lib.measured_matmul_flops.__wrapped__(device, repeats=2))
  return lambda: (max(rates), f'measured cpu, best of {len(rates)} samples'), sample


def mib(num_bytes) -> float | None:
  return None if num_bytes is None else round(num_bytes / 2**20, 1)


def rss_kib(field: str) -> int:
  with open('/proc/self/status', encoding='ascii') as f:
    return int(re.search(rf'{field}:\s+(\d+)', f.read()).group(1))


def probe_memory(name: str, args) -> dict:
  """In this (child) process: resident memory while `args.probe`'s framework trains `name`."""
  config = run_config(name, args)
  batch = synthetic_batch(config)
  imports_kib = rss_kib('VmRSS')
  build = t5lite_step if args.probe == 't5lite' else lambda c, b: torch_step(
      c, b, 'cpu', fastest=args.probe == 'hf_torch_compile')
  step, _ = build(config, batch)
  with open('/proc/self/clear_refs', 'w', encoding='ascii') as f:
    f.write('5')  # reset VmHWM: count the steps, not the compiler
  for _ in range(3):
    step()
  peak_kib = rss_kib('VmHWM')
  return {'peak_rss_mib': mib(peak_kib * 1024),
          'peak_rss_above_imports_mib': mib((peak_kib - imports_kib) * 1024)}


def cpu_peak_memory(name: str, args, framework: str, cache_dir: str) -> dict:
  """Runs `probe_memory` in a fresh child so that one framework's memory never counts twice."""
  command = [sys.executable, os.path.abspath(__file__), '--probe', framework, '--models', name]
  for flag in ('batch_size', 'inputs_length', 'targets_length', 'dtype', 'steps', 'warmup'):
    command += [f'--{flag}', str(getattr(args, flag))]
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache_dir)
  out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def gpu_peak_memory(framework: str) -> dict:
  """The allocator's peak on the device since the process started (each framework has its own)."""
  import torch  # pylint: disable=import-outside-toplevel
  if framework == 't5lite':
    peak = (jax.local_devices()[0].memory_stats() or {}).get('peak_bytes_in_use')
  else:
    peak = torch.cuda.max_memory_allocated()
  return {'peak_device_memory_mib': mib(peak)}


def compare(name: str, args, cache_dir: str, sample_peak, *, cpu_memory: bool = True,
            **model) -> dict:
  """One row (MFU still to add): both frameworks on preset `name`, timed in alternation; on
  CPU, without `cpu_memory`, no child processes measure peak memory."""
  config = run_config(name, args, **model)
  model_cfg = config_lib.model_config(config)
  batch = synthetic_batch(config)
  steps, info = {}, {}
  steps['t5lite'], info['t5lite'] = t5lite_step(config, batch)
  device = torch_device()
  if device:
    for framework in FRAMEWORKS[1:]:
      steps[framework], info[framework] = torch_step(
          config, batch, device, fastest=framework == 'hf_torch_compile')
  times = interleaved_times(steps, args.warmup, args.steps, sample_peak)
  tokens = args.batch_size * (args.inputs_length + args.targets_length)
  row = {'bench': 'train_step', 'model': name, 'dtype': args.dtype,
         'batch_size': args.batch_size, 'inputs_length': args.inputs_length,
         'targets_length': args.targets_length, 'steps': args.steps, 'warmup': args.warmup}
  for framework, (seconds, cpu_seconds) in times.items():
    median = statistics.median(seconds)
    row.update({f'{framework}_step_s': round(median, 4),
                f'{framework}_step_s_min': round(min(seconds), 4),
                f'{framework}_step_cpu_s': round(statistics.median(cpu_seconds), 4),
                f'{framework}_tokens_per_s': round(tokens / median, 1)})
    row.update({f'{framework}_{k}': round(v, 2) if isinstance(v, float) else v
                for k, v in info[framework].items()})
    memory = (gpu_peak_memory(framework) if jax.default_backend() == 'gpu'
              else cpu_peak_memory(name, args, framework, cache_dir) if cpu_memory else {})
    row.update({f'{framework}_{k}': v for k, v in memory.items()})
  for framework, suffix in (('hf_torch', ''), ('hf_torch_compile', '_vs_compiled')):
    if framework in times:  # >1: t5lite faster
      row[f'speedup{suffix}'] = round(row[f'{framework}_step_s'] / row['t5lite_step_s'], 3)
      if jax.default_backend() == 'cpu':  # on GPU it is host time only
        row[f'speedup_cpu{suffix}'] = round(
            row[f'{framework}_step_cpu_s'] / row['t5lite_step_cpu_s'], 3)
  row['train_flops_per_step'] = flops_lib.train_flops_per_step(
      model_cfg, args.inputs_length, args.targets_length, batch_size=args.batch_size)
  return row


def add_mfu(row: dict, peak: float, peak_name: str) -> None:
  """Adds each framework's MFU; done last, so that every row shares the run's best CPU rate."""
  for framework in FRAMEWORKS:
    if f'{framework}_step_s' in row:
      row[f'{framework}_mfu'] = round(
          row['train_flops_per_step'] / row[f'{framework}_step_s'] / peak, 4)
  row.update(peak_flops=round(peak), peak_flops_source=peak_name)


def machine_info() -> dict:
  """What the numbers depend on: processor, cores, memory, library versions, load, date."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    cpu = re.search(r'model name\s*:\s*(.*)', f.read())
  with open('/proc/meminfo', encoding='utf-8') as f:
    memory_kib = int(re.search(r'MemTotal:\s+(\d+)', f.read()).group(1))
  return {
      'device': jax.devices()[0].device_kind, 'backend': jax.default_backend(),
      'cpu': cpu.group(1).strip() if cpu else platform.processor(),
      'cores': len(os.sched_getaffinity(0)), 'memory_gib': round(memory_kib / 2**20, 1),
      'threads': torch.get_num_threads(), 'omp_wait_policy': os.environ['OMP_WAIT_POLICY'],
      'load_avg_1m': round(os.getloadavg()[0], 2),
      'jax': jax.__version__, 'flax': flax.__version__,
      'torch': torch.__version__, 'transformers': transformers.__version__,
      'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
  }


def main(argv=None) -> None:
  import torch  # pylint: disable=import-outside-toplevel
  args = parse_args(argv)
  # Same threads for both: XLA's CPU client uses every core it may run on; so does torch here.
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  if args.probe:
    jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
    print(json.dumps(probe_memory(args.models, args)), flush=True)
    return
  with tempfile.TemporaryDirectory(prefix='t5lite_bench_cache_') as cache_dir:
    # A fresh cache: the timed compile is a real one, the memory children reuse its result.
    jax.config.update('jax_compilation_cache_dir', cache_dir)
    peak_flops, sample_peak = peak_sampler()
    rows = [{**compare(name, args, cache_dir, sample_peak), **machine_info()}
            for name in args.models.split(',')]
  for row in rows:  # MFU against the best rate sampled over the whole run
    add_mfu(row, *peak_flops())
    print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
