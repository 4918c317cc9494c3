"""`t5lite plan`: memory and FLOPs of one train step per device, on a topology you do not have,
and the bytes it sends over the data-center network and inside each slice (`network`).

Three ways to know, the best available first:
- a TPU slice with libtpu installed (the `tpu` extra): compile the real train step ahead of time
  for the slice's topology on this host, as MaxText's train_compile does, and read XLA's
  `memory_analysis()` and `cost_analysis()`;
- `cpu:N`: compile the real step for N (fake) CPU devices of this host the same way;
- GPUs this host has (`1xH100` on a machine with an H100): compile the step for them;
- otherwise (other GPUs, or no libtpu): an analytic estimate from the real per-leaf shardings of the
  train state (`state_spec`) and the activation count of `activation_bytes`.
The analytic estimate is always computed, so a compiled plan shows both side by side. Against
XLA (BENCHMARKS.md, docs/notes/train-step-cpu.md): state and batch agree to 0.1%; the total is
within 10% for t5_tiny on a TPU v5e chip and 16-22% low for t5_1_1_base on v4-32 and v5e-256
(bfloat16, scanned, save_dots), where XLA also holds optimizer temporaries of the vocabulary
matrices and packs its buffers loosely. XLA:CPU, which fuses little, keeps about twice the
activations.

  t5lite plan --config=t5_1_1_xl --topology=v4-32
"""

import contextlib
import dataclasses
import importlib.util
import math
import re

import jax
import jax.numpy as jnp
import ml_collections
from jax.experimental import topologies
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

from t5lite import objectives
from t5lite.inputs import batches as batches_lib
from t5lite.models import family
from t5lite.models import long_attention
from t5lite.models.config import ModelConfig
from t5lite.train import flops as flops_lib
from t5lite.train import mesh as mesh_lib
from t5lite.train import run as run_lib
from t5lite.train import state as state_lib
from t5lite.train import traffic as traffic_lib

GiB = 2**30
# The plan's executables never run: on CPU, skip LLVM's optimizations (same buffers, 3x faster).
CPU_COMPILE_OPTIONS = {'xla_backend_optimization_level': 0,
                       'xla_llvm_disable_expensive_passes': True}


@dataclasses.dataclass(frozen=True)
class Chip:
  device_kind: str  # as JAX names the device: the key to flops.PEAK_BF16_FLOPS
  hbm_gib: float  # per chip, as sold (XLA gets slightly less: the runtime keeps some)
  grid_dims: int = 0  # TPU: 3 for the v4/v5p torus, 2 for v5e/v6e; 0 for GPUs
  cores_in_name: int = 1  # v4 and v5p slices are named by TensorCores: v4-32 has 16 chips
  ici_gbps: float = 0  # fast interconnect (ICI, NVLink) per chip, one direction, Gbit/s
  dcn_gbps: float | None = None  # data-center network per chip, Gbit/s; None: not published


# HBM per chip, the defaults: A100 means the 80 GiB part (`8xA100-40` for the 40 GiB one).
# Bandwidths as published, per chip and one direction (half a bidirectional figure). ICI: Cloud
# TPU's system architecture pages (docs.cloud.google.com/tpu/docs/v5e, v5p, v6e: 1600, 4800, 3200
# Gbps; v4 gives none per chip, so its pod's all-reduce bandwidth, 1.1 PB/s over 4096 chips).
# DCN: v5p's page, 50 Gbps a chip; v5e and v6e, the NICs of a host over its 8 chips (2 x 100 and
# 4 x 200 Gbps). GPUs: NVLink 4 (H100, H200) 900 GB/s and NVLink 3 (A100) 600 GB/s
# bidirectional; one 400 Gb/s NDR (DGX H100/H200) or 200 Gb/s HDR (DGX A100) InfiniBand port per
# GPU, NVIDIA's DGX user guides.
TPUS = {
    'v4': Chip('TPU v4', 32, grid_dims=3, cores_in_name=2, ici_gbps=1.1e15 * 8 / 4096 / 1e9),
    'v5p': Chip('TPU v5', 95, grid_dims=3, cores_in_name=2, ici_gbps=4800, dcn_gbps=50),
    'v5e': Chip('TPU v5 lite', 16, grid_dims=2, ici_gbps=1600, dcn_gbps=2 * 100 / 8),
    'v6e': Chip('TPU v6 lite', 32, grid_dims=2, ici_gbps=3200, dcn_gbps=4 * 200 / 8),
}
GPUS = {
    'h100': Chip('NVIDIA H100 80GB HBM3', 80, ici_gbps=3600, dcn_gbps=400),
    'h200': Chip('NVIDIA H200', 141, ici_gbps=3600, dcn_gbps=400),
    'a100': Chip('NVIDIA A100-SXM4-80GB', 80, ici_gbps=2400, dcn_gbps=200),
    'a100-80': Chip('NVIDIA A100-SXM4-80GB', 80, ici_gbps=2400, dcn_gbps=200),
    'a100-40': Chip('NVIDIA A100-SXM4-40GB', 40, ici_gbps=2400, dcn_gbps=200),
}
SCAN_WITHOUT_REMAT = (
    'scan_layers without remat: XLA cannot fuse across the scanned loop, so every layer keeps all '
    'the intermediates autodiff saves, 3-4x the analytic activations (t5_tiny on TPU v5e: 943 MB '
    'of temporaries against 272 MB); set model.remat_policy to save_dots or full')
FORMS = ('TPU slices v4-32, v5e-256 (or v5litepod-256), v5p-128, v6e-64, and N of them as '
         '2xv5e-256; GPUs as [NODESx]GPUSxMODEL with MODEL H100, H200, A100 (80 GiB) or '
         'A100-40, e.g. 8xH100, 2x8xH100; or cpu:N for N devices of this host, [SLICESx]cpu:N '
         'for slices of them')


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str
  platform: str  # tpu | gpu | cpu
  num_devices: int  # JAX devices: TPU chips (one megacore device on v4/v5p), GPUs, CPU devices
  chip: Chip | None = None  # None on cpu
  tpu_topology: str = ''  # get_topology_desc's name, e.g. 'v4:2x2x4'
  num_slices: int = 1  # TPU slices or GPU nodes, joined by DCN; num_devices counts them all


def tpu_grid(chips: int, dims: int) -> tuple[int, ...]:
  """Chip layout of a slice as Cloud TPU builds it: one 2x2(x1) host doubled along its shortest
  axis, the last one on ties (v4-32: 16 chips -> 2x2x4; v5e-256 -> 16x16)."""
  if chips == 1:
    return (1,) * dims
  grid = [2, 2] + [1] * (dims - 2)
  while math.prod(grid) < chips:
    shortest = max(i for i, n in enumerate(grid) if n == min(grid))
    grid[shortest] *= 2
  return tuple(grid)


def parse_topology(text: str) -> Topology:
  """'v4-32', '2xv5litepod-256', '2x8xH100', 'cpu:8', '2xcpu:4', ... -> Topology; ValueError on
  anything else. A leading 'Nx' is N slices (TPU, cpu) or nodes (GPU)."""
  name = text.strip().lower()
  match = re.fullmatch(r'(\d+)x(v.*|cpu:.*|\d+x.*)', name)  # not the GPUs of '8xh100'
  slices, one = (int(match[1]), _parse_one_slice(match[2], text)) if match else (
      1, _parse_one_slice(name, text))
  if slices < 1:
    raise ValueError(f'{text!r}: the number of slices (nodes) must be at least 1')
  return dataclasses.replace(one, name=f'{slices}x{one.name}' if match else one.name,
                             num_slices=slices, num_devices=slices * one.num_devices)


def _parse_one_slice(name: str, text: str) -> Topology:
  """One slice or node of parse_topology's forms: 'v4-32', '8xh100', 'cpu:4'."""
  if match := re.fullmatch(r'cpu:(\d+)', name):
    if int(match[1]) > 0:
      return Topology(name, 'cpu', int(match[1]))
  elif match := re.fullmatch(r'(\d+)x(h100|h200|a100(?:-40|-80)?)', name):
    if int(match[1]) > 0:
      return Topology(name.replace(match[2], match[2].upper()), 'gpu', int(match[1]),
                      GPUS[match[2]])
  elif match := re.fullmatch(r'(v4|v5p|v5e|v5litepod|v6e)-(\d+)', name):
    generation = 'v5e' if match[1] == 'v5litepod' else match[1]
    chip = TPUS[generation]
    chips, rest = divmod(int(match[2]), chip.cores_in_name)
    # From one 2x2x1 host (v4-8, v5p-8) or one v5e/v6e chip up, doubling; v5e/v6e pods hold 256.
    first, last = (4, 8192) if chip.grid_dims == 3 else (1, 256)
    if not rest and first <= chips <= last and chips & (chips - 1) == 0 and chips != 2:
      grid = 'x'.join(map(str, tpu_grid(chips, chip.grid_dims)))
      return Topology(f'{generation}-{match[2]}', 'tpu', chips, chip, f'{generation}:{grid}')
    sizes = [n * chip.cores_in_name for n in (2**k for k in range(last.bit_length()))
             if first <= n <= last and n != 2]
    raise ValueError(f'no TPU slice {text!r}: the {generation} slices are {match[1]}-{sizes[0]}, '
                     f'-{sizes[1]}, -{sizes[2]}, ... (doubling) up to -{sizes[-1]}')
  raise ValueError(f'unknown topology {text!r}; use {FORMS}')


def topology_devices(topology: Topology):
  """Devices to compile for: this host's CPUs for cpu:N, its own GPUs where it has the
  topology's (8xH100 on a host with 8 of them), the compile-only devices of a TPU slice where
  libtpu is installed; None where only the analytic estimate is possible."""
  if topology.platform == 'gpu':
    local = [d for d in jax.local_devices()
             if d.platform == 'gpu' and d.device_kind.startswith(topology.chip.device_kind)]
    return local[:topology.num_devices] if len(local) >= topology.num_devices else None
  if topology.platform == 'cpu':
    cpus = jax.devices('cpu')
    if len(cpus) < topology.num_devices:
      raise ValueError(f'{topology.name} needs {topology.num_devices} CPU devices and JAX has '
                       f'{len(cpus)}; start with XLA_FLAGS=--xla_force_host_platform_device_count='
                       f'{topology.num_devices}')
    return cpus[:topology.num_devices]
  if topology.platform != 'tpu' or importlib.util.find_spec('libtpu') is None:
    return None
  kwargs = {'chip_config_name': 'megacore'} if topology.chip.cores_in_name == 2 else {}
  if topology.num_devices == 1:
    kwargs['chips_per_host_bounds'] = (1, 1, 1)
  if topology.num_slices > 1:
    kwargs['num_slices'] = topology.num_slices  # as MaxText's compile_topology_num_slices
  return topologies.get_topology_desc(topology.tpu_topology, 'tpu', **kwargs).devices


def slice_of_devices(topology: Topology, devices):
  """How plan tells the slices of `devices` apart: compile-only TPU devices know their slice;
  this host's CPUs or GPUs stand in for slices (nodes) in order."""
  if topology.platform == 'tpu':
    return mesh_lib.device_slice
  position = {device.id: i for i, device in enumerate(devices)}
  per_slice = topology.num_devices // topology.num_slices
  return lambda device: position[device.id] // per_slice


def plan_mesh(mesh_cfg, topology: Topology, devices):
  """The run's mesh over `devices`, or an AbstractMesh of the same shape when there are none."""
  per_slice = topology.num_devices // topology.num_slices
  try:
    if devices is not None:
      return mesh_lib.make_mesh(mesh_cfg, devices, slice_of=slice_of_devices(topology, devices))
    described = mesh_lib.describe_devices(topology.chip.device_kind if topology.chip else 'cpu',
                                          topology.platform, [per_slice] * topology.num_slices)
    dcn, ici = mesh_lib.hybrid_shape(mesh_cfg, topology.num_slices, per_slice, described)
    shape = tuple(across * inside for across, inside in zip(dcn, ici))
  except ValueError as error:
    raise ValueError(f'{topology.name}: {error}') from None
  return AbstractMesh(shape, mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * len(shape))


def abstract_batch(data_cfg, sharding) -> dict:
  """ShapeDtypeStructs of one global batch: the features `data.objective` declares, and a
  mixture's `component` of each row."""
  features = objectives.get(data_cfg.objective).features(data_cfg)
  if batches_lib.component_names(data_cfg):
    features = {**features, 'component': None}
  return {name: jax.ShapeDtypeStruct((data_cfg.batch_size,) + ((length,) if length else ()),
                                     jnp.int32, sharding=sharding)
          for name, length in features.items()}


def per_device_bytes(tree) -> int:
  """What one device holds of a tree of sharded ShapeDtypeStructs: the shard of every leaf."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def layer_bytes(cfg: ModelConfig, b: float, length: int, kv_length: int, tensor: int, *,
                cross_length: int = 0, scored: int | None = None) -> dict[str, float]:
  """Bytes one layer keeps for its backward pass on one device, for b examples, by remat policy.

  none, per sublayer: its input, the residual stream (b, length, d_model) in the compute dtype
  (norm outputs are recomputed inside fusions); attention: q and the attention output over the
  queries, k and v over the keys, and the float32 softmax probabilities (b, heads, q, k) (the
  flash kernel's: a float32 max and sum per query and head instead); MLP:
  the outputs of its input projections, (b, length, d_ff), two when gated (the activation and
  the gating product are recomputed in fusions). Heads and d_ff are split over `tensor`,
  d_model activations are not. cross_length > 0 adds cross-attention to that many keys.
  `scored` is self-attention's keys per query where not all kv_length (a LongT5 encoder's).
  save_dots: the layer's input and the outputs of its matmuls against weights that its backward
  pass reads (q, k, v, the attention output projection, the MLP input projections), not the
  probabilities. full: the layer's input alone.
  """
  s = jnp.dtype(cfg.dtype).itemsize
  inner = cfg.num_heads * cfg.d_kv * s / tensor  # bytes per position of q, k, v or their output
  probs = cfg.num_heads * 4 / tensor  # bytes per (query, key) pair, or 2 per query (flash)
  residual = length * cfg.d_model * s
  mlp = (2 if cfg.is_gated else 1) * length * cfg.d_ff * s / tensor
  keys = [(kv_length, scored or kv_length)] + ([(cross_length,) * 2] if cross_length else [])
  flash = cfg.attention == 'flash'
  scores = [length * (2 if flash else per_query) * probs for _, per_query in keys]
  none = sum(residual + 2 * length * inner + 2 * k * inner + p for (k, _), p in zip(keys, scores))
  dots = sum(length * inner + 2 * k * inner + residual for k, _ in keys)
  return {'none': b * (none + residual + mlp), 'save_dots': b * (dots + residual + mlp),
          'full': b * residual}


def activation_bytes(cfg: ModelConfig, inputs_length: int, targets_length: int, b: float,
                     tensor: int) -> float:
  """Activation bytes per device at their peak, as the backward pass starts.

  Every layer keeps `layer_bytes` of its remat policy until its backward pass (a LongT5
  encoder's over its 3-block keys and global tokens: long_attention.sizes, and TGlobal's side
  bias, built once per stack), and the encoder output is kept for the cross-attentions. On top,
  the larger transient: the float32 logits over the vocab (split over `tensor`) with their
  gradient, or, under remat, the tensors of the one layer being recomputed.
  """
  shapes = family(cfg.arch).shapes(cfg, inputs_length, targets_length)
  stacks, side_bias = [], 0.0
  for stack in shapes.stacks:
    long = long_attention.sizes(stack.cfg, stack.length) if stack.long_inputs else None
    stacks.append((stack.layers, layer_bytes(
        stack.cfg, b, stack.length, long.held if long else stack.length, tensor,
        cross_length=stack.cross_length or 0, scored=long.scored if long else None)))
    if long:  # TGlobal's side bias, float32 (b, heads, l, g), and its int32 distances (b, l, g)
      side_bias += b * stack.length * long.global_tokens * 4 * (stack.cfg.num_heads / tensor + 1)
  encoded = sum(b * (stack.cross_length or 0) * cfg.d_model * jnp.dtype(cfg.dtype).itemsize
                for stack in shapes.stacks)
  kept = sum(count * layer[cfg.remat_policy] for count, layer in stacks)
  logits = 2 * b * shapes.logits_length * cfg.vocab_size * 4 / tensor
  recomputed = 0 if cfg.remat_policy == 'none' else max(layer['none'] for _, layer in stacks)
  return kept + encoded + side_bias + max(logits, recomputed)


def expert_params(model_cfg: ModelConfig, params) -> tuple[int, int]:
  """(the bytes of the experts' parameters, those one device holds): leaves of logical axis
  'expert' among `params` (ShapeDtypeStructs in their shardings)."""
  axes = jax.tree.leaves(state_lib.param_axes(model_cfg),
                         is_leaf=lambda x: isinstance(x, PartitionSpec))
  leaves = [x for x, spec in zip(jax.tree.leaves(params), axes) if 'expert' in spec]
  return sum(x.size * x.dtype.itemsize for x in leaves), per_device_bytes(leaves)


def analytic_memory(model_cfg: ModelConfig, config, spec, batch, mesh,
                    frozen=None) -> dict[str, float]:
  """Bytes per device by kind, and their total.

  The state and the batch from their real shardings; gradients as the parameters (twice with
  microbatches: the running sum and one microbatch's); activations by `activation_bytes` for
  one microbatch's share of this device. Gradients and activations are counted together: a
  scanned stack holds its stacked gradients and residuals through the whole backward loop.
  `frozen` (a distillation teacher's parameters) adds its bytes.
  """
  params = per_device_bytes(spec.abstract.params)
  data, microbatches = config.data, config.train.microbatches
  rows = jax.tree.leaves(batch)[0].sharding.shard_shape((data.batch_size,))[0]
  memory = {
      'params': params,
      'opt_state': per_device_bytes(spec.abstract) - params,  # optimizer state, step and rng
      'batch': per_device_bytes(batch),
      'gradients': params * (2 if microbatches > 1 else 1),
      'activations': activation_bytes(model_cfg, data.inputs_length, data.targets_length,
                                      rows / microbatches, mesh.shape['tensor']),
  }
  if frozen is not None:
    memory['teacher'] = per_device_bytes(frozen)  # distillation: forward only, no gradients
  memory['total'] = sum(memory.values())
  return memory


def compile_train_step(run: run_lib.Run, loss, batch):
  """The train step exactly as `loop.train` jits it (shardings, donation), compiled for the run's
  mesh from abstract values: nothing is allocated, and the devices need not be attached."""
  platform = run.mesh.devices.flat[0].platform
  kernels = contextlib.nullcontext()
  if run.model_cfg.attention == 'flash':  # its kernels compiled for the devices, not interpreted
    from t5lite.models import flash_attention  # pylint: disable=import-outside-toplevel
    kernels = flash_attention.compiling_for(platform)
  with run.sharding(), kernels:
    lowered = run.jit_train_step(loss).lower(run.spec.abstract, batch, loss.frozen_params)
  return lowered.compile(CPU_COMPILE_OPTIONS if platform == 'cpu' else None)


def compiled_memory(compiled) -> dict[str, int]:
  """XLA's bytes per device; the total counts donated arguments once and includes the code."""
  stats = compiled.memory_analysis()
  memory = {'arguments': stats.argument_size_in_bytes, 'outputs': stats.output_size_in_bytes,
            'aliased': stats.alias_size_in_bytes, 'temp': stats.temp_size_in_bytes,
            'code': stats.generated_code_size_in_bytes}
  memory['total'] = (memory['arguments'] + memory['outputs'] - memory['aliased']
                     + memory['temp'] + memory['code'])
  return memory


def peak_flops(topology: Topology, devices) -> float:
  """Dense bf16 peak per device (flops.py's table), or this host's measured share on cpu."""
  if topology.platform == 'cpu':
    return flops_lib.peak_flops_per_device((devices or jax.devices('cpu'))[0])[0]
  return flops_lib.peak_from_device_kind(topology.chip.device_kind)[0]


# The MFU a step time is predicted at where --mfu is not given. GPU: what `t5lite train` reached
# on t5_1_1_base (bfloat16, 512/114, batch 128, scanned, no remat) on one H200 on 2026-11-26
# (bench/gpu.py's resume job; docs/notes/gpu.md); with cuDNN attention (the default on NVIDIA
# GPUs), what its step reached on one H200 on 2026-11-28 (save_dots remat, rows of one example
# unmasked: 0.2845; t5_1_1_large 0.29). TPU and CPU: not measured by t5lite yet.
DEFAULT_MFU = {'gpu': 0.16, 'tpu': 0.4, 'cpu': 0.4}
CUDNN_GPU_MFU = 0.28


def default_mfu(platform: str, attention: str) -> float:
  return CUDNN_GPU_MFU if platform == 'gpu' and attention == 'cudnn' else DEFAULT_MFU[platform]


def speed(model_cfg: ModelConfig, data_cfg, topology: Topology, devices, mfu: float) -> dict:
  """Analytic FLOPs of a step (flops.py) and the step time and tokens/s they take at `mfu`."""
  if not 0 < mfu <= 1:
    raise ValueError(f'mfu={mfu} must be in (0, 1]')
  flops = flops_lib.train_flops_per_step(model_cfg, data_cfg.inputs_length,
                                         data_cfg.targets_length, batch_size=data_cfg.batch_size)
  peak = peak_flops(topology, devices)
  seconds = flops / (topology.num_devices * peak * mfu)
  tokens = data_cfg.batch_size * (data_cfg.inputs_length + data_cfg.targets_length)
  return {'flops_per_step': flops, 'flops_per_device': flops / topology.num_devices,
          'peak_flops_per_device': peak, 'mfu': mfu, 'step_seconds': seconds,
          'tokens_per_second': tokens / seconds}


def network(model_cfg: ModelConfig, config, run: run_lib.Run, topology: Topology,
            expected: dict) -> dict:
  """Bytes of a step over DCN and ICI (traffic.analytic_traffic), the seconds they take at the
  chips' published bandwidths, and the step they bound, with its MFU: communication overlapped
  with compute (`expected`, speed's), the slowest of the three sets the pace."""
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(run.spec.abstract.params))
  dcn = dict(zip(mesh_lib.MESH_AXES, mesh_lib.dcn_shape(config.mesh, topology.num_slices,
                                                        topology.name)))
  ici = {axis: run.mesh.shape[axis] // dcn[axis] for axis in mesh_lib.MESH_AXES}
  expert_bytes, _ = expert_params(model_cfg, run.spec.abstract.params)
  result = traffic_lib.analytic_traffic(model_cfg, config.data, param_bytes, ici, dcn,
                                        expert_bytes)
  result.update(param_bytes=param_bytes, num_slices=topology.num_slices)
  chip = topology.chip
  seconds = {'compute': expected['step_seconds']}
  if chip and chip.ici_gbps:
    seconds['ICI'] = result['ici_per_device'] / (chip.ici_gbps * 1e9 / 8)
  if chip and chip.dcn_gbps and topology.num_slices > 1:
    seconds['DCN'] = result['dcn_per_device'] / (chip.dcn_gbps * 1e9 / 8)
  result['seconds'] = seconds
  result['bound_by'] = max(seconds, key=seconds.get)
  result['step_seconds'] = seconds[result['bound_by']]
  result['mfu'] = expected['mfu'] * expected['step_seconds'] / result['step_seconds']
  return result


def plan(config: ml_collections.ConfigDict, topology: str, *, mfu: float | None = None,
         compile_step: bool = True) -> dict:
  """Memory per device, FLOPs and expected speed of `config`'s train step on `topology`.

  Compiles the real step where it can (see the module docstring) unless compile_step is False;
  the analytic estimate is always included. Byte counts are per device; the step time is the
  analytic FLOPs at `mfu` (default: default_mfu's) of the devices' dense bf16 peak. A topology,
  mesh or batch that cannot work raises ValueError with one line, before anything compiles.
  """
  topo = parse_topology(topology)
  devices = topology_devices(topo) if compile_step else None
  run = run_lib.make_run(config, plan_mesh(config.mesh, topo, devices), reads_text=False,
                         platform=topo.platform)
  model_cfg = run.model_cfg  # its attention the kernel of the topology's chips
  expected = speed(model_cfg, config.data, topo, devices,
                   mfu or default_mfu(topo.platform, model_cfg.attention))
  result = {'topology': topo.name, 'platform': topo.platform, 'num_devices': topo.num_devices,
            'device_kind': topo.chip.device_kind if topo.chip else 'cpu',
            'hbm_per_device': topo.chip.hbm_gib * GiB if topo.chip else None,
            'mesh': dict(run.mesh.shape), 'remat_policy': model_cfg.remat_policy,
            'scan_layers': model_cfg.scan_layers,
            **expected}
  # A distillation teacher enters as the shapes of its parameters.
  teacher = run.load_teacher(restore=False) if config.train.teacher_workdir else None
  loss = run.loss(teacher)
  batch = abstract_batch(config.data, run.batch_sharding)
  result['num_params'] = sum(x.size for x in jax.tree.leaves(run.spec.abstract.params))
  result['experts'] = (dict(zip(('param_bytes', 'per_device'), expert_params(
      model_cfg, run.spec.abstract.params)), num_experts=model_cfg.num_experts,
                            expert_axis=run.mesh.shape['expert'])
                       if model_cfg.num_experts else None)
  result['analytic'] = analytic_memory(model_cfg, config, run.spec, batch, run.mesh,
                                       loss.frozen_params)
  result['compiled'] = result['xla_flops_per_device'] = None
  result['network'] = network(model_cfg, config, run, topo, expected)
  scan_without_remat = model_cfg.scan_layers and model_cfg.remat_policy == 'none'
  result['notes'] = [SCAN_WITHOUT_REMAT] if scan_without_remat else []
  out_of_memory = False
  if devices is not None:
    try:
      compiled = compile_train_step(run, loss, batch)
    except jax.errors.JaxRuntimeError as error:  # the compiler's own verdict: it cannot fit
      if 'RESOURCE_EXHAUSTED' not in str(error):
        raise
      out_of_memory = True
      result['notes'].append('XLA could not fit the step: '
                             + str(error).strip().splitlines()[0].split(': ', 1)[-1])
    else:
      result['compiled'] = compiled_memory(compiled)
      result['xla_flops_per_device'] = compiled.cost_analysis().get('flops')
      slice_of = slice_of_devices(topo, devices)
      result['network']['hlo'] = traffic_lib.hlo_bytes(
          compiled.as_text(), [slice_of(device) for device in run.mesh.devices.flat])
  result['memory_per_device'] = (result['compiled'] or result['analytic'])['total']
  hbm = result['hbm_per_device']
  result['fits'] = None if hbm is None else (
      not out_of_memory and result['memory_per_device'] <= hbm)
  return result


INPUT_STEP = 1024  # --longest_input's resolution


def longest_input(config: ml_collections.ConfigDict, topology: str, *,
                  compile_step: bool = True, step: int = INPUT_STEP,
                  limit: int = 1 << 20) -> dict:
  """The longest data.inputs_length, a multiple of `step` up to `limit`, whose train step fits
  `topology`'s memory, every other setting as it is: doubled from `step` until it does not fit,
  then the gap halved. {'inputs_length': the longest (0: not `step`), 'plan': its plan, 'next':
  the plan of `step` more tokens (None past `limit`)}."""
  if config.data.inputs_length <= 0:
    raise ValueError(f'--longest_input varies data.inputs_length, which data.objective='
                     f'{config.data.objective} does not read')
  if parse_topology(topology).chip is None:  # before the first plan compiles anything
    raise ValueError(f'--longest_input needs a topology whose memory is known (TPU slices, '
                     f'GPUs), not {topology}')

  def planned(length: int) -> dict:
    trial = config.copy_and_resolve_references()
    trial.data.inputs_length = length
    return plan(trial, topology, compile_step=compile_step)

  fit, no_fit = (0, None), (step, planned(step))  # (inputs_length, its plan)
  while no_fit[1]['fits']:
    fit = no_fit
    if fit[0] * 2 > limit:
      return {'inputs_length': fit[0], 'plan': fit[1], 'next': None}
    no_fit = (fit[0] * 2, planned(fit[0] * 2))
  while fit[0] and no_fit[0] - fit[0] > step:
    middle = (fit[0] + no_fit[0]) // 2 // step * step
    result = planned(middle)
    fit, no_fit = ((middle, result), no_fit) if result['fits'] else (fit, (middle, result))
  return {'inputs_length': fit[0], 'plan': fit[1],
          'next': no_fit[1] if no_fit[0] == fit[0] + step else planned(fit[0] + step)}


def format_longest(result: dict) -> str:
  """--longest_input's answer: the length, its memory against the chip's, and the next step's."""
  longest, nearest = result['plan'], result['next']
  chip = longest or nearest
  lines = [f"{chip['topology']}: {chip['num_devices']} x {chip['device_kind']}, mesh "
           + ' '.join(f'{axis}={size}' for axis, size in chip['mesh'].items())
           + f", remat {chip['remat_policy']}, {chip['num_params'] / 1e6:,.0f}M parameters"]
  for length, planned in ((result['inputs_length'], longest),
                          (result['inputs_length'] + INPUT_STEP, nearest)):
    if planned is not None:
      how = 'compiled by XLA' if planned['compiled'] else 'analytic estimate'
      lines.append(f"inputs_length {length:,}: {_gib(planned['memory_per_device'])} of "
                   f"{_gib(planned['hbm_per_device'])} per device ({how}), "
                   f"{'fits' if planned['fits'] else 'does NOT fit'}")
  lines.append(f"longest input that fits, in steps of {INPUT_STEP:,}: "
               f"{result['inputs_length']:,} tokens")
  return '\n'.join(lines)


def _gib(n) -> str:
  return '-' if n is None else f'{n / GiB:.2f} GiB'


def format_plan(result: dict) -> str:
  """The plan as console lines: memory per device by kind, the fit, FLOPs and expected speed."""
  mesh = ' '.join(f'{axis}={size}' for axis, size in result['mesh'].items())
  how = 'compiled by XLA' if result['compiled'] else 'analytic estimate only'
  lines = [f"{result['topology']}: {result['num_devices']} x {result['device_kind']}, mesh {mesh}, "
           f"remat {result['remat_policy']}, {result['num_params'] / 1e6:,.0f}M parameters "
           f"({how})",
           'memory per device, analytic:']
  lines += [f'  {kind:<12} {_gib(n)}' for kind, n in result['analytic'].items()]
  if result['compiled']:
    lines.append('memory per device, compiled (total: arguments + outputs - aliased + temp + '
                 'code):')
    lines += [f'  {kind:<12} {_gib(n)}' for kind, n in result['compiled'].items()]
  if result['fits'] is not None:
    used = result['memory_per_device'] / result['hbm_per_device']
    lines.append(f"fits in {_gib(result['hbm_per_device'])} HBM: "
                 f"{'yes' if result['fits'] else 'NO'} ({used:.0%})")
  xla = result['xla_flops_per_device']
  scanned = ' (a scanned layer stack counted once)' if result['scan_layers'] else ''
  lines.append(f"FLOPs per step: {result['flops_per_step']:.3g} analytic "
               f"({result['flops_per_device']:.3g} per device)"
               + (f', XLA {xla:.3g} per device{scanned}' if xla else ''))
  lines.append(f"at {result['mfu']:.0%} MFU of {result['peak_flops_per_device'] / 1e12:.4g} "
               f"TFLOP/s per device: {result['step_seconds']:.3g} s per step, "
               f"{result['tokens_per_second']:,.0f} tokens/s")
  if experts := result['experts']:
    lines.append(f"experts: {experts['num_experts']} a sparse layer over mesh.expert="
                 f"{experts['expert_axis']}, their parameters {_gib(experts['per_device'])} a "
                 f"device ({_gib(experts['param_bytes'])} in all; the params above hold them); "
                 f"all-to-all {_mb(result['network']['all_to_all_per_device'])} a device a step"
                 + (f" (compiled HLO: {_mb(result['network']['hlo']['all_to_all'])})"
                    if result['network'].get('hlo') else ''))
  lines += network_lines(result['network'])
  lines += [f'note: {note}' for note in result['notes']]
  return '\n'.join(lines)


def _mb(n) -> str:
  return f'{n / 1e6:,.1f} MB'


def network_lines(net: dict) -> list[str]:
  """The network part of format_plan: bytes over DCN and ICI (analytic, and counted in the
  compiled step), their seconds, the bound; DCN only past one slice."""
  slices = net['num_slices'] > 1
  dcn = (f"DCN {_mb(net['dcn_per_device'])} per device ({_mb(net['dcn_per_slice'])} per "
         'slice), ' if slices else '')
  lines = [f"network per step, analytic (ring collectives, {_mb(net['param_bytes'])} of "
           f"parameters): {dcn}ICI {_mb(net['ici_per_device'])} per device"]
  if hlo := net.get('hlo'):
    compiled_dcn = f"DCN {_mb(hlo['dcn'])}, " if slices else ''
    lines[0] += f"; compiled HLO: {compiled_dcn}ICI {_mb(hlo['ici'])} per device"
  times = ', '.join(f'{link} {seconds:.3g} s' for link, seconds in net['seconds'].items())
  lines.append(f'at the published bandwidths per chip: {times}; overlapped, '
               f"{net['step_seconds']:.3g} s per step, bound by {net['bound_by']} "
               f"({net['mfu']:.0%} MFU)")
  return lines
