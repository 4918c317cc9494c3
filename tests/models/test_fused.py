"""`model.fused_projections` and `model.remat_policy=save_attention`: the same model, computed
differently.

Fused projections change the call, not the parameters: the same nnx state gives the unfused
model's logits, gradients and decoded tokens. save_attention changes what the backward pass keeps,
not what it computes: save_dots' gradients, with the gated product and the attention output read
from residuals instead of recomputed (counted in the jaxpr of the gradient).
"""

import dataclasses

from flax import nnx
from flax.linen import partitioning
import jax
import jax.extend
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import ModelConfig, build, decoding, get_params, load_params, logical_axes
from t5lite.models.transformer import CHECKPOINT_POLICIES, Block, LayerInputs

ENCODER_LENGTH, DECODER_LENGTH = 12, 8
CASES = {  # encoder-decoder T5 v1.1 and v1.0, a decoder and an encoder with biases
    't5_1_1_scanned': dict(activation='gated-gelu', tie_embeddings=False, scan_layers=True,
                           remat_policy='save_dots'),
    't5_1_0': dict(remat_policy='full'),
    'decoder_rope_bias_scanned': dict(arch='decoder', position='rope', activation='gated-silu',
                                      use_bias=True, scan_layers=True,
                                      remat_policy='save_attention'),
    'bert_bias': dict(arch='encoder', position='learned', activation='gelu_erf', norm='layer',
                      norm_position='post', use_bias=True, remat_policy='save_attention'),
}


def tiny(**overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
                num_decoder_layers=2, max_length=32)
  return ModelConfig(**{**fields, **overrides})


def random_model(cfg: ModelConfig, seed: int = 1):
  """Built, then every parameter perturbed: biases (zeros when built) become nonzero."""
  model = build(cfg, nnx.Rngs(seed))
  rng = np.random.RandomState(seed)
  load_params(model, jax.tree.map(lambda x: np.asarray(x) + 0.05 * rng.randn(*x.shape),
                                  get_params(model)))
  return model


def fused_twin(model):
  """The same parameters (the same nnx state) under `fused_projections=True`."""
  twin = build(dataclasses.replace(model.cfg, fused_projections=True), nnx.Rngs(9))
  nnx.update(twin, nnx.state(model))
  return twin


def random_batch(cfg: ModelConfig, rows: int = 2) -> dict:
  rng = np.random.RandomState(3)
  batch = {'decoder_input_tokens': rng.randint(2, 128, (rows, DECODER_LENGTH))}
  if cfg.arch != 'decoder':
    batch = {'encoder_input_tokens': rng.randint(2, 128, (rows, ENCODER_LENGTH)),
             **({} if cfg.arch == 'encoder' else batch)}
  return {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}


@nnx.jit
def loss_and_grads(model, batch):
  """A random projection of the logits, and its gradients as a pure dict."""
  def loss(model):
    logits = model(batch)
    weights = jax.random.normal(jax.random.key(7), logits.shape[-1:])
    return jnp.mean(jnp.tanh(logits) * weights), logits

  (value, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  return value, logits, grads


def assert_grads_close(grads, expected, rtol=1e-6):
  """Every parameter's gradient within rtol of the expected one relative to its norm; one that is
  0 in exact arithmetic (the key bias: softmax ignores a shift of all of a query's logits) is
  float noise, within rtol of the largest gradient's norm."""
  grads, expected = nnx.to_pure_dict(grads), nnx.to_pure_dict(expected)
  largest = max(np.linalg.norm(g) for g in jax.tree.leaves(expected))

  def close(path, a, b):
    error, norm = np.linalg.norm(np.asarray(a) - np.asarray(b)), np.linalg.norm(b)
    scale = largest if norm < rtol * largest else norm  # below that: float noise around 0
    assert error <= rtol * scale, (jax.tree_util.keystr(path), error, norm)

  jax.tree_util.tree_map_with_path(close, grads, expected)


@pytest.mark.parametrize('case', sorted(CASES))
def test_fused_projections_give_the_unfused_logits_and_gradients(case):
  model = random_model(tiny(**CASES[case]))
  fused = fused_twin(model)
  batch = random_batch(model.cfg)
  loss, logits, grads = loss_and_grads(model, batch)
  fused_loss, fused_logits, fused_grads = loss_and_grads(fused, batch)
  np.testing.assert_allclose(fused_logits, logits, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(fused_loss, loss, rtol=1e-6)
  assert_grads_close(fused_grads, grads)


def test_fused_parameters_are_the_unfused_ones():
  """Same names, shapes and logical axes: checkpoints and the Hugging Face mapping still fit."""
  cfg = tiny(activation='gated-gelu', use_bias=True)
  fused = dataclasses.replace(cfg, fused_projections=True)
  shapes = [jax.tree.map(lambda x: x.shape, get_params(build(c, nnx.Rngs(0))))
            for c in (cfg, fused)]
  assert shapes[0] == shapes[1]
  axes = [logical_axes(nnx.eval_shape(lambda c=c: build(c, nnx.Rngs(0)))) for c in (cfg, fused)]
  assert jax.tree.leaves(axes[0]) == jax.tree.leaves(axes[1])


@pytest.mark.parametrize('overrides', [
    dict(activation='gated-gelu', tie_embeddings=False),
    dict(arch='decoder', position='rope', activation='gated-silu', use_bias=True,
         scan_layers=True),
])
def test_fused_greedy_decoding_gives_the_same_tokens(overrides):
  """Decoding reads the cache through the unfused halves; the encoder runs fused."""
  model = random_model(tiny(**overrides))
  inputs = np.random.RandomState(2).randint(2, 128, (3, 10)).astype(np.int32)
  inputs[1, 6:] = 0
  tokens = [np.asarray(decoding.generate(m, inputs, max_decode_length=8))
            for m in (model, fused_twin(model))]
  np.testing.assert_array_equal(tokens[1], tokens[0])


def test_sharded_fused_loss_matches_one_device():
  """On 8 CPU devices, data x fsdp x tensor = 2 x 2 x 2: the fused model's loss, the unfused
  one's on one device (heads and d_ff split over tensor)."""
  rules = (('batch', ('data', 'fsdp')), ('embed', 'fsdp'), ('mlp', 'tensor'),
           ('heads', 'tensor'), ('vocab', 'tensor'), ('kv', None), ('length', None),
           ('layers', None), ('relpos_buckets', None))
  model = random_model(tiny(activation='gated-gelu', scan_layers=True))
  batch = random_batch(model.cfg, rows=4)
  expected = loss_and_grads(model, batch)[0]
  fused = fused_twin(model)
  mesh = jax.make_mesh((2, 2, 2), ('data', 'fsdp', 'tensor'), axis_types=(AxisType.Auto,) * 3)
  shardings = jax.tree.map(
      lambda spec: NamedSharding(mesh, partitioning.logical_to_mesh_axes(tuple(spec), rules)),
      logical_axes(fused))
  nnx.update(fused, jax.tree.map(jax.device_put, nnx.state(fused, nnx.Param), shardings))
  batch = jax.device_put(batch, NamedSharding(mesh, P(('data', 'fsdp'))))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    loss = loss_and_grads(fused, batch)[0]
  np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_save_attention_gradients_are_save_dots_ones():
  """A t5_tiny-sized T5 v1.1 (d_model 256, d_ff 1024, 4 heads of 64, 4+4 layers)."""
  cfg = tiny(vocab_size=8192, d_model=256, d_ff=1024, num_heads=4, d_kv=64,
             num_encoder_layers=4, num_decoder_layers=4, activation='gated-gelu',
             tie_embeddings=False, scan_layers=True, remat_policy='save_dots')
  model = random_model(cfg)
  saving = build(dataclasses.replace(cfg, remat_policy='save_attention'), nnx.Rngs(9))
  nnx.update(saving, nnx.state(model))
  batch = random_batch(cfg)
  loss, _, grads = loss_and_grads(model, batch)
  saved_loss, _, saved_grads = loss_and_grads(saving, batch)
  np.testing.assert_allclose(saved_loss, loss, rtol=1e-6)
  assert_grads_close(saved_grads, grads)


def count_eqns(jaxpr, predicate) -> int:
  """Equations of a jaxpr and of every jaxpr nested in its equations' params that match."""
  count = 0
  for eqn in jaxpr.eqns:
    count += predicate(eqn)
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(inner, jax.extend.core.ClosedJaxpr):
          inner = inner.jaxpr
        if isinstance(inner, jax.extend.core.Jaxpr):
          count += count_eqns(inner, predicate)
  return count


def remat_layer(policy: str):
  """One T5 v1.1 encoder layer ('xla' attention) under the policy, as a pure function of its
  state and input, with them."""
  cfg = tiny(activation='gated-gelu')
  graph, state = nnx.split(Block(cfg, cross_attention=False, rngs=nnx.Rngs(0)))
  inputs = LayerInputs(mask=jnp.ones((1, 1, ENCODER_LENGTH, ENCODER_LENGTH), bool), bias=None,
                       positions=None)

  def layer(state, x):
    return nnx.merge(graph, state)(x, inputs, None, deterministic=True)

  x = jnp.ones((2, ENCODER_LENGTH, cfg.d_model))
  return jax.checkpoint(layer, policy=CHECKPOINT_POLICIES[policy]), state, x


def gradient_jaxpr(policy: str):
  layer, state, x = remat_layer(policy)
  grad = jax.grad(lambda state, x: jnp.sum(layer(state, x)), argnums=(0, 1))
  return jax.make_jaxpr(grad)(state, x).jaxpr


def named(name):
  return lambda eqn: eqn.primitive.name == 'name' and eqn.params['name'] == name


def test_save_attention_computes_the_gated_product_and_attention_output_once():
  """save_dots computes each named value twice, in the forward pass and again in the backward
  pass (for the output projections' weight gradients); save_attention once. The softmax's exp
  is recomputed under both: with 'xla' attention the backward needs the probabilities, which
  neither policy keeps."""
  counts = {}
  for policy in ('save_dots', 'save_attention'):
    jaxpr = gradient_jaxpr(policy)
    counts[policy] = [count_eqns(jaxpr, test) for test in (
        named('mlp_product'), named('attention_output'), lambda eqn: eqn.primitive.name == 'exp')]
  assert counts['save_dots'][:2] == [2, 2]
  assert counts['save_attention'][:2] == [1, 1]
  assert counts['save_attention'][2] == counts['save_dots'][2]


def test_save_attention_saves_the_named_residuals(capsys):
  """`jax.ad_checkpoint.print_saved_residuals` of a remat'd layer lists both names under
  save_attention only."""
  names = {}
  for policy in ('save_dots', 'save_attention'):
    jax.ad_checkpoint.print_saved_residuals(*remat_layer(policy))
    printed = capsys.readouterr().out
    names[policy] = {name for name in ('mlp_product', 'attention_output')
                     if f"named '{name}'" in printed}
  assert names == {'save_dots': set(), 'save_attention': {'mlp_product', 'attention_output'}}


def test_save_attention_saves_the_cudnn_kernels_residuals():
  """cuDNN's forward kernel, a primitive whose outputs (attention output, softmax statistics) its
  backward reads: saved, it does not run again in the backward pass (2 kernels a layer under
  save_dots on an H200, 1 under save_attention). The primitive's name, pinned against JAX's."""
  # pylint: disable-next=import-outside-toplevel
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  forward = cudnn._dot_product_attention_fwd_p_wrapper  # pylint: disable=protected-access
  assert CHECKPOINT_POLICIES['save_attention'](forward)
  assert not CHECKPOINT_POLICIES['save_dots'](forward)
