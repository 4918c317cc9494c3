"""One command on a bare GPU machine: is t5lite correct there, how fast, against what, and where
its step goes.

  python bench/gpu.py --out=$OUT                     # every job, within --budget_s seconds
  python bench/gpu.py --out=$OUT --jobs=correctness,speed:t5_1_1_large   # those (by prefix)
  python bench/gpu.py --list                         # the jobs in order, with their timeouts

Each job runs in a child process of its own, with its own timeout, and appends its JSON lines to
--out/gpu.jsonl as it goes (and prints them; children's stderr goes to --out/jobs.log): a crash,
a hang or an out-of-memory costs that job one row with its error, not the call
(`bench/record.py --add` puts that file's figures in the record). The children share a
persistent compilation cache. The jobs, in order:
- correctness (t5_tiny, two layers a stack): 5 float32 steps on the default device equal the CPU
  backend's (matmul precision 'highest', rtol 1e-4); bfloat16's losses within 2% of float32's
  over 50 steps memorising one batch; greedy decoding equals `transformers`' generate (on CUDA);
- attention: each kernel (`xla`, `flash`; on a GPU also bfloat16 `xla`, `cudnn` and `flash`)
  against `einsum`, with T5's relative bias, two packed segments and padding, forward and the
  four gradients (q, k, v, the bias table);
- attention_speed: encoder, decoder and cross-attention at t5_1_1_base's shapes (512/114) and at
  2,048/512 with as many tokens, rows packing 1-4 examples: each kernel's forward and backward
  timed, checked against float32 `einsum`, with XLA's scratch memory (`temp_mib`);
- profile:MODEL:CHANGE: a variant's step (PROFILED) traced with `jax.profiler` beside XLA's HLO
  dump: device time by instruction, source line, kind and phase (bench/step_profile.py), both
  archived (trace_CHANGE.tar.gz, xla_dump_CHANGE.tar.gz);
- hf: the first preset (SIDE_BY_SIDE: its fastest attention, half the batch) beside Hugging
  Face's T5, eager and compiled (SDPA, fused AdamW), steps alternating in one process
  (bench/train_step.py);
- hf_alone:BATCH: Hugging Face's T5 at its fastest alone in its process, at batch 128 and 32,
  for the speed rows of t5lite at those batches (together they did not fit at 128);
- speed:MODEL:CHANGE: each preset's baseline (bfloat16, 512/114, BASELINE: scanned layers,
  save_dots remat, `xla` attention) and one setting changed at a time (a config field, XLA
  flags, or `rows=packed`: the model fed the rows' segment ids, as before pretraining rows
  went without), and the GPU speed issue's LEVERS: tokens/s, MFU by t5lite/train/flops.py
  against the device's peak, XLA's memory estimate, the allocator's peak, compile time (or its
  load from the shared cache), the cuDNN attention calls compiled (of scanned stacks: forward
  calls past the forward pass's three are remat recomputing attention);
- resume: `t5lite train` on synthetic batches with checkpoints, once through and once SIGKILLed
  and resumed; every step's loss compared bit for bit (those before the checkpoint it resumed
  from compare two runs of one config, those after compare resuming), the two runs' saves of
  that step, and the first run resumed from its own save; resume:flash the same with the flash
  kernel, resume:auto with the default kernel, and under XLA's deterministic ops;
- plan: `t5lite plan` for this machine (e.g. 1xH200, compiled on it) against the allocator's
  peak that the resume job's run logged.
On CPU the same jobs run on t5_tiny at tiny shapes, one layer a stack and fewer steps
(tests/bench/test_gpu.py):
every path is tested there, and no figure means anything.
"""

import argparse
import collections
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

# bench/train_step.py: the preset setup, the timed step and the PyTorch side; importing it first
# sets the environment both frameworks run in (JAX leaves GPU memory to torch) and puts the
# repository on the path
import train_step  # pylint: disable=wrong-import-order

import jax  # noqa: E402
# JAX's own cuDNN wrapper: its packed-segment layout, which jax.nn.dot_product_attention lacks
from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import step_profile  # noqa: E402
from t5lite import config as config_lib  # noqa: E402
from t5lite.commands import plan as plan_lib  # noqa: E402
from t5lite.inputs import batches as batches_lib  # noqa: E402
from t5lite.models import attention as attention_lib  # noqa: E402
from t5lite.models import decoding  # noqa: E402
from t5lite.models.positions import (  # noqa: E402
    BucketedBias, RelativeBuckets, RelativePositionBias, relative_position_bucket)
from t5lite.train import checkpoint as checkpoint_lib  # noqa: E402
from t5lite.train import flops as flops_lib  # noqa: E402
from t5lite.train import mesh as mesh_lib  # noqa: E402
from t5lite.train import run as run_lib  # noqa: E402

ONE_DEVICE = {'data': 1, 'fsdp': 1, 'tensor': 1}
# XLA flag sets a speed job may run under: cuBLAS for every GEMM; and what MaxText sets for GPUs
# (its collective ones do nothing on one GPU).
XLA_FLAGS = {
    'no_triton_gemm': '--xla_gpu_enable_triton_gemm=false',
    'maxtext': ('--xla_gpu_enable_latency_hiding_scheduler=true '
                '--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_command_buffer= '
                '--xla_gpu_enable_highest_priority_async_stream=true '
                '--xla_gpu_enable_while_loop_double_buffering=true'),
    # the scanned layers' parameters sliced inside the kernels that read them, not copied out
    'dynamic_slice': '--xla_gpu_enable_dynamic_slice_fusion=true',
    # Triton GEMMs, which can take elementwise producers and consumers into the matmul (the
    # bench's command turns them off for cuBLAS; a later flag wins)
    'triton_gemm': '--xla_gpu_enable_triton_gemm=true',
    # every op's deterministic algorithm (cuDNN attention's backward among them), for a bitwise
    # resume, at what cost
    'deterministic': '--xla_gpu_deterministic_ops=true',
}
# The GPU speed issue's levers that are settings, each measured against cuDNN attention on rows of
# one example (`rows=packed` feeds the model the rows' segment ids: the (b, 1, q, k) mask that cuDNN
# folds into a (b, heads, q, k) bias, as every run did before). A fused AdamW update, fused
# projections and a remat policy saving attention were measured on an H200 and not kept
# (docs/notes/gpu.md, 2026-11-28).
LEVERS = ({'xla': 'dynamic_slice'}, {'model.scan_unroll': 2}, {'xla': 'triton_gemm'})
CUDNN = {'model.attention': 'cudnn'}
SWEEP = {
    't5_1_1_base': (128, [
        {}, {'model.attention': 'cudnn'}, {'model.scan_layers': False}, {'data.batch_size': 256},
        {'xla': 'no_triton_gemm'}, {'xla': 'maxtext'}, {'model.remat_policy': 'none'},
        {'train.loss_chunks': 4}, {'data.batch_size': 64},
        {'model.attention': 'cudnn', 'model.scan_layers': False},
        {'model.attention': 'cudnn', 'model.remat_policy': 'none'},
        {'model.attention': 'cudnn', 'model.scan_layers': False, 'model.remat_policy': 'none'},
        {'model.attention': 'flash'}, {'model.attention': 'flash', 'model.remat_policy': 'none'},
        {**CUDNN, 'rows': 'packed'}, *({**CUDNN, **lever} for lever in LEVERS),
        {**CUDNN, 'data.batch_size': 32}, {**CUDNN, 'xla': 'deterministic'}]),
    't5_1_1_large': (64, [
        {}, {'model.attention': 'cudnn'}, {'data.batch_size': 128},
        {'model.remat_policy': 'full'},
        {'model.attention': 'cudnn', 'model.scan_layers': False},
        {'model.attention': 'cudnn', 'model.scan_layers': False, 'model.remat_policy': 'none'},
        {**CUDNN, 'rows': 'packed'}]),
}
# The batches Hugging Face's compiled T5 is timed at alone (hf_alone), beside t5lite's speed rows
HF_ALONE_BATCHES = (128, 32)
# The resume jobs' settings over BASELINE: resume (xla), resume:flash, and resume:auto, the
# default (cuDNN's kernel on a GPU, XLA's on CPU)
RESUMED = {'xla': {'model.attention': 'xla'}, 'flash': {'model.attention': 'flash'},
           'auto': {'model.attention': 'auto'}}
# Keys of a change that are not config fields: XLA flags, and the rows' segment ids fed or not
BENCH_KEYS = ('xla', 'rows')
# The side by side runs t5lite as it is fastest (cuDNN attention: 1.65x the baseline's step on
# an H100, 2026-11-26) at a quarter of the baseline batch: its three models live at once, and at
# 64 PyTorch's two (53.5 GiB) beside t5lite's allocator pool ran out of an H100's 80 GB.
SIDE_BY_SIDE = ({'model.attention': 'cudnn'}, 4)
# On an H200 (2026-11-26) unrolled t5_1_1_base did not get through compiling in 79 s (nor in
# 150 s with the HLO dump on) where scanned compiled within 42 s, and scanned without remat took
# 96 GiB at batch 128 (XLA keeps every layer's intermediates; the analytic plan says 47);
# save_dots (22 GiB analytic) leaves room on an 80 GiB H100, and for PyTorch beside t5lite.
BASELINE = {'model.scan_layers': True, 'model.remat_policy': 'save_dots', 'model.attention': 'xla'}
# The variants the profile jobs trace: the baseline, and cuDNN's fused attention (no
# batch x heads x length x length logits in memory) on a GPU.
PROFILED = ({}, {'model.attention': 'cudnn'})
CPU_MODEL, CPU_BATCH_DIVISOR = 't5_tiny', 32
# Fewer layers than t5_tiny's four a stack, for less compiling: two in the correctness checks on a
# GPU (on an H200 they spent 148 s, mostly compiling, at four), one in every job on CPU (where
# the jobs run to check their paths, in tests/bench/test_gpu.py).
LAYERS = {'gpu': 2, 'cpu': 1}
# Seconds a job may take on a GPU (compiles included); on CPU each gets CPU_TIMEOUT_S.
TIMEOUT_S = {'correctness': 150, 'attention': 90, 'attention_speed': 300, 'profile': 150,
             'hf': 180, 'speed': 120, 'resume': 300, 'plan': 150}
CPU_TIMEOUT_S = 600
# The resume job's run: steps and checkpoint interval.
RESUME = {'gpu': (12, 4), 'cpu': (8, 2)}
# Steps of the bfloat16 check's memorising runs; t5_tiny has the batch by step 10 (loss 9.5 to
# 0.03), and on CPU, where each step of the two runs is slow, the check stops soon after.
MEMORISING_STEPS = {'gpu': 50, 'cpu': 12}
STEP_LINE = re.compile(r'step (\d+)/')


def on_gpu() -> bool:
  return jax.default_backend() == 'gpu'


def preset(name: str, *, dtype: str, batch_size: int, inputs_length: int, targets_length: int,
           learning_rate: float = train_step.LEARNING_RATE, **overrides):
  """bench/train_step.py's setup of a preset (synthetic batches at the given shapes, AdamW at a
  constant rate, the same step as its side by side compiles), without dropout, and with
  `overrides` ({'model.scan_layers': True, ...})."""
  shape = argparse.Namespace(dtype=dtype, batch_size=batch_size, inputs_length=inputs_length,
                             targets_length=targets_length, warmup=0, steps=1)
  config = train_step.run_config(name, shape, dropout=0.0)
  config.optim.learning_rate = learning_rate
  for key, value in overrides.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def shapes() -> dict:
  gpu = on_gpu()
  return dict(dtype='bfloat16' if gpu else 'float32', inputs_length=512 if gpu else 32,
              targets_length=114 if gpu else 8)


def fewer_layers() -> dict:
  layers = LAYERS['gpu' if on_gpu() else 'cpu']
  return {'num_encoder_layers': layers, 'num_decoder_layers': layers}


def model_fields() -> dict:
  """Model settings of the speed, profile, hf and resume jobs besides the preset's."""
  return {} if on_gpu() else fewer_layers()


def first_batches(config, count: int) -> list[dict]:
  stream = batches_lib.make_batches(config.data, process_index=0, process_count=1)
  return [next(stream) for _ in range(count)]


# ---- correctness and attention -----------------------------------------------------------------

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


def memorising(dtype: str):
  """t5_tiny with `fewer_layers()`, at a rate that memorises one batch within
  MEMORISING_STEPS (so that losses move)."""
  return preset('t5_tiny', dtype=dtype, batch_size=8, inputs_length=64, targets_length=16,
                learning_rate=1e-3, **{f'model.{k}': v for k, v in fewer_layers().items()})


def check_device_equals_cpu() -> dict:
  config = memorising('float32')
  batches = first_batches(config, 5)
  with jax.default_matmul_precision('highest'):
    device, _ = train(config, batches, jax.devices()[0])
    cpu, _ = train(config, batches, jax.devices('cpu')[0])
  difference = relative_difference(device, cpu)
  return {'check': 'float32_device_equals_cpu', 'device_losses': device, 'cpu_losses': cpu,
          'max_relative_difference': difference, 'rtol': 1e-4, 'pass': difference <= 1e-4}


def check_bfloat16_tracks_float32() -> tuple[dict, object]:
  """MEMORISING_STEPS on one batch in both dtypes; returns the float32 run too, for decoding."""
  steps = MEMORISING_STEPS['gpu' if on_gpu() else 'cpu']
  losses, runs = {}, {}
  for dtype in ('float32', 'bfloat16'):
    config = memorising(dtype)
    batches = [train_step.synthetic_batch(config)] * steps
    losses[dtype], runs[dtype] = train(config, batches, jax.devices()[0])
  f32, bf16 = losses['float32'], losses['bfloat16']
  mean_difference = abs(np.mean(bf16) - np.mean(f32)) / np.mean(f32)
  last_difference = abs(bf16[-1] - f32[-1]) / f32[-1]
  row = {'check': 'bfloat16_tracks_float32', 'steps': steps, 'float32_losses': f32[::10] + f32[-1:],
         'bfloat16_losses': bf16[::10] + bf16[-1:], 'mean_loss_difference': mean_difference,
         'last_loss_difference': last_difference,
         'max_step_difference': relative_difference(bf16, f32), 'tolerance': 0.02,
         'pass': bool(mean_difference <= 0.02 and last_difference <= 0.02)}
  return row, runs['float32']


def check_greedy_equals_transformers(run, params) -> dict:
  """Greedy decoding of the memorising float32 model, t5lite's against transformers'."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from t5lite.export import hf  # pylint: disable=import-outside-toplevel
  inputs = train_step.synthetic_batch(run.config)['encoder_input_tokens'][:4]
  with run.sharding(), jax.default_matmul_precision('highest'):
    ours = np.asarray(decoding.generate(run.model(params), jnp.asarray(inputs),
                                        max_decode_length=16))
  device = 'cuda' if on_gpu() and torch.cuda.is_available() else 'cpu'
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
  return [check_device_equals_cpu(), bfloat16, check_greedy_equals_transformers(run, params)]


def check_attention_kernels() -> list[dict]:
  """Every kernel against `einsum` with T5's bias and two packed examples plus padding, in
  encoder (bidirectional) and decoder (causal) self-attention: the output and the gradients of q,
  k, v and of the bias table; a kernel that fails to compile or run is a row with its error, the
  others still compared. `flash` reads the layout and the table where the others read the mask
  and the bias built from the same arguments (on CPU in Pallas' interpreter)."""
  cfg = config_lib.model_config(memorising('float32'))
  length, heads, d = 64, cfg.num_heads, cfg.d_kv
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, cotangent = (jax.random.normal(key, (2, length, heads, d)) for key in keys)
  segments = jnp.array([[1] * 40 + [2] * 20 + [0] * 4, [1] * 64])
  real = (segments > 0)[:, :, None, None]  # padding queries attend to nothing: left out
  kernels = [('xla', jnp.float32, 1e-4), ('flash', jnp.float32, 1e-4)]
  if on_gpu():
    kernels += [('xla', jnp.bfloat16, 2e-2), ('cudnn', jnp.bfloat16, 2e-2),
                ('flash', jnp.bfloat16, 2e-2)]

  def outputs(implementation, dtype, masks, buckets, table):
    def loss(q, k, v, table):
      flash = implementation == 'flash'
      bias = BucketedBias(table, buckets)
      out = attention_lib.dot_product_attention(
          q.astype(dtype), k.astype(dtype), v.astype(dtype), mask=masks[flash],
          bias=bias if flash else bias.dense(length, length), implementation=implementation)
      return jnp.sum(jnp.where(real, out.astype(jnp.float32) * cotangent, 0.0))
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, table)
    return [value, *grads]

  row, passed = {'check': 'attention_kernels_agree'}, True
  for causal in (False, True):
    bias = RelativePositionBias(cfg, bidirectional=not causal, rngs=nnx.Rngs(1)).bucketed()
    args = (length, None if causal else segments > 0)
    kwargs = dict(query_segment_ids=segments, key_segment_ids=segments, causal=causal)
    masks = (attention_lib.attention_mask(*args, **kwargs),
             attention_lib.attention_layout(*args, **kwargs))
    reference = {dtype: outputs('einsum', dtype, masks, bias.buckets, bias.table)
                 for dtype in {d for _, d, _ in kernels}}
    for implementation, dtype, tolerance in kernels:
      name = f'{implementation}_{jnp.dtype(dtype).name}' + ('_causal' if causal else '')
      try:
        got = outputs(implementation, dtype, masks, bias.buckets, bias.table)
      except Exception as error:  # pylint: disable=broad-except  # e.g. cuDNN has no plan
        row[name], passed = {'error': first_line(error)}, False
        continue
      errors = [float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-12))
                for a, b in zip(got, reference[dtype])]
      row[name] = dict(zip(('forward', 'd_query', 'd_key', 'd_value', 'd_table'), errors))
      passed &= max(errors) <= tolerance
  if not on_gpu():
    row['cudnn'] = 'not run: needs a GPU'
  return [{**row, 'pass': bool(passed)}]


def packed_segments(segments: jax.Array, most: int) -> tuple[jax.Array, jax.Array]:
  """Segment ids (b, l), 1, 2, ... in order and 0 on trailing padding -> cuDNN's packed layout:
  lengths (b, most) and start offsets (b, most + 1), -1 where a row has fewer segments."""
  ids = jnp.arange(1, most + 1)
  lengths = jnp.sum(segments[:, None, :] == ids[None, :, None], axis=-1).astype(jnp.int32)
  starts = jnp.cumsum(lengths, axis=1) - lengths
  lengths = jnp.where(lengths > 0, lengths, -1)
  starts = jnp.where(lengths > 0, starts, -1).astype(jnp.int32)
  return lengths, jnp.pad(starts, ((0, 0), (0, 1)), constant_values=-1)


def packed_rows(batch: int, length: int, most: int, seed: int) -> np.ndarray:
  """Segment ids (batch, length) of rows packing 1 to `most` examples, and trailing padding."""
  rng = np.random.default_rng(seed)
  positions, rows = np.arange(length), []
  for _ in range(batch):
    cuts = np.sort(rng.choice(np.arange(1, length), size=most, replace=False))
    used = cuts[-1] + (length - cuts[-1]) // 2  # padding after this
    examples = rng.integers(1, most + 1)
    ids = 1 + np.searchsorted(cuts[:examples - 1], positions, side='right')
    rows.append(np.where(positions < (used if examples == most else cuts[examples - 1]), ids, 0))
  return np.array(rows, np.int32)


def attention_speed(args):
  """t5_1_1_base's three attentions (on CPU t5_tiny's at tiny shapes): encoder self-attention
  with the relative bias, decoder self-attention (causal, with the bias) and cross-attention, on
  rows packing up to 4 examples; forward and backward timed per kernel, each checked against
  `einsum` in float32 with the segment mask: the output and the gradients of q, k, v and of the
  relative bucket table, on real positions. Candidates without the mask compute something else (no
  packing): lower bounds of a kernel's time."""
  gpu = on_gpu()
  cfg = config_lib.model_config(preset('t5_1_1_base' if gpu else CPU_MODEL, dtype='bfloat16',
                                       batch_size=1, inputs_length=8, targets_length=8))
  # t5_1_1_base's shapes, then as many tokens at 2,048/512 (on CPU tiny ones)
  for batch, inputs, targets in ((128, 512, 114), (32, 2048, 512)) if gpu else (
      (4, 32, 8), (2, 64, 16)):
    suffix = '' if inputs == (512 if gpu else 32) else f'_{inputs}'
    for case, (q_len, kv_len, causal, biased) in {
        'encoder': (inputs, inputs, False, True), 'decoder': (targets, targets, True, True),
        'cross': (targets, inputs, False, False)}.items():
      yield from attention_case(cfg, case + suffix, batch, q_len, kv_len, causal, biased, args)


def attention_case(cfg, case, batch, q_len, kv_len, causal, biased, args):
  """A row per kernel, yielded as each is done (the job's timeout then costs only the rest)."""
  gpu, most = on_gpu(), 4
  heads, d = cfg.num_heads, cfg.d_kv
  dtype = jnp.bfloat16 if gpu else jnp.float32
  keys = jax.random.split(jax.random.key(1), 4)
  q, cotangent = (jax.random.normal(key, (batch, q_len, heads, d), dtype) for key in keys[:2])
  k, v = (jax.random.normal(key, (batch, kv_len, heads, d), dtype) for key in keys[2:])
  q_segments = jnp.asarray(packed_rows(batch, q_len, most, 0))
  kv_segments = q_segments if q_len == kv_len else jnp.asarray(packed_rows(batch, kv_len, most, 1))
  if kv_segments is not q_segments:  # cross-attention: the same examples on both sides
    count = jnp.minimum(q_segments.max(1), kv_segments.max(1))[:, None]
    q_segments, kv_segments = (jnp.where(x <= count, x, 0) for x in (q_segments, kv_segments))
  real = (q_segments > 0)[:, :, None, None]
  mask = attention_lib.attention_mask(q_len, kv_segments > 0, query_segment_ids=q_segments,
                                      key_segment_ids=kv_segments, causal=causal)
  table = RelativePositionBias(cfg, bidirectional=not causal, rngs=nnx.Rngs(1)).embedding[...]
  bucket = relative_position_bucket(
      jnp.arange(kv_len)[None, :] - jnp.arange(q_len)[:, None], bidirectional=not causal,
      num_buckets=cfg.relative_buckets, max_distance=cfg.relative_max_distance)

  # The masks, segments and cotangent are arguments of the jitted steps, not constants in them:
  # XLA spent minutes constant-folding the decoder case's (on an H100, 2026-11-26).
  # Causal, the flash layout hides padding keys by segment alone: only padding queries, left
  # out of the loss, see them.
  flash_layout = attention_lib.attention_layout(
      q_len, None if causal else kv_segments > 0, query_segment_ids=q_segments,
      key_segment_ids=kv_segments, causal=causal)
  layout = {'bucket': bucket, 'mask': mask, 'flash': flash_layout, 'real': real,
            'q_segments': q_segments, 'kv_segments': kv_segments, 'cotangent': cotangent}

  def bias_of(table, bucket):  # (buckets, h) -> (1, h, q, k), as RelativePositionBias does
    return jnp.transpose(jnp.take(table, bucket, axis=0), (2, 0, 1))[None] if biased else None

  def packed(mask_type):
    def attend(q, k, v, table, layout):
      bias = bias_of(table, layout['bucket'])
      q_lengths, q_offsets = packed_segments(layout['q_segments'], most)
      kv_lengths, kv_offsets = packed_segments(layout['kv_segments'], most)
      out = cudnn_attention.dot_product_attention(
          q, k, v, None if bias is None else bias.astype(q.dtype), None, q_lengths, kv_lengths,
          q_offsets, kv_offsets, scale=1.0, mask_type=getattr(cudnn_attention.MaskType, mask_type))
      return jnp.where(layout['real'], out, 0)
    return attend

  def public(implementation, masked=True, bias_used=True):
    def attend(q, k, v, table, layout):
      return attention_lib.dot_product_attention(
          q, k, v, mask=layout['mask'] if masked else jnp.ones((1, 1, 1, 1), bool),
          bias=bias_of(table, layout['bucket']) if bias_used else None,
          implementation=implementation)
    return attend

  def flash(q, k, v, table, layout):  # the ids and the table: no (q, k) array at all
    buckets = RelativeBuckets(not causal, cfg.relative_buckets, cfg.relative_max_distance)
    return attention_lib.dot_product_attention(
        q, k, v, mask=layout['flash'], bias=BucketedBias(table, buckets) if biased else None,
        implementation='flash')

  candidates = {'einsum': public('einsum'), 'xla': public('xla'), 'flash': flash}
  if gpu:
    candidates.update({
        'cudnn': public('cudnn'),
        'cudnn_packed': packed('PADDING_CAUSAL' if causal else 'PADDING'),
        'cudnn_unmasked': public('cudnn', masked=False)})
    if biased:
      candidates['cudnn_unmasked_no_bias'] = public('cudnn', masked=False, bias_used=False)

  def gradients(attend):
    def loss(q, k, v, table, layout):
      out = attend(q, k, v, table, layout)
      return jnp.sum(jnp.where(layout['real'], out.astype(jnp.float32) * layout['cotangent'], 0.))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))

  def relative_error(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    if a.ndim == 4 and a.shape[1] == q_len:  # per query token: real positions only
      a, b = jnp.where(real, a, 0), jnp.where(real, b, 0)
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-12))

  grad_fns = {name: gradients(attend) for name, attend in candidates.items()}
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  # the einsum candidate's function: where it runs in float32 (CPU), its one compile serves both
  reference = grad_fns['einsum'](*f32, table, layout)
  for name, step in grad_fns.items():
    row = {'bench': 'gpu_attention_speed', 'case': case, 'kernel': name, 'batch': batch,
           'q_len': q_len, 'kv_len': kv_len, 'heads': heads, 'dtype': jnp.dtype(dtype).name}
    try:
      value, grads = jax.block_until_ready(step(q, k, v, table, layout))
      seconds = []
      for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        jax.block_until_ready(step(q, k, v, table, layout))
        if i >= args.warmup:
          seconds.append(time.perf_counter() - start)
      row['fwd_bwd_ms'] = round(1e3 * statistics.median(seconds), 3)
      row['temp_mib'] = temp_mib(step, q, k, v, table, layout)
      names = ('value', 'd_query', 'd_key', 'd_value', 'd_table')[:5 if biased else 4]
      row.update(zip(names, [relative_error(value, reference[0])] + [
          relative_error(a, b) for a, b in zip(grads, reference[1])]))
      row['finite'] = bool(all(jnp.isfinite(x).all() for x in (value, *grads)))
    except Exception as error:  # pylint: disable=broad-except  # the row says what failed
      row['error'] = f'{type(error).__name__}: {first_line(error)}'
    yield row


def temp_mib(step, *args) -> float | None:
  """XLA's scratch memory for a jitted function at these arguments (its arrays beside the
  inputs and outputs), where the backend reports it."""
  try:
    return round(step.lower(*args).compile().memory_analysis().temp_size_in_bytes / 2**20, 1)
  except (AttributeError, NotImplementedError):
    return None


def first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


# ---- speed, profile, Hugging Face --------------------------------------------------------------

def sweep() -> dict:
  """{preset: (baseline batch, changes)} for this backend."""
  if on_gpu():
    return SWEEP
  batch, changes = next(iter(SWEEP.values()))
  on_cpu = {}  # cuDNN needs a GPU: its changes run with the baseline's kernel, once each
  for change in changes:
    change = {k: v // CPU_BATCH_DIVISOR if k == 'data.batch_size' else v
              for k, v in change.items() if (k, v) != ('model.attention', 'cudnn')}
    on_cpu.setdefault(change_name(change), change)
  return {CPU_MODEL: (batch // CPU_BATCH_DIVISOR, list(on_cpu.values()))}


def variant_config(name: str, change: dict):
  """The preset's baseline on this backend's shapes with one change (XLA flags aside)."""
  batch, _ = sweep()[name]
  overrides = {**BASELINE, **{f'model.{k}': v for k, v in model_fields().items()},
               **{k: v for k, v in change.items() if k not in BENCH_KEYS}}
  return preset(name, batch_size=batch, **shapes(), **overrides)


def change_name(change: dict) -> str:
  """A change's fields joined by '+': no comma, so that `--jobs` takes any job's whole name."""
  return '+'.join(f'{k}={v}' for k, v in change.items()) or 'baseline'


def measure(config, steps: int, warmup: int, *, packed: bool = False) -> dict:
  """One variant on one device: bench/train_step.py's compiled step, `steps` timed after
  `warmup`; `packed` feeds the model the rows' segment ids."""
  step, info = train_step.t5lite_step(config, train_step.synthetic_batch(config), packed=packed)
  seconds = train_step.interleaved_times({'t5lite': step}, warmup, steps)['t5lite'][0]
  return {**speed_figures(config, seconds), **info, **peak_memory()}


def speed_figures(config, seconds: list[float]) -> dict:
  data, step_s = config.data, statistics.median(seconds)
  peak, peak_name = flops_lib.peak_flops_per_device(jax.devices()[0])
  flops = flops_lib.train_flops_per_step(config_lib.model_config(config), data.inputs_length,
                                         data.targets_length, batch_size=data.batch_size)
  return {'batch_size': data.batch_size, 'step_s': round(step_s, 4),
          'step_s_min': round(min(seconds), 4),
          'tokens_per_s': round(data.batch_size * (data.inputs_length + data.targets_length)
                                / step_s, 1),
          'mfu': round(flops / step_s / peak, 4), 'peak_flops': peak, 'peak_source': peak_name}


def peak_memory() -> dict:
  stats = jax.devices()[0].memory_stats() or {}
  return {'peak_memory_gib': round(stats['peak_bytes_in_use'] / 2**30, 2)
          if 'peak_bytes_in_use' in stats else None}


def speed(name: str, change: dict, args) -> list[dict]:
  row = {'bench': 'gpu_speed', 'model': name, 'change': change_name(change)}
  return [{**row, **measure(variant_config(name, change), args.steps, args.warmup,
                            packed=change.get('rows') == 'packed')}]


def profile(name: str, change: dict, args) -> list[dict]:
  """A variant: `args.warmup` steps, then `args.steps` traced; the summary, and the trace and
  the HLO dump (XLA_FLAGS of this job) archived under --out."""
  config = variant_config(name, change)
  step, info = train_step.t5lite_step(config, train_step.synthetic_batch(config))
  seconds = train_step.interleaved_times({'t5lite': step}, args.warmup, args.steps)['t5lite'][0]
  traced = tempfile.mkdtemp(prefix='t5lite_trace_')
  step_profile.trace(step, args.steps, traced)
  # the job's XLA_FLAGS name a folder outside --out: what compiles later dumps there too
  dump = re.search(r'--xla_dump_to=(\S+)', os.environ.get('XLA_FLAGS', ''))
  dump = dump and dump.group(1)
  summary = step_profile.summarize(traced, dump, args.steps)
  # names the device machine sends back: letters, digits, '.', '_' and '-'
  suffix = re.sub(r'[^A-Za-z0-9._-]', '-', change_name(change))
  for folder, kind in ((traced, 'trace'), (dump, 'xla_dump')):
    if not folder:
      continue
    with tarfile.open(os.path.join(args.out, f'{kind}_{suffix}.tar.gz'), 'w:gz') as tar:
      # buffer assignments run to tens of MB for a base model: beyond what comes back
      tar.add(folder, arcname=kind, filter=lambda info: None if any(
          part in info.name for part in ('buffer-assignment', 'live-range')) else info)
    shutil.rmtree(folder)
  return [{'bench': 'gpu_profile', 'model': name, 'change': change_name(change),
           'steps_traced': args.steps,
           **speed_figures(config, seconds), 'compile_s': round(info['compile_s'], 2),
           'xla_memory_mib': info['xla_memory_mib'], **peak_memory(), **summary}]


def side_by_side(args) -> list[dict]:
  """The first preset as SIDE_BY_SIDE runs it beside PyTorch's, via bench/train_step.py's
  comparison."""
  name = next(iter(sweep()))
  change, divisor = SIDE_BY_SIDE if on_gpu() else ({}, 1)
  config = variant_config(name, change)
  data = config.data
  data.batch_size //= divisor
  step_args = train_step.parse_args([
      '--models', name, '--steps', str(args.steps), '--warmup', str(args.warmup),
      '--batch_size', str(data.batch_size), '--inputs_length', str(data.inputs_length),
      '--targets_length', str(data.targets_length), '--dtype', config.model.dtype])
  with tempfile.TemporaryDirectory() as cache:
    peak, sample = train_step.peak_sampler()
    row = train_step.compare(name, step_args, cache, sample, cpu_memory=False, **{
        k.split('.')[1]: v for k, v in {**BASELINE, **change}.items()}, **model_fields())
  train_step.add_mfu(row, *peak())
  return [{**row, 'bench': 'gpu_side_by_side'}]


def hf_alone(batch_size: int, args) -> list[dict]:
  """Hugging Face's T5 at its fastest (torch.compile, SDPA, fused AdamW) on the first preset's
  shapes at `batch_size` (on CPU its 32nd), alone in this process: set beside t5lite's speed
  row of the same batch, each side has the whole GPU (together, batch 128 did not fit)."""
  name = next(iter(sweep()))
  config = variant_config(name, {})
  config.data.batch_size = batch_size if on_gpu() else max(1, batch_size // CPU_BATCH_DIVISOR)
  device = train_step.torch_device()
  step, info = train_step.torch_step(config, train_step.synthetic_batch(config), device,
                                     fastest=True)
  seconds = train_step.interleaved_times({'hf': step}, args.warmup, args.steps)['hf'][0]
  memory = train_step.gpu_peak_memory('hf_torch_compile') if on_gpu() else {}
  return [{'bench': 'gpu_hf_alone', 'model': name, 'framework': 'hf_torch_compile', **info,
           **speed_figures(config, seconds), **memory}]


# ---- the real run: resume, and plan against it -------------------------------------------------

def run_flags(variant: str = 'xla') -> list[str]:
  """`t5lite train` flags of the resume job's run (and of the plan against it), with the
  settings of RESUMED[variant]."""
  steps, every = RESUME['gpu' if on_gpu() else 'cpu']
  name = next(iter(sweep()))
  batch, _ = sweep()[name]
  flags = [f'--config=configs/{name}.py', '--config.data.source=synthetic',
           f'--config.train.steps={steps}', '--config.train.log_every=1',
           '--config.train.eval_every=0', f'--config.checkpoint.every_steps={every}',
           f'--config.checkpoint.keep={steps // every}',
           f'--config.data.batch_size={batch}', f'--config.model.dtype={shapes()["dtype"]}',
           *(f'--config.{k}={v}' for k, v in {**BASELINE, **RESUMED[variant]}.items())]
  if not on_gpu():
    flags += [f'--config.data.inputs_length={shapes()["inputs_length"]}',
              f'--config.data.targets_length={shapes()["targets_length"]}']
  return flags + [f'--config.model.{k}={v}' for k, v in model_fields().items()]


def launch_train(workdir: str, variant: str, kill: bool = False) -> list[int]:
  """Runs `t5lite train` with run_flags(variant) to the end, or with `kill` SIGKILLs it once a
  checkpoint is complete and a step past it has printed; returns the steps it printed."""
  process = subprocess.Popen(
      [sys.executable, '-m', 't5lite', 'train', f'--workdir={workdir}', *run_flags(variant)],
      cwd=train_step.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  printed, last_lines = [], collections.deque(maxlen=5)
  for line in process.stdout:  # a line per step (log_every=1)
    last_lines.append(line)
    if match := STEP_LINE.match(line):
      printed.append(int(match.group(1)))
      saved = complete_checkpoints(workdir)
      if kill and saved and printed[-1] > saved[-1]:
        process.kill()
        break
  returncode = process.wait()
  if returncode != (-signal.SIGKILL if kill else 0):
    raise RuntimeError(f't5lite train exited {returncode}: {"".join(last_lines)}')
  return printed


def complete_checkpoints(workdir: str) -> list[int]:
  """Steps saved in full (orbax renames a step's temporary folder to the step when done)."""
  folder = os.path.join(workdir, 'checkpoints')
  return sorted(int(name) for name in os.listdir(folder) if name.isdigit()) if os.path.isdir(
      folder) else []


def logged_rows(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return {row['step']: row for row in map(json.loads, f) if 'loss' in row}


def resume(args, variant: str = 'xla') -> list[dict]:
  """The run once through, and the same run SIGKILLed past a checkpoint and resumed: each
  step's loss, bit for bit, and the two runs' saved states at the step it resumed from; and
  the first run resumed from its own save of that step, against itself."""
  with tempfile.TemporaryDirectory() as folder:
    once, killed = os.path.join(folder, 'once'), os.path.join(folder, 'killed')
    launch_train(once, variant)
    printed = launch_train(killed, variant, kill=True)
    resumed_from = launch_train(killed, variant)[0] - 1
    a, b = logged_rows(once), logged_rows(killed)
    differing_leaves = saved_state_differences(once, killed, resumed_from, variant)
    # the uninterrupted run resumed from its own save: does a save hold what the run held?
    own = os.path.join(folder, 'own')
    shutil.copytree(os.path.join(once, 'checkpoints', str(resumed_from)),
                    os.path.join(own, 'checkpoints', str(resumed_from)))
    launch_train(own, variant)
    c = logged_rows(own)
  steps = sorted(a)
  if steps != sorted(b):
    raise RuntimeError(f'logged steps differ: {steps} and {sorted(b)}')
  losses = {'once': [a[s]['loss'] for s in steps], 'resumed': [b[s]['loss'] for s in steps]}
  differing = [s for s in steps if a[s]['loss'] != b[s]['loss']]

  def max_difference(chosen):
    return max((abs(a[s]['loss'] - b[s]['loss']) for s in chosen), default=0.0)

  timed = [a[s] for s in steps[1:]]  # the first step's time holds the step's first run
  return [{'bench': 'gpu_resume', 'flags': run_flags(variant), 'steps': len(steps),
           'killed_after_step': printed[-1], 'resumed_from_step': resumed_from,
           'saved_states_equal': not differing_leaves,
           'saved_states_differing_leaves': differing_leaves,
           'own_save_resumed_equal_losses': sum(c[s]['loss'] == a[s]['loss'] for s in c),
           'own_save_resumed_steps': len(c),
           'equal_losses': len(steps) - len(differing),
           'first_differing_step': differing[0] if differing else None,
           'max_difference_before_resume': max_difference(s for s in steps if s <= resumed_from),
           'max_difference_after_resume': max_difference(s for s in steps if s > resumed_from),
           'losses': losses,
           'tokens_per_s': statistics.median(r['tokens_per_s'] for r in timed),
           'mfu': statistics.median(r['mfu'] for r in timed),
           'peak_memory_gib': a[steps[-1]].get('peak_memory_gib'),
           'pass': not differing and not differing_leaves and all(
               c[s]['loss'] == a[s]['loss'] for s in c)}]


def run_config(variant: str = 'xla'):
  """The config of run_flags(variant), as `t5lite train` builds it."""
  flags = run_flags(variant)
  config = config_lib.load(os.path.join(train_step.ROOT, flags[0].split('=', 1)[1]))
  config_lib.override(config, flags[1:])
  return config


def saved_state_differences(first: str, second: str, step: int, variant: str) -> list[dict]:
  """The leaves of the train states two workdirs saved at checkpoint `step` that are not
  bit-identical: how many elements differ, the NaNs in each, the largest difference."""
  config = run_config(variant)
  run = run_lib.make_run(config, mesh_lib.make_mesh(ONE_DEVICE, jax.devices()[:1]),
                         reads_text=False)
  states = []
  for workdir in (first, second):
    reader = checkpoint_lib.Checkpointer(workdir, config.checkpoint, read_only=True)
    state, _ = reader.restore(step, run.spec.abstract)
    reader.close()
    states.append(jax.tree_util.tree_leaves_with_path(state))
  differing = []
  for (path, x), (_, y) in zip(*states):
    x, y = np.asarray(x), np.asarray(y)
    if x.tobytes() != y.tobytes():
      wide_x, wide_y = x.astype(np.float64), y.astype(np.float64)
      differing.append({'leaf': jax.tree_util.keystr(path), 'dtype': str(x.dtype),
                        'elements_differing': int(np.sum(wide_x != wide_y)),
                        'nans': [int(np.isnan(wide_x).sum()), int(np.isnan(wide_y).sum())],
                        'max_abs_difference': float(np.nanmax(np.abs(wide_x - wide_y),
                                                              initial=0.0))})
  return differing


def plan(args) -> list[dict]:
  """`t5lite plan` of the resume job's run for this machine, against what that run used."""
  config = run_config()
  device = jax.devices()[0]
  known = [name for name, chip in plan_lib.GPUS.items()
           if device.device_kind.startswith(chip.device_kind)]
  topology = f'1x{known[0].upper()}' if on_gpu() and known else 'cpu:1'
  result = plan_lib.plan(config, topology)
  ran = [row for row in read_rows(args.out) if row.get('bench') == 'gpu_resume']
  run_peak = ran[-1].get('peak_memory_gib') if ran else None
  planned = result['memory_per_device'] / 2**30
  return [{'bench': 'gpu_plan', 'topology': result['topology'],
           'compiled': result['compiled'] is not None,
           'planned_gib': round(planned, 2),
           'analytic_gib': round(result['analytic']['total'] / 2**30, 2),
           'run_peak_memory_gib': run_peak,
           'planned_over_run': round(planned / run_peak, 3) if run_peak else None,
           'planned_step_s': round(result['step_seconds'], 4), 'mfu_assumed': result['mfu'],
           'run_mfu': ran[-1].get('mfu') if ran else None}]


# ---- jobs --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Job:
  name: str
  run: object  # run(args) -> rows
  timeout_s: float
  xla_flags: str = ''
  # JAX takes the GPU's memory up front, unless PyTorch or other processes share it
  preallocate: bool = True


def jobs() -> list[Job]:
  """Every job for this backend, in the order they run."""
  def timeout(kind):
    return TIMEOUT_S[kind] if on_gpu() else CPU_TIMEOUT_S

  listed = [Job('correctness', lambda args: correctness(), timeout('correctness'),
                preallocate=False),
            Job('attention', lambda args: check_attention_kernels(), timeout('attention')),
            Job('attention_speed', attention_speed, timeout('attention_speed'))]
  name = next(iter(sweep()))
  # A command buffer (CUDA graph) hides its kernels' instructions: off on a GPU. On CPU, which has
  # none, the flags are the dump's alone, which the compilation cache's key leaves out: the hf and
  # baseline speed jobs then load this step instead of compiling it again (the maxtext job still
  # passes the command buffer flag to XLA on CPU).
  profile_flags = ('--xla_dump_to={dump} --xla_dump_hlo_as_text '
                   '--xla_dump_hlo_module_re=.*train_step.*'
                   + (' --xla_gpu_enable_command_buffer=' if on_gpu() else ''))
  for change in PROFILED if on_gpu() else PROFILED[:1]:
    listed.append(Job(f'profile:{name}:{change_name(change)}',
                      lambda args, name=name, change=change: profile(name, change, args),
                      timeout('profile'), profile_flags))
  listed.append(Job('hf', side_by_side, timeout('hf'), preallocate=False))
  listed += [Job(f'hf_alone:{batch}', functools.partial(hf_alone, batch), timeout('hf'),
                 preallocate=False) for batch in HF_ALONE_BATCHES]
  for name, (_, changes) in sweep().items():
    for change in changes:
      # unrolled, t5_1_1_base's step compiled past 120 s on an H100 (2026-11-26), scanned in 7
      unrolled = change.get('model.scan_layers') is False
      listed.append(Job(f'speed:{name}:{change_name(change)}',
                        lambda args, name=name, change=change: speed(name, change, args),
                        timeout('speed') * (1.5 if 'large' in name else 1) * (3 if unrolled else 1),
                        XLA_FLAGS.get(change.get('xla'), '')))
  # resume:flash: the flash kernel's backward sums the bias table's gradient in a fixed order
  return listed + [Job('resume', resume, timeout('resume'), preallocate=False),
                    Job('plan', plan, timeout('plan')),
                    Job('resume:flash', lambda args: resume(args, 'flash'), timeout('resume'),
                        preallocate=False),
                    # the default settings: 'auto' is cuDNN's kernel on a GPU, XLA's on CPU
                    Job('resume:auto', lambda args: resume(args, 'auto'), timeout('resume'),
                        preallocate=False),
                    Job('resume:auto:deterministic', lambda args: resume(args, 'auto'),
                        timeout('resume'), XLA_FLAGS['deterministic'], preallocate=False)]


def selected(patterns: str | None) -> list[Job]:
  """The jobs named by the comma-separated `patterns` (all if None), in the patterns' order: the
  job of that name, else every job whose name starts with it."""
  every = jobs()
  if not patterns:
    return every
  chosen = []
  for pattern in patterns.split(','):
    matches = [job for job in every if job.name == pattern] or [
        job for job in every if job.name.startswith(pattern)]
    if not matches:
      raise SystemExit(f'--jobs: no job starts with {pattern!r}; see --list')
    chosen += [job for job in matches if job not in chosen]
  return chosen


def emit(row: dict, out: str | None) -> None:
  print(json.dumps(row), flush=True)
  if out:
    with open(os.path.join(out, 'gpu.jsonl'), 'a', encoding='utf-8') as f:
      f.write(json.dumps(row) + '\n')


def read_rows(out: str) -> list[dict]:
  path = os.path.join(out, 'gpu.jsonl')
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def run_child(job: Job, args) -> None:
  """In the child: the job's rows, or one row with the error that stopped it."""
  try:
    for row in job.run(args):
      emit({'job': job.name, **row}, args.out)
  except Exception as error:  # pylint: disable=broad-except  # the row says what went wrong
    emit({'job': job.name, 'error': f'{type(error).__name__}: {first_line(error)}'}, args.out)
    raise


def child_command(job: Job, args) -> list[str]:
  return [sys.executable, os.path.abspath(__file__), f'--job={job.name}', f'--out={args.out}',
          f'--steps={args.steps}', f'--warmup={args.warmup}']


def run_jobs(chosen: list[Job], args, command=None) -> None:
  """In the parent: each job in a child of its own (`command(job)`, default child_command),
  within its timeout and the budget."""
  command = command or functools.partial(child_command, args=args)
  deadline = time.monotonic() + args.budget_s
  env = dict(os.environ)
  # compile_s of a step an earlier job compiled is the cache's load time
  env.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(),
                                                           't5lite_gpu_bench_cache'))
  log_path = os.path.join(args.out, 'jobs.log')
  for job in chosen:
    left = deadline - time.monotonic()
    if left < min(job.timeout_s, 60):
      emit({'job': job.name, 'skipped': f'{left:.0f} s of --budget_s left'}, args.out)
      continue
    child_env = dict(env)
    if job.preallocate:  # one region up front: growing in steps fragments, and a 93 GiB buffer
      # found no room after a compile's autotuning in the same process (H200, 2026-11-26)
      child_env.update(XLA_PYTHON_CLIENT_PREALLOCATE='true', XLA_PYTHON_CLIENT_MEM_FRACTION='0.9')
    if job.xla_flags:
      flags = job.xla_flags.format(dump=tempfile.mkdtemp(prefix='t5lite_xla_dump_'))
      child_env['XLA_FLAGS'] = f'{env.get("XLA_FLAGS", "")} {flags}'.strip()
    start = time.monotonic()
    with open(log_path, 'a', encoding='utf-8') as log:
      log.write(f'==== {job.name}\n')
      log.flush()
      job_log_start = log.tell()
      child = subprocess.Popen(command(job), env=child_env, stderr=log, start_new_session=True)
      try:
        returncode = child.wait(timeout=min(job.timeout_s, left))
      except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        returncode = 'timeout'
    seconds = round(time.monotonic() - start, 1)
    done = [row for row in read_rows(args.out) if row.get('job') == job.name]
    if returncode == 'timeout' or (returncode != 0 and not any('error' in r for r in done)):
      emit({'job': job.name, 'error': f'{returncode} after {seconds} s; see jobs.log',
            'stderr_tail': log_tail(log_path, job_log_start)}, args.out)
    print(f'# {job.name}: exit {returncode} in {seconds} s', file=sys.stderr, flush=True)


def log_tail(path: str, start: int, lines: int = 3) -> str:
  """The last lines a job wrote to the log from byte `start` on."""
  with open(path, 'rb') as f:
    f.seek(start)
    text = f.read().decode('utf-8', errors='replace')
  return ' | '.join(text.strip().splitlines()[-lines:])[-600:]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', help='a folder for gpu.jsonl, jobs.log and the profile archives')
  parser.add_argument('--jobs', help='comma-separated job names or name prefixes, in order '
                      '(default all)')
  parser.add_argument('--list', action='store_true', help='print the jobs and exit')
  parser.add_argument('--steps', type=int, default=10, help='timed steps per measurement')
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--budget_s', type=float, default=540,
                      help='jobs that would start past this many seconds are skipped')
  parser.add_argument('--job', help=argparse.SUPPRESS)  # in a child: run this job
  args = parser.parse_args(argv)
  if args.list:
    for job in selected(args.jobs):
      print(f'{job.name:60} {job.timeout_s:5.0f} s {job.xla_flags}')
    return 0
  if not args.out:
    parser.error('--out is required')
  os.makedirs(args.out, exist_ok=True)
  if args.job:
    run_child(next(job for job in jobs() if job.name == args.job), args)
    return 0
  chosen = selected(args.jobs)
  emit({'bench': 'gpu', 'backend': jax.default_backend(),
        'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
        'jobs': [job.name for job in chosen],
        'date': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, args.out)
  run_jobs(chosen, args)
  rows = read_rows(args.out)
  failed = [row['job'] for row in rows if 'error' in row or row.get('pass') is False]
  print(f'# {len(rows)} rows in {os.path.join(args.out, "gpu.jsonl")}; '
        f'failed: {", ".join(failed) or "none"}', file=sys.stderr)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
