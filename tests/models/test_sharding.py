"""Logical axes on every parameter, `logical_axes`, `constrain`, and a sharded forward pass.

The mesh is real: 8 fake CPU devices (tests/conftest.py) as data x fsdp x tensor = 2 x 2 x 2.
"""

from flax import nnx
from flax.linen import partitioning
import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import ModelConfig, build, logical_axes
from t5lite.models.layers import constrain

NAMES = {'embed', 'mlp', 'heads', 'kv', 'vocab', 'layers', 'relpos_buckets', None}
RULES = (('batch', ('data', 'fsdp')), ('embed', 'fsdp'), ('mlp', 'tensor'), ('heads', 'tensor'),
         ('vocab', 'tensor'), ('kv', None), ('length', None), ('layers', None),
         ('relpos_buckets', None))


def tiny(**overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
                num_decoder_layers=2, max_length=32)
  return ModelConfig(**{**fields, **overrides})


def mesh_2x2x2():
  return jax.make_mesh((2, 2, 2), ('data', 'fsdp', 'tensor'), axis_types=(AxisType.Auto,) * 3)


def abstract(cfg: ModelConfig):
  return nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0)))


@pytest.mark.parametrize('cfg', [
    tiny(), tiny(scan_layers=True, tie_embeddings=False, activation='gated-gelu'),
    tiny(arch='encoder', position='learned', norm='layer', use_bias=True),
    tiny(arch='decoder', position='rope', scan_layers=True),
], ids=['t5', 't5_1_1_scanned', 'bert_like', 'gpt_like_scanned'])
def test_every_parameter_has_logical_axes(cfg):
  params = [(path, node) for path, node in nnx.iter_graph(abstract(cfg))
            if isinstance(node, nnx.Param)]
  assert params
  for path, param in params:
    axes = param.get_metadata()['out_sharding']
    assert len(axes) == len(param.shape) and set(axes) <= NAMES, (path, axes, param.shape)
    assert (axes[0] == 'layers') == (cfg.scan_layers and 'layers' in path), (path, axes)


def test_logical_axes_mirror_the_param_state():
  model = abstract(tiny(scan_layers=True))
  specs = logical_axes(model)
  params = nnx.state(model, nnx.Param)
  assert jax.tree.structure(specs) == jax.tree.structure(params)
  assert all(isinstance(s, P) for s in jax.tree.leaves(specs))
  assert specs['embed']['embedding'].get_value() == P('vocab', 'embed')
  assert specs['encoder']['relative_bias']['embedding'].get_value() == P('relpos_buckets', 'heads')
  assert (specs['decoder']['layers']['cross_attention']['q']['kernel'].get_value()
          == P('layers', 'embed', 'heads', 'kv'))
  wo = specs['decoder']['layers']['mlp']['wo']['kernel']
  assert wo.get_value() == P('layers', 'mlp', 'embed')
  with jax.set_mesh(mesh_2x2x2()), nnx.logical_axis_rules(RULES):  # still logical names
    assert logical_axes(model)['embed']['embedding'].get_value() == P('vocab', 'embed')


def test_parameters_are_never_sharded_eagerly():
  """The axis names are descriptive: building needs no mesh; under one, eval_shape reads them."""
  model = abstract(tiny())
  assert model.embed.embedding.get_metadata()['eager_sharding'] is False
  with jax.set_mesh(mesh_2x2x2()), nnx.logical_axis_rules(RULES):
    model = abstract(tiny())
  assert model.embed.embedding.get_value().sharding.spec == P('tensor', 'fsdp')


def test_constrain_is_a_no_op_without_rules_or_mesh():
  x = jnp.ones((4, 3, 32))
  assert constrain(x, ('batch', 'length', 'embed')) is x
  with nnx.logical_axis_rules(RULES):
    assert constrain(x, ('batch', 'length', 'embed')) is x


def test_constrain_maps_logical_names_to_the_mesh():
  mesh = mesh_2x2x2()
  with jax.set_mesh(mesh), nnx.logical_axis_rules(RULES):
    y = jax.jit(lambda x: constrain(x * 2, ('batch', 'length', 'embed')))(jnp.ones((4, 3, 32)))
    z = jax.jit(lambda x: constrain(x * 2, ('batch', 'length', 'mlp')))(jnp.ones((4, 3, 64)))
  # embed would take fsdp, which batch already uses: it stays replicated, as in T5X.
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(('data', 'fsdp'), None, None)), 3)
  assert z.sharding.is_equivalent_to(NamedSharding(mesh, P(('data', 'fsdp'), None, 'tensor')), 3)


@pytest.mark.slow
def test_sharded_forward_matches_one_device():
  """Params placed by their logical axes on a 2x2x2 mesh give the single-device logits."""
  cfg = tiny(scan_layers=True)
  model = build(cfg, nnx.Rngs(0))
  rng = np.random.RandomState(0)
  batch = {'encoder_input_tokens': jnp.asarray(rng.randint(1, 128, (4, 12)), jnp.int32),
           'decoder_input_tokens': jnp.asarray(rng.randint(1, 128, (4, 8)), jnp.int32)}
  forward = nnx.jit(lambda m, b: m(b))
  expected = forward(model, batch)
  mesh = mesh_2x2x2()
  shardings = jax.tree.map(
      lambda spec: NamedSharding(mesh, partitioning.logical_to_mesh_axes(tuple(spec), RULES)),
      logical_axes(model))
  state = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(jax.device_put, state, shardings))
  assert model.decoder.layers.mlp.wi.kernel.get_value().sharding.spec == P(None, 'fsdp', 'tensor')
  batch = jax.device_put(batch, NamedSharding(mesh, P(('data', 'fsdp'))))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(RULES):
    logits = forward(model, batch)
  assert logits.sharding.spec[0] == ('data', 'fsdp')
  np.testing.assert_allclose(logits, expected, atol=1e-5)
