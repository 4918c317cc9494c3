"""The Mosaic flash kernels and a whole t5_1_1_base step with them, compiled by libtpu for TPU
generations' compile-only devices on this CPU host (as `t5lite plan` does). libtpu comes with the
`tpu` extra only (pip install -e .[tpu]); without it, as on CI, these tests are skipped. Whether
the kernels compute the right numbers is tests/models/test_flash_attention.py's (in Pallas'
interpreter); no TPU has run them yet (docs/tpu.md)."""

import importlib.util

import pytest

from t5lite import config as config_lib
from t5lite.commands import plan as plan_lib
from t5lite.train import run as run_lib

pytestmark = pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                                reason='libtpu is not installed (the tpu extra)')

# get_topology_desc's names, the devices' kinds, and the options of two-core chips
GENERATIONS = [('v4:2x2x1', 'TPU v4', {'chip_config_name': 'megacore'}),
               ('v5e:2x2', 'TPU v5 lite', {}),
               ('v5p:2x2x1', 'TPU v5', {'chip_config_name': 'megacore'}),
               ('v6e:2x2', 'TPU v6 lite', {})]


def device_of(name: str, options: dict):
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  return topologies.get_topology_desc(name, 'tpu', **options).devices[0]


@pytest.mark.parametrize('name, kind, options', GENERATIONS)
def test_the_flash_kernels_compile_for_tpu_v4_v5e_v5p_and_v6e(name, kind, options):
  """Forward and backward at 512 tokens, a head of 64 in bfloat16, with T5's bias (3-4 s each)."""
  from t5lite.models import flash_attention  # pylint: disable=import-outside-toplevel
  device = device_of(name, options)
  assert device.device_kind == kind
  assert flash_attention.compile_error(device) is None
  run_lib.check_flash_compiles(device)  # accepted


def test_flash_is_refused_in_one_line_on_tpu_v3_which_it_does_not_compile_for():
  """Mosaic has no bfloat16 matmul on v3: model.attention='flash' says so and names 'xla'."""
  with pytest.raises(ValueError, match=r"^model.attention='flash' does not compile for TPU v3 "
                     r"\(INTERNAL: Mosaic failed to compile TPU kernel: .*bf16.*\); use 'xla' "
                     r"\(--config.model.attention=xla\)$"):
    run_lib.check_flash_compiles(device_of('v3:2x2', {}))


@pytest.mark.slow  # 4-5 minutes each on 2 busy cores (load 9-23): libtpu compiles the whole step
@pytest.mark.parametrize('topology', ['v5e-1', 'v5p-8', 'v6e-1'])
def test_a_t5_1_1_base_step_with_the_flash_kernels_compiles_for_tpus(topology):
  """The train step of t5_1_1_base (bfloat16, scanned, save_dots; 8 rows a chip of 512/114
  tokens) with model.attention=flash: the encoder's, decoder's and cross-attention's kernels are
  TPU custom calls in the compiled step, and it fits the chip."""
  topo = plan_lib.parse_topology(topology)
  config = config_lib.load('configs/t5_1_1_base.py')
  config_lib.override(config, ['model.attention=flash', 'model.dtype=bfloat16',
                               'model.scan_layers=True', 'model.remat_policy=save_dots',
                               f'data.batch_size={8 * topo.num_devices}',
                               'data.source=synthetic'])
  devices = plan_lib.topology_devices(topo)
  run = run_lib.make_run(config, plan_lib.plan_mesh(config.mesh, topo, devices),
                         reads_text=False, platform='tpu')
  compiled = plan_lib.compile_train_step(run, run.loss(None),
                                         plan_lib.abstract_batch(config.data, run.batch_sharding))
  kernels = compiled.as_text().count('custom_call_target="tpu_custom_call"')
  assert kernels >= 9  # 3 attentions x (forward, dq, dk and dv), and remat's recomputed forwards
  assert plan_lib.compiled_memory(compiled)['total'] < topo.chip.hbm_gib * 2**30
