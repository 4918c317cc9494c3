"""`t5lite plan`: topologies, the analytic estimate against real CPU compiles, presets that do and
do not fit, one-line errors, and the TPU ahead-of-time path where libtpu is installed.

The big presets are planned with `model.scan_layers=True`: the stacked model builds in one trace
(unrolled, state_spec traces 24-layer stacks for minutes on 2 cores) and every per-device byte
count is the same.
"""

import functools
import importlib.util

import jax
import pytest

from t5lite import config as config_lib
from t5lite.commands import plan as plan_lib
from t5lite.train import run as run_lib

GiB = 2**30


def load(preset: str, *overrides: str):
  config = config_lib.load(f'configs/{preset}.py')
  config_lib.override(config, list(overrides))
  return config


@pytest.mark.parametrize('text, platform, devices, tpu_topology', [
    ('v4-8', 'tpu', 4, 'v4:2x2x1'),
    ('v4-32', 'tpu', 16, 'v4:2x2x4'),
    ('v5p-128', 'tpu', 64, 'v5p:4x4x4'),
    ('v5e-1', 'tpu', 1, 'v5e:1x1'),
    ('v5e-256', 'tpu', 256, 'v5e:16x16'),
    ('v5litepod-256', 'tpu', 256, 'v5e:16x16'),
    ('v6e-64', 'tpu', 64, 'v6e:8x8'),
    ('8xH100', 'gpu', 8, ''),
    ('2x8xH100', 'gpu', 16, ''),
    ('8xA100', 'gpu', 8, ''),
    ('cpu:8', 'cpu', 8, ''),
])
def test_parse_topology(text, platform, devices, tpu_topology):
  topology = plan_lib.parse_topology(text)
  assert (topology.platform, topology.num_devices, topology.tpu_topology) == (
      platform, devices, tpu_topology)


def test_device_memory_defaults():
  hbm = {text: plan_lib.parse_topology(text).chip.hbm_gib
         for text in ('v4-8', 'v5e-4', 'v5p-8', 'v6e-4', '8xH100', '8xH200', '8xA100',
                      '8xA100-40')}
  assert hbm == {'v4-8': 32, 'v5e-4': 16, 'v5p-8': 95, 'v6e-4': 32, '8xH100': 80,
                 '8xH200': 141, '8xA100': 80, '8xA100-40': 40}


@pytest.mark.parametrize('text, match', [
    ('v7-32', 'unknown topology .* v4-32, v5e-256'),
    ('8xV100', 'unknown topology'),
    ('cpu:0', 'unknown topology'),
    ('v4-33', 'no TPU slice'),
    ('v5e-512', 'no TPU slice'),
])
def test_bad_topology_is_one_line(text, match):
  with pytest.raises(ValueError, match=match) as error:
    plan_lib.parse_topology(text)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('topology, overrides, match', [
    ('v4-32', ['mesh.fsdp=3'],
     'v4-32: mesh.data=-1 mesh.fsdp=3 mesh.expert=1 mesh.tensor=1 does not fit 16'),
    ('v5e-64', [], r'data.batch_size=32 is not divisible by mesh.data\*mesh.fsdp\*mesh.expert=64'),
    ('8xH100', ['mesh.tensor=8'], r'model.num_heads=4 is not divisible by mesh.tensor=8'),
    ('cpu:4', ['mesh.data=8'], 'cpu:4: mesh.data=8 .* does not fit 4 devices'),
    ('cpu:1', ['train.microbatches=5'], 'train.microbatches=5 must divide data.batch_size=32'),
])
def test_mesh_that_does_not_fit_is_one_line(topology, overrides, match):
  with pytest.raises(ValueError, match=match) as error:
    plan_lib.plan(load('t5_tiny', *overrides), topology)
  assert '\n' not in str(error.value)


def test_cudnn_attention_is_planned_for_gpus_and_refused_on_this_cpu():
  """A GPU run's config plans from a host without GPUs (analytic, at cuDNN's measured MFU); on
  this host's own devices it is refused in one line, as `t5lite train` refuses it."""
  config = load('t5_tiny', 'model.attention=cudnn')
  assert plan_lib.plan(config, '8xH100', compile_step=False)['mfu'] == 0.28
  with pytest.raises(ValueError, match=r"model.attention='cudnn' needs a GPU \(the devices are "
                     r"cpu\); use 'xla' or 'einsum' \(--config.model.attention=xla\)$") as error:
    plan_lib.plan(config, 'cpu:1')
  assert '\n' not in str(error.value)


def test_auto_attention_is_planned_as_the_topologys_kernel():
  """The default, 'auto', is cuDNN's kernel for GPUs in bfloat16 (at its measured MFU), XLA's
  in float32 and for TPUs; on this CPU host it plans and compiles with XLA's."""
  assert load('t5_tiny').model.attention == 'auto'
  bf16 = load('t5_tiny', 'model.dtype=bfloat16')
  assert plan_lib.plan(bf16, '8xH100', compile_step=False)['mfu'] == plan_lib.CUDNN_GPU_MFU
  assert plan_lib.plan(load('t5_tiny'), '8xH100', compile_step=False)['mfu'] == (
      plan_lib.DEFAULT_MFU['gpu'])
  assert plan_lib.plan(bf16, 'v5e-8', compile_step=False)['mfu'] == plan_lib.DEFAULT_MFU['tpu']


def test_flash_attention_is_accepted_on_every_platform_and_cudnn_on_gpus_only():
  for platform in ('gpu', 'cpu', 'tpu'):
    run_lib.check_attention_platform('flash', platform)
  with pytest.raises(ValueError, match=r"^model.attention='cudnn' needs a GPU \(the devices are "
                     r"tpu\); use 'xla' or 'einsum' \(--config.model.attention=xla\)$"):
    run_lib.check_attention_platform('cudnn', 'tpu')


@functools.lru_cache(maxsize=None)
def analytic_plan(preset: str, topology: str, *overrides: str) -> dict:
  """The analytic estimate alone (compile_step=False), fast even where libtpu is installed."""
  config = load(preset, 'model.scan_layers=True', *overrides)
  return plan_lib.plan(config, topology, compile_step=False)


@pytest.mark.parametrize('topology, attention, devices, peak, mfu', [
    ('v4-32', 'xla', 16, 275e12, 0.4), ('8xH100', 'xla', 8, 989e12, 0.16),
    ('8xH100', 'cudnn', 8, 989e12, 0.28)])
def test_t5_1_1_base_is_replicated_and_fits(topology, attention, devices, peak, mfu):
  """At the default MFU of the platform: on GPUs, what t5lite measured on an H200, with XLA's
  attention and with cuDNN's."""
  result = analytic_plan('t5_1_1_base', topology, f'model.attention={attention}')
  memory = result['analytic']
  assert result['mesh'] == {'data': devices, 'fsdp': 1, 'expert': 1, 'tensor': 1}
  assert 247e6 < result['num_params'] < 249e6  # T5 v1.1 base
  assert memory['params'] == memory['gradients'] == result['num_params'] * 4  # float32, replicated
  assert result['fits'] and memory['total'] == result['memory_per_device'] < 32 * GiB
  assert result['flops_per_device'] * devices == pytest.approx(result['flops_per_step'])
  assert result['mfu'] == mfu
  assert result['step_seconds'] == pytest.approx(result['flops_per_step'] / (devices * peak * mfu))
  assert result['tokens_per_second'] == pytest.approx(128 * (512 + 114) / result['step_seconds'])


def test_activations_follow_the_rows_of_a_device():
  v4, h100 = analytic_plan('t5_1_1_base', 'v4-32'), analytic_plan('t5_1_1_base', '8xH100')
  assert h100['analytic']['activations'] == pytest.approx(2 * v4['analytic']['activations'])


def test_t5_1_1_xxl_fits_a_16_gib_v5e_chip_only_when_sharded():
  replicated = analytic_plan('t5_1_1_xxl', 'v5e-256', 'data.batch_size=256')
  sharded = analytic_plan('t5_1_1_xxl', 'v5e-256', 'data.batch_size=256', 'mesh.data=1',
                          'mesh.fsdp=-1')
  total_bytes = replicated['num_params'] * 4
  assert 11.1e9 < replicated['num_params'] < 11.2e9
  assert replicated['analytic']['params'] == total_bytes and not replicated['fits']
  assert sharded['mesh'] == {'data': 1, 'fsdp': 256, 'expert': 1, 'tensor': 1}
  # Every large kernel splits its d_model dimension 256 ways; only the tiny relative position
  # tables stay whole.
  assert total_bytes / 256 <= sharded['analytic']['params'] < 1.001 * total_bytes / 256
  # Adafactor factors every kernel, attention's over its (d_model, heads * d_kv) view as T5
  # does: 20 MB of statistics for 11B parameters (19 GB before, with full second moments for
  # the attention kernels); sharding them saves little more.
  assert sharded['analytic']['opt_state'] < replicated['analytic']['opt_state'] < 25e6
  assert sharded['fits'] and sharded['memory_per_device'] < 16 * GiB


def test_t5_1_1_xxl_on_v4_32_needs_fsdp_and_remat():
  fsdp = ('mesh.data=1', 'mesh.fsdp=-1')
  no_remat = analytic_plan('t5_1_1_xxl', 'v4-32', *fsdp)  # 8 rows of activations per chip
  remat = analytic_plan('t5_1_1_xxl', 'v4-32', *fsdp, 'model.remat_policy=full')
  assert no_remat['analytic']['params'] == remat['analytic']['params'] < 3 * GiB
  assert not no_remat['fits'] and no_remat['analytic']['activations'] > 32 * GiB
  assert remat['fits'] and remat['analytic']['activations'] < 4 * GiB


def test_format_plan_lines():
  text = plan_lib.format_plan(analytic_plan('t5_1_1_xxl', 'v5e-256', 'data.batch_size=256'))
  assert text.splitlines()[0].startswith('v5e-256: 256 x TPU v5 lite, mesh data=256 fsdp=1')
  assert 'fits in 16.00 GiB HBM: NO' in text and 'at 40% MFU of 197 TFLOP/s' in text
  network = [line for line in text.splitlines() if line.startswith('network per step')]
  assert len(network) == 1 and 'ICI' in network[0] and 'DCN' not in text  # one slice: no DCN


@pytest.mark.parametrize('topology, overrides', [
    ('cpu:1', ()),  # t5_tiny exactly as configured
    pytest.param('cpu:8', ('mesh.data=2', 'mesh.fsdp=2', 'mesh.tensor=2'), marks=pytest.mark.slow),
])
def test_analytic_memory_against_a_real_cpu_compile(topology, overrides):
  """The state and batch, whose bytes come from the shardings, match XLA within 10%: they are
  the step's arguments, and the state its donated outputs. Temporaries do not: XLA:CPU fuses
  little, so it keeps the elementwise intermediates of GELU, softmax and the norms that TPU and
  GPU compilers recompute inside fusions, about 2x the activations of `activation_bytes`
  (t5_tiny on cpu:1: 1003 MB of temp against 495 MB of gradients and activations; 2x2x2 on
  cpu:8: 159 MB against 75 MB). The TPU test below checks them against a compiler that fuses."""
  result = plan_lib.plan(load('t5_tiny', *overrides), topology)
  analytic, compiled = result['analytic'], result['compiled']
  state = analytic['params'] + analytic['opt_state']
  assert state + analytic['batch'] == pytest.approx(compiled['arguments'], rel=0.1)
  assert state == pytest.approx(compiled['outputs'], rel=0.1)
  assert state == pytest.approx(compiled['aliased'], rel=0.1)
  fused = analytic['gradients'] + analytic['activations']
  assert fused < compiled['temp'] < 3 * fused
  assert result['xla_flops_per_device'] == pytest.approx(result['flops_per_device'], rel=0.1)


# The ahead-of-time TPU path needs libtpu, which only the `tpu` extra installs (pip install
# -e .[tpu]); CI without it skips this test. libtpu compiles for a TPU topology on a CPU host.
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason='libtpu is not installed (the tpu extra)')
def test_tpu_ahead_of_time_compile_agrees_with_the_analytic_estimate():
  """t5_tiny in bfloat16, scanned with save_dots, on one TPU v5e chip: 331 MB compiled (arguments,
  outputs, temporaries and code), 339 MB analytic."""
  config = load('t5_tiny', 'model.scan_layers=True', 'model.dtype=bfloat16',
                'model.remat_policy=save_dots')
  result = plan_lib.plan(config, 'v5e-1')
  analytic, compiled = result['analytic'], result['compiled']
  assert result['device_kind'] == 'TPU v5 lite' and compiled['code'] > 0
  state = analytic['params'] + analytic['opt_state']
  assert state + analytic['batch'] == pytest.approx(compiled['arguments'], rel=0.1)
  assert analytic['total'] == pytest.approx(compiled['total'], rel=0.1)
  assert result['xla_flops_per_device'] > 0


@pytest.mark.parametrize('text, name, slices, devices, tpu_topology', [
    ('2xv5e-256', '2xv5e-256', 2, 512, 'v5e:16x16'),
    ('4xv5p-128', '4xv5p-128', 4, 256, 'v5p:4x4x4'),
    ('2x8xH100', '2x8xH100', 2, 16, ''),
    ('8xH100', '8xH100', 1, 8, ''),
    ('2xcpu:4', '2xcpu:4', 2, 8, ''),
])
def test_parse_topology_of_several_slices(text, name, slices, devices, tpu_topology):
  topology = plan_lib.parse_topology(text)
  assert (topology.name, topology.num_slices, topology.num_devices, topology.tpu_topology) == (
      name, slices, devices, tpu_topology)


@pytest.mark.parametrize('topology, overrides, match', [
    ('2xv5e-256', ['mesh.dcn_data=1'], r'2xv5e-256: mesh.dcn_data=1 mesh.dcn_fsdp=1 must '
     r'multiply to the number of slices \(nodes\), and the devices are 512 TPU v5 lite devices '
     r'in 2 slices of 256'),
    ('4xv5p-128', ['mesh.dcn_fsdp=3'], r'mesh.dcn_data=-1 mesh.dcn_fsdp=3 must multiply to the '
     r'number of slices'),
    ('2x8xH100', ['mesh.dcn_data=3'], 'in 2 nodes of 8; set mesh.dcn_data \\* mesh.dcn_fsdp = 2'),
    ('v4-32', ['mesh.dcn_data=2'], 'the devices are 16 TPU v4 devices in 1 slice of 16'),
])
def test_dcn_axes_that_do_not_fit_the_slices_are_one_line(topology, overrides, match):
  with pytest.raises(ValueError, match=match) as error:
    analytic_plan('t5_tiny', topology, *overrides)
  assert '\n' not in str(error.value)


def test_two_h100_nodes_send_the_gradients_all_reduce_over_dcn():
  """Data parallelism over 2 nodes: each node sends 2 * (2-1)/2 = 1x its float32 gradients over
  InfiniBand a step, an eighth from each GPU's 400 Gb/s port."""
  result = analytic_plan('t5_1_1_base', '2x8xH100', 'mesh.dcn_data=2', 'model.scan_layers=True')
  net = result['network']
  assert result['mesh'] == {'data': 16, 'fsdp': 1, 'expert': 1, 'tensor': 1}
  assert net['param_bytes'] == 4 * result['num_params'] == pytest.approx(990e6, rel=0.01)
  assert net['dcn_per_slice'] == net['param_bytes']
  assert net['dcn_per_device'] == net['param_bytes'] / 8
  assert net['seconds']['DCN'] == pytest.approx(net['param_bytes'] / 8 / 50e9)
  # inside a node: reduce-scatter and all-gather over its 8 GPUs, 2 * 7/8 of the gradients
  assert net['ici_per_device'] == pytest.approx(2 * 7 / 8 * net['param_bytes'])


def test_dcn_fsdp_adds_the_parameter_gathers_across_slices():
  """4 slices as 2 data x 2 fsdp: the all-reduce of half the gradients over 2 (P/2), the
  reduce-scatter of the gradients over 2 (P/2) and the all-gather of the parameters (P/2)."""
  result = analytic_plan('t5_1_1_base', '4xv5p-128', 'mesh.dcn_data=2', 'mesh.dcn_fsdp=2',
                         'mesh.fsdp=2', 'data.batch_size=256', 'model.scan_layers=True')
  net = result['network']
  assert result['mesh'] == {'data': 64, 'fsdp': 4, 'expert': 1, 'tensor': 1}
  assert net['dcn_per_slice'] == pytest.approx(1.5 * net['param_bytes'])
  assert net['dcn_per_device'] == pytest.approx(1.5 * net['param_bytes'] / 64)
  text = plan_lib.format_plan(result)
  assert 'DCN 23.2 MB per device (1,485.5 MB per slice)' in text, text
  assert f"bound by {net['bound_by']}" in text


TINY_GPT = ('model.d_model=256', 'model.d_ff=1024', 'model.num_heads=4',
            'model.num_decoder_layers=4', 'model.max_length=64', 'data.targets_length=64',
            'data.batch_size=16', 'model.dropout=0', 'model.tie_embeddings=false')


@pytest.mark.parametrize('scan', ['false', 'true'])
def test_dcn_bytes_of_the_compiled_step_match_the_gradients_all_reduce(scan):
  """The real step compiled for 8 CPU devices as 2 slices of 4: its collectives that cross the
  slices carry the analytic all-reduce of the gradients, within 0.1%; scanned, the layers'
  all-reduces in the loop count once a layer."""
  result = plan_lib.plan(load('gpt2_small', *TINY_GPT, 'mesh.dcn_data=2',
                              f'model.scan_layers={scan}'), '2xcpu:4')
  net = result['network']
  assert net['dcn_per_device'] == net['param_bytes'] / 4
  assert net['hlo']['dcn'] == pytest.approx(net['dcn_per_device'], rel=0.001)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason='libtpu is not installed (the tpu extra)')
def test_two_tpu_slices_compile_ahead_of_time_and_all_reduce_the_gradients_over_dcn():
  """The real step compiled by libtpu for 2 v5e slices of 4 chips (num_slices=2): its collectives
  that cross the slices carry the analytic all-reduce of the gradients, within 5%."""
  result = plan_lib.plan(load('gpt2_small', *TINY_GPT), '2xv5e-4')
  net = result['network']
  assert result['device_kind'] == 'TPU v5 lite' and result['compiled']['code'] > 0
  assert net['dcn_per_device'] == net['param_bytes'] / 4
  assert net['hlo']['dcn'] == pytest.approx(net['dcn_per_device'], rel=0.05)


def test_a_step_the_compiler_cannot_fit_is_a_plan_that_says_so(monkeypatch):
  """libtpu refuses to compile a step past its HBM (t5_1_1_xl at 1,024 rows on 2xv5e-256:
  'RESOURCE_EXHAUSTED: Ran out of memory on HBM, ...'): the plan gives the analytic estimate and
  the compiler's line, not a traceback."""
  def out_of_memory(*_):
    raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total '
                                     'memory required for HLO temporaries (24.14G) exceeds '
                                     'available HBM (15.75G).')
  monkeypatch.setattr(plan_lib, 'compile_train_step', out_of_memory)
  result = plan_lib.plan(load('t5_tiny'), 'cpu:8')
  assert result['compiled'] is None
  assert result['memory_per_device'] == result['analytic']['total']
  assert result['notes'] == ['XLA could not fit the step: Ran out of memory on HBM, the total '
                             'memory required for HLO temporaries (24.14G) exceeds available HBM '
                             '(15.75G).']
  assert 'note: XLA could not fit the step' in plan_lib.format_plan(result)


def test_a_tied_embedding_is_all_reduced_once_per_use():
  """With the embedding tied to the output layer, XLA all-reduces its two gradients (the lookup's
  and the logits') before adding them: one embedding's all-reduce more over DCN than the
  analytic count, which the compiled plan shows."""
  result = plan_lib.plan(load('gpt2_small', *TINY_GPT, 'mesh.dcn_data=2',
                              'model.tie_embeddings=true'), '2xcpu:4')
  net = result['network']
  embedding = 50304 * 256 * 4
  assert net['hlo']['dcn'] == pytest.approx(net['dcn_per_device'] + embedding / 4, rel=0.001)


@pytest.mark.parametrize('mesh, rel', [
    (('mesh.data=8',), 0.001),
    (('mesh.data=4', 'mesh.tensor=2'), 0.05),
    (('mesh.data=2', 'mesh.fsdp=4'), 0.1),
])
def test_ici_bytes_of_the_compiled_step_against_the_analytic_count(mesh, rel):
  """One slice of 8 CPU devices: data parallelism's reduce-scatter and all-gather of the
  gradients exactly (202.87 MB per device both); with tensor parallelism the compiled step sends
  3.2% more (94.0 MB against 91.1), with fsdp 8.8% more (220.6 MB against 202.9)."""
  net = plan_lib.plan(load('gpt2_small', *TINY_GPT, *mesh), 'cpu:8')['network']
  assert net['hlo']['dcn'] == 0
  assert net['ici_per_device'] == pytest.approx(net['hlo']['ici'], rel=rel)


def test_dcn_fsdp_compiled_sends_less_than_the_analytic_count():
  """fsdp across 2 slices: the analytic count (a reduce-scatter and an all-gather of all 115.9
  MB across the slices, 29.0 MB a device) is an upper bound; the compiled step sends 24.3 MB
  over DCN, and 144.9 MB against 173.9 inside the slices."""
  net = plan_lib.plan(load('gpt2_small', *TINY_GPT, 'mesh.data=1', 'mesh.fsdp=4',
                           'mesh.dcn_fsdp=2'), '2xcpu:4')['network']
  assert net['dcn_per_device'] == pytest.approx(net['param_bytes'] / 4)
  assert 0.8 * net['dcn_per_device'] < net['hlo']['dcn'] < net['dcn_per_device']
  assert 0.8 * net['ici_per_device'] < net['hlo']['ici'] < net['ici_per_device']


SMALL_SWITCH = ('data.batch_size=16', 'model.d_model=64', 'model.d_ff=128', 'model.num_heads=2',
                'model.d_kv=32')


def test_switch_base_128_keeps_a_sixteenth_of_its_experts_a_chip():
  """128 experts over mesh.expert=16 of a v4-32's 16 chips: 8 a device; the rest replicated."""
  result = analytic_plan('switch_base_128', 'v4-32', 'mesh.data=1', 'mesh.expert=16')
  experts = result['experts']
  assert experts['param_bytes'] == 4 * 128 * 12 * 2 * 768 * 3072  # 12 sparse layers of 128
  assert experts['per_device'] == experts['param_bytes'] / 16
  dense = 4 * result['num_params'] - experts['param_bytes']
  assert result['analytic']['params'] == pytest.approx(dense + experts['per_device'], rel=1e-6)
  text = plan_lib.format_plan(result)
  assert 'experts: 128 a sparse layer over mesh.expert=16, their parameters 1.69 GiB a device' in text


@pytest.mark.slow  # 54 s on 2 cores
def test_all_to_all_bytes_of_the_compiled_step_are_the_analytic_ones():
  """switch_tiny shrunk, top-2 in groups of 64 tokens, on 8 CPU devices as data 4 x expert 2:
  per sparse layer 2 all-to-alls forward (the slots to their experts and back), 3 backward (their
  gradients, and that of the combine weights on the way to the router): what the compiled step
  holds, byte for byte."""
  result = plan_lib.plan(load('switch_tiny', *SMALL_SWITCH, 'mesh.data=4', 'mesh.expert=2',
                              'model.expert_group_size=64', 'model.expert_top_k=2'), 'cpu:8')
  net = result['network']
  assert net['all_to_all_per_device'] == net['hlo']['all_to_all'] == 1_010_112
  assert 'all-to-all 1.0 MB a device a step (compiled HLO: 1.0 MB)' in plan_lib.format_plan(result)


def test_long_t5_flops_and_memory_against_a_real_cpu_compile():
  """LongT5's encoder counted as long_attention.sizes says (3 blocks and the global tokens per
  query): XLA's FLOPs of the compiled step agree, and its temporaries stand to the analytic
  activations as T5's do on XLA:CPU (see above)."""
  result = plan_lib.plan(load('long_t5_tiny', 'data.inputs_length=1024',
                              'data.targets_length=64', 'data.batch_size=2'), 'cpu:1')
  analytic, compiled = result['analytic'], result['compiled']
  assert result['xla_flops_per_device'] == pytest.approx(result['flops_per_device'], rel=0.1)
  fused = analytic['gradients'] + analytic['activations']
  assert fused < compiled['temp'] < 3 * fused


def test_long_t5_takes_twice_t5_1_1s_longest_input_on_a_v5e_chip():
  """The LongT5 repository's table (T5.1.1 base 6k against LongT5 base 12k on TPU v3), here on
  one v5e chip, 4 examples of 128 targets, bfloat16: 2,048 against 4,096 tokens."""
  settings = ('data.batch_size=4', 'data.targets_length=128', 'model.dtype=bfloat16',
              'model.scan_layers=true')
  t5 = plan_lib.longest_input(load('t5_1_1_base', *settings), 'v5e-1', compile_step=False)
  long = plan_lib.longest_input(load('long_t5_tglobal_base', *settings), 'v5e-1',
                                compile_step=False)
  assert (t5['inputs_length'], long['inputs_length']) == (2048, 4096)
  assert t5['plan']['fits'] and not t5['next']['fits'] and not long['next']['fits']
  text = plan_lib.format_longest(long)
  assert text.splitlines()[-1] == 'longest input that fits, in steps of 1,024: 4,096 tokens'
  assert 'inputs_length 5,120: ' in text and 'does NOT fit' in text


@pytest.mark.parametrize('preset, topology, match', [
    ('t5_tiny', 'cpu:1', 'needs a topology whose memory is known'),
    ('gpt2_small', 'v5e-1', 'varies data.inputs_length, which data.objective=causal_lm does'),
])
def test_longest_input_refuses_what_it_cannot_answer(preset, topology, match):
  with pytest.raises(ValueError, match=match):
    plan_lib.longest_input(load(preset), topology, compile_step=False)
