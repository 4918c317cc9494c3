"""The mesh from config, the logical-axis rules and the divisibility checks, on 8 fake CPUs."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import spmd
from jax.sharding import AxisType, PartitionSpec as P

from t5lite import config as config_lib
from t5lite.config import base_config
from t5lite.models.config import ModelConfig
from t5lite.train import mesh as mesh_lib
from t5lite.train import run as run_lib

RULES = mesh_lib.rule_table(base_config().mesh.rules)


def make(data=-1, fsdp=1, tensor=1, devices=None):
  return mesh_lib.make_mesh(dict(data=data, fsdp=fsdp, tensor=tensor), devices)


def test_make_mesh_sizes_and_rest():
  assert jax.device_count() == 8
  mesh = mesh_lib.make_mesh(base_config().mesh)
  assert mesh.axis_names == ('data', 'fsdp', 'expert', 'tensor')
  assert dict(mesh.shape) == dict(data=8, fsdp=1, expert=1, tensor=1)
  assert mesh.axis_types == (AxisType.Auto,) * 4
  assert dict(make(2, -1, 2).shape) == dict(data=2, fsdp=2, expert=1, tensor=2)
  assert dict(make(devices=jax.devices()[:4]).shape) == dict(data=4, fsdp=1, expert=1, tensor=1)
  assert dict(mesh_lib.make_mesh(dict(data=2, fsdp=1, expert=4, tensor=1)).shape) == dict(
      data=2, fsdp=1, expert=4, tensor=1)


@pytest.mark.parametrize('sizes, match', [
    ((2, 2, 4), 'mesh.data=2 mesh.fsdp=2 mesh.expert=1 mesh.tensor=4 does not fit 8 devices'),
    ((-1, 3, 1), 'does not fit 8 devices'),
    ((-1, -1, 2), 'at most one -1'),
    ((0, 8, 1), 'positive'),
])
def test_make_mesh_refuses_a_mesh_that_does_not_fit(sizes, match):
  with pytest.raises(ValueError, match=match) as error:
    make(*sizes)
  assert '\n' not in str(error.value)


def test_parameter_layout_on_2x2x2():
  mesh = make(2, 2, 2)
  specs = {
      'wi': P('embed', 'mlp'),
      'wo': P('mlp', 'embed'),
      'q': P('embed', 'heads', 'kv'),
      'scale': P('embed'),
      'relpos': P('relpos_buckets', 'heads'),
      'stacked': P('layers', 'embed', 'mlp'),
      'lm_head': P('embed', 'vocab'),
  }
  shardings = mesh_lib.logical_to_sharding(specs, mesh, RULES)
  assert {k: s.spec for k, s in shardings.items()} == {
      'wi': P('fsdp', 'tensor'),
      'wo': P('tensor', 'fsdp'),
      'q': P('fsdp', 'tensor', None),
      'scale': P('fsdp'),
      'relpos': P(None, 'tensor'),
      'stacked': P(None, 'fsdp', 'tensor'),
      'lm_head': P('fsdp', 'tensor'),
  }
  # Placed for real: each device holds a quarter of wi (d_model/2 x d_ff/2).
  wi = jax.device_put(jnp.zeros((16, 32)), shardings['wi'])
  assert {shard.data.shape for shard in wi.addressable_shards} == {(8, 16)}


def test_activations_use_each_mesh_axis_once():
  mesh = make(2, 2, 2)
  spec = mesh_lib.logical_to_mesh_spec(P('batch', 'length', 'embed'), mesh, RULES)
  assert spec == P(('data', 'fsdp', 'expert'), None, None)
  # Inside a sparse layer, after the all-to-all: the experts over `expert`, the groups not
  spec = mesh_lib.logical_to_mesh_spec(P('batch_no_expert', 'expert', None, 'embed'), mesh, RULES)
  assert spec == P(('data', 'fsdp'), 'expert', None, None)


def test_dims_that_do_not_divide_are_replicated(caplog):
  mesh = make(2, 1, 4)
  specs = {'q': P('embed', 'heads', 'kv'), 'wi': P('embed', 'mlp')}
  shapes = {'q': jax.ShapeDtypeStruct((512, 6, 64), jnp.float32),  # T5 v1.1 small: 6 heads
            'wi': jax.ShapeDtypeStruct((512, 1024), jnp.float32)}
  with caplog.at_level(logging.WARNING):
    shardings = mesh_lib.logical_to_sharding(specs, mesh, RULES, shapes=shapes)
  assert shardings['q'].spec == P('fsdp', None, None)  # heads replicated
  assert shardings['wi'].spec == P('fsdp', 'tensor')
  assert 'size 6 does not divide' in caplog.text


def test_rules_come_from_the_config_and_must_cover_every_name():
  mesh = make(2, 2, 2)
  config = base_config()
  config_lib.override(config, ['--config.mesh.rules.embed=',
                               '--config.mesh.rules.vocab=fsdp,tensor'])
  rules = mesh_lib.rule_table(config.mesh.rules)
  shardings = mesh_lib.logical_to_sharding({'emb': P('vocab', 'embed')}, mesh, rules)
  assert shardings['emb'].spec == P(('fsdp', 'tensor'), None)
  with pytest.raises(ValueError, match="logical axis 'experts' has no sharding rule"):
    mesh_lib.logical_to_sharding({'w': P('experts', 'embed')}, mesh, rules)
  with pytest.raises(ValueError, match=r"the rule for 'mlp' names mesh axes \('model',\)"):
    mesh_lib.logical_to_sharding({'w': P('mlp')}, mesh, dict(rules, mlp='model'))


@pytest.mark.parametrize('rule', ['model', 'fsdp,fsdp', 'data,tensors'])
def test_a_rule_naming_no_mesh_axis_is_one_line(rule):
  config = base_config()
  config.mesh.rules.mlp = rule
  with pytest.raises(ValueError, match=f"config.mesh.rules.mlp='{rule}': give mesh axes of "
                                       'data, fsdp, expert, tensor') as error:
    mesh_lib.rule_table(config.mesh.rules)
  assert '\n' not in str(error.value)


def test_a_run_shards_its_parameters_and_batches_by_the_configs_rules():
  """t5_tiny on 2x2x2: by default the embedding is split over vocab (tensor) and d_model (fsdp);
  with embed replicated and the batch over data alone, neither fsdp split remains."""
  def run_of(*overrides):
    config = config_lib.load('configs/t5_tiny.py')
    config_lib.override(config, ['--config.mesh.data=2', '--config.mesh.fsdp=2',
                                 '--config.mesh.tensor=2', '--config.data.batch_size=8',
                                 *overrides])
    return run_lib.make_run(config)

  default, custom = run_of(), run_of('--config.mesh.rules.embed=',
                                     '--config.mesh.rules.batch=data')
  embedding = lambda run: run.spec.shardings.params['embed']['embedding'].value.spec
  assert embedding(default) == P('tensor', 'fsdp')
  assert embedding(custom) == P('tensor', None)
  assert default.batch_sharding.spec == P(('data', 'fsdp', 'expert'))
  assert custom.batch_sharding.spec == P('data')
  # The rules are in force while the model is traced: its activation constraints read them.
  with custom.sharding():
    assert dict(spmd.get_logical_axis_rules())['batch'] == 'data'


def test_batch_sharding_splits_examples_over_data_fsdp_and_expert():
  mesh = make(2, 2, 2)
  sharding = mesh_lib.batch_sharding(mesh, RULES)
  assert sharding.spec == P(('data', 'fsdp', 'expert'))
  batch = jax.device_put(jnp.zeros((8, 5), jnp.int32), sharding)
  assert {shard.data.shape for shard in batch.addressable_shards} == {(2, 5)}


def test_check_divisibility():
  data = base_config().data
  small = ModelConfig(num_heads=6, d_ff=1024)  # T5 v1.1 small
  mesh_lib.check_divisibility(small, data, make(4, 1, 2), RULES)
  with pytest.raises(ValueError, match=r'model.num_heads=6 is not divisible by mesh.tensor=4'):
    mesh_lib.check_divisibility(small, data, make(2, 1, 4), RULES)
  with pytest.raises(ValueError, match=r'model.d_ff=1020 .* mesh.tensor=8'):
    mesh_lib.check_divisibility(ModelConfig(num_heads=8, d_ff=1020), data, make(1, 1, 8), RULES)
  data.batch_size = 12
  with pytest.raises(ValueError, match=r'data.batch_size=12 .* mesh.data\*mesh.fsdp\*mesh.expert=8'):
    mesh_lib.check_divisibility(small, data, make(4, 2, 1), RULES)
  data.batch_size = 16
  experts = mesh_lib.make_mesh(dict(data=1, fsdp=2, expert=4, tensor=1))
  with pytest.raises(ValueError, match=r'mesh.expert=4 splits sparse experts and the model has '
                                       'none; set mesh.expert=1 or model.num_experts'):
    mesh_lib.check_divisibility(small, data, experts, RULES)
  with pytest.raises(ValueError, match=r'model.num_experts=6 is not divisible by mesh.expert=4'):
    mesh_lib.check_divisibility(ModelConfig(num_experts=6), data, experts, RULES)
  mesh_lib.check_divisibility(ModelConfig(num_experts=8), data, experts, RULES)


def fake_slices(per_slice: int):
  """Slices of consecutive CPU devices: CPU devices have no slice_index."""
  return lambda device: device.id // per_slice


@pytest.mark.parametrize('ici, dcn', [
    (dict(data=2, fsdp=2, tensor=1), dict(dcn_data=2)),
    (dict(data=1, fsdp=2, tensor=2), dict(dcn_data=2)),
    (dict(data=1, fsdp=1, expert=2, tensor=2), dict(dcn_data=2)),
    (dict(data=-1, fsdp=1, tensor=2), dict(dcn_fsdp=2)),
])
def test_hybrid_mesh_keeps_every_ici_axis_inside_a_slice(ici, dcn):
  mesh = mesh_lib.make_mesh({**ici, **dcn}, slice_of=fake_slices(4))
  sizes = mesh_lib.mesh_shape(ici, 4)
  dcn_sizes = (dcn.get('dcn_data', 1), dcn.get('dcn_fsdp', 1), 1, 1)
  assert tuple(mesh.shape.values()) == tuple(s * d for s, d in zip(sizes, dcn_sizes))
  slice_of = fake_slices(4)
  for index in np.ndindex(*mesh.devices.shape):
    # The slice is fixed by the DCN part of each index (slice-major), whatever the ICI part.
    dcn_index = tuple(i // s for i, s in zip(index, sizes))
    assert slice_of(mesh.devices[index]) == np.ravel_multi_index(dcn_index, dcn_sizes)


def test_one_slice_mesh_is_the_one_jax_make_mesh_builds():
  mesh = make(2, 2, 2)
  expected = jax.make_mesh((2, 2, 1, 2), mesh_lib.MESH_AXES, devices=jax.devices())
  assert (mesh.devices == expected.devices).all()


@pytest.mark.parametrize('dcn, slices, expected', [
    (dict(), 1, (1, 1, 1, 1)), (dict(), 4, (4, 1, 1, 1)), (dict(dcn_fsdp=2), 4, (2, 2, 1, 1)),
    (dict(dcn_data=-1, dcn_fsdp=4), 4, (1, 4, 1, 1)),
    (dict(dcn_data=2, dcn_fsdp=2), 4, (2, 2, 1, 1)),
])
def test_dcn_data_left_at_minus_1_takes_the_slices_dcn_fsdp_leaves(dcn, slices, expected):
  """The default: data parallel across every slice, and one slice anywhere (eval, export)."""
  assert mesh_lib.dcn_shape(dcn, slices, f'{slices} slices') == expected


@pytest.mark.parametrize('dcn, slice_of, match', [
    (dict(dcn_data=2), None, 'mesh.dcn_data=2 mesh.dcn_fsdp=1 must multiply to the number of '
     'slices .* the devices are 8 cpu devices in 1 slice of 8; set mesh.dcn_data \\* '
     'mesh.dcn_fsdp = 1'),
    (dict(dcn_data=3), fake_slices(4), 'devices are 8 cpu devices in 2 slices of 4'),
    (dict(dcn_data=2, dcn_fsdp=2), fake_slices(4), 'must multiply to the number of slices'),
    (dict(dcn_data=0, dcn_fsdp=2), fake_slices(4), 'must be positive'),
    (dict(dcn_fsdp=3), fake_slices(4), 'mesh.dcn_data=-1 mesh.dcn_fsdp=3 must multiply'),
    (dict(dcn_tensor=2), fake_slices(4), 'mesh.dcn_tensor: tensor parallelism stays inside'),
    (dict(dcn_data=2), fake_slices(6), 'in 2 slices of 2/6: slices of different sizes'),
])
def test_dcn_axes_that_do_not_match_the_slices_are_one_line(dcn, slice_of, match):
  kwargs = {'slice_of': slice_of} if slice_of else {}
  with pytest.raises(ValueError, match=match) as error:
    mesh_lib.make_mesh(dict(data=-1, fsdp=1, tensor=1, **dcn), **kwargs)
  assert '\n' not in str(error.value)
