"""Schedules at known steps, Adafactor's factored state (T5's attention views included),
nanoT5's AdamWScale against numpy."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from t5lite import config as config_lib
from t5lite import models
from t5lite.config import base_config
from t5lite.train import mesh as mesh_lib
from t5lite.train import optim
from t5lite.train import state as state_lib


def optim_cfg(**changes) -> ml_collections.ConfigDict:
  cfg = base_config().optim
  cfg.update(changes)
  return cfg


def test_rsqrt_is_t5s_schedule():
  schedule = optim.make_schedule(optim_cfg(), total_steps=100_000)  # lr 0.01, warmup 10k
  for step, lr in [(0, 0.01), (5_000, 0.01), (10_000, 0.01), (40_000, 0.005),
                   (90_000, 0.01 / 3), (1_000_000, 0.001)]:
    np.testing.assert_allclose(schedule(step), lr, rtol=1e-6)
    np.testing.assert_allclose(schedule(step), 1 / np.sqrt(max(step, 10_000)), rtol=1e-6)


def test_cosine_warms_up_linearly_then_decays_to_zero():
  schedule = optim.make_schedule(
      optim_cfg(schedule='cosine', learning_rate=1e-3, warmup_steps=100), total_steps=1_000)
  for step, lr in [(0, 0.0), (50, 5e-4), (100, 1e-3), (550, 5e-4), (1_000, 0.0)]:
    np.testing.assert_allclose(schedule(step), lr, atol=1e-9)
  # A quarter into the decay: 1e-3 * (1 + cos(pi / 4)) / 2.
  np.testing.assert_allclose(schedule(325), 1e-3 * (1 + np.cos(np.pi / 4)) / 2, rtol=1e-5)


def test_constant():
  schedule = optim.make_schedule(optim_cfg(schedule='constant', learning_rate=3e-4), 10)
  assert float(schedule(0)) == float(schedule(7)) == pytest.approx(3e-4)


@pytest.mark.parametrize('changes, total_steps, match', [
    (dict(schedule='linear'), 10, "optim.schedule='linear' is not one of rsqrt, cosine, constant"),
    (dict(schedule='rsqrt', warmup_steps=0), 10, 'rsqrt needs optim.warmup_steps > 0'),
    (dict(schedule='cosine', warmup_steps=10_000), 2_000, 'warmup_steps=10000 must be below'),
    (dict(name='sgd'), 10, "optim.name='sgd' is not one of adafactor, adamw, adamw_scaled"),
])
def test_bad_settings_give_one_line(changes, total_steps, match):
  with pytest.raises(ValueError, match=match) as error:
    optim.make_optimizer(optim_cfg(**changes), total_steps)
  assert '\n' not in str(error.value)


def test_adafactor_factors_only_large_matrices():
  params = {'kernel': jnp.zeros((256, 1024)), 'scale': jnp.zeros((64,)),
            'stacked': jnp.zeros((4, 512, 1024)), 'small': jnp.zeros((64, 1024))}
  state = optim.make_optimizer(optim_cfg(), 100).init(params)
  shapes = {name: jax.tree.map(jnp.shape, optax.tree_utils.tree_get(state, name))
            for name in ('v_row', 'v_col', 'v')}
  # (256, 1024): one row and one column statistic instead of 256 x 1024.
  assert [shapes[n]['kernel'] for n in ('v_row', 'v_col', 'v')] == [(256,), (1024,), (1,)]
  # Scanned layers keep their leading axis; the two largest dims are factored.
  assert [shapes[n]['stacked'] for n in ('v_row', 'v_col', 'v')] == [(4, 512), (4, 1024), (1,)]
  # Vectors and matrices with a dim under 128 keep the full second moment.
  assert [shapes[n]['scale'] for n in ('v_row', 'v_col', 'v')] == [(1,), (1,), (64,)]
  assert shapes['v']['small'] == (64, 1024)


def stat_shapes(state) -> dict:
  return {name: jax.tree.map(jnp.shape, optax.tree_utils.tree_get(state, name))
          for name in ('v_row', 'v_col', 'v')}


# Attention kernels of d_model 256 with 4 heads of 64, and their logical axes.
ATTENTION = {'q': ((256, 4, 64), P('embed', 'heads', 'kv')),
             'o': ((4, 64, 256), P('heads', 'kv', 'embed'))}


def test_adafactor_factors_attention_kernels_over_d_model_by_heads_times_kv():
  params = {name: jnp.zeros(shape) for name, (shape, _) in ATTENTION.items()}
  axes = {name: spec for name, (_, spec) in ATTENTION.items()}
  t5 = stat_shapes(optim.make_optimizer(optim_cfg(), 100, logical_axes=axes).init(params))
  plain = stat_shapes(optim.make_optimizer(optim_cfg(), 100).init(params))
  # 256 + 256 statistics (and a 1-float placeholder) instead of a 65,536-float second moment.
  assert [t5[n]['q'] for n in ('v_row', 'v_col', 'v')] == [(256,), (256,), (1,)]
  assert [t5[n]['o'] for n in ('v_row', 'v_col', 'v')] == [(256,), (256,), (1,)]
  assert plain['v'] == {'q': (256, 4, 64), 'o': (4, 64, 256)}


def test_adafactor_on_the_view_is_optax_adafactor_on_the_reshaped_matrix():
  rng = np.random.default_rng(0)
  params = {name: jnp.asarray(rng.normal(size=shape), jnp.float32)
            for name, (shape, _) in ATTENTION.items()}
  axes = {name: spec for name, (_, spec) in ATTENTION.items()}
  t5 = optim.make_optimizer(optim_cfg(), 100, logical_axes=axes)
  plain = optim.make_optimizer(optim_cfg(), 100)  # optax.adafactor, after global-norm clipping
  matrices = jax.tree.map(lambda x: x.reshape(256, 256), params)
  t5_state, matrix_state, plain_state = t5.init(params), plain.init(matrices), plain.init(params)
  for _ in range(3):
    grads = {name: jnp.asarray(rng.normal(size=x.shape), jnp.float32)
             for name, x in params.items()}
    got, t5_state = t5.update(grads, t5_state, params)
    want, matrix_state = plain.update(jax.tree.map(lambda g: g.reshape(256, 256), grads),
                                      matrix_state, matrices)
    unfactored, plain_state = plain.update(grads, plain_state, params)
    for name, x in params.items():
      assert got[name].shape == x.shape
      assert np.abs(got[name] - want[name].reshape(x.shape)).max() < 1e-6
      # Without views optax keeps a full second moment: a visibly different update (~3e-2).
      assert np.abs(got[name] - unfactored[name]).max() > 1e-3


def test_scanned_attention_kernels_are_factored_layer_by_layer():
  layers, rng = 3, np.random.default_rng(1)
  param = jnp.asarray(rng.normal(size=(layers, 256, 4, 64)), jnp.float32)
  axes = P('layers', 'embed', 'heads', 'kv')
  state = optim.make_optimizer(optim_cfg(), 100, logical_axes=[axes]).init([param])
  assert [stat_shapes(state)[n][0] for n in ('v_row', 'v_col', 'v')] == [
      (layers, 256), (layers, 256), (1,)]
  # The factored second moment alone, on the stack and on each layer's (256, 256) matrix.
  stacked = optim.factor_like_t5(optax.scale_by_factored_rms(), [axes])
  stacked_state = stacked.init([param])
  per_layer = optax.scale_by_factored_rms()
  layer_states = [per_layer.init(param[i].reshape(256, 256)) for i in range(layers)]
  for _ in range(2):
    grad = jnp.asarray(rng.normal(size=param.shape), jnp.float32)
    [got], stacked_state = stacked.update([grad], stacked_state, [param])
    for i in range(layers):
      want, layer_states[i] = per_layer.update(grad[i].reshape(256, 256), layer_states[i],
                                               param[i].reshape(256, 256))
      assert np.abs(got[i] - want.reshape(256, 4, 64)).max() < 1e-6
      for name in ('v_row', 'v_col'):
        np.testing.assert_allclose(getattr(stacked_state, name)[0][i],
                                   getattr(layer_states[i], name), rtol=1e-6)
  # Small layers are not factored, like each of them alone; 'layers' is never factored over.
  small = jax.ShapeDtypeStruct((layers, 16, 4, 8), jnp.float32)
  assert jax.eval_shape(stacked.init, [small]).v[0].shape == (layers, 16, 32)
  with pytest.raises(ValueError, match=r'factor a scanned \(300, 256, 2, 64\) parameter over'):
    jax.eval_shape(stacked.init, [jax.ShapeDtypeStruct((300, 256, 2, 64), jnp.float32)])


def test_t5_1_1_base_optimizer_state_before_and_after_views():
  config = config_lib.load('configs/t5_1_1_base.py')  # unrolled layers
  model_cfg = config_lib.model_config(config)
  params = nnx.state(nnx.eval_shape(lambda: models.build(model_cfg, nnx.Rngs(0))), nnx.Param)

  def floats(logical_axes) -> int:
    tx = optim.make_optimizer(config.optim, 100, logical_axes=logical_axes)
    state = jax.eval_shape(tx.init, params)
    return sum(x.size for x in jax.tree.leaves(state) if x.dtype == jnp.float32)

  # Each parameter holds v_row, v_col and v; the unused ones are 1-float placeholders.
  # Factored (rows + cols + 1): embedding and lm head 32128 + 768 + 1 = 32,897 each; attention
  # q/k/v/o views 768 + 768 + 1 = 1,537; wi_0, wi_1, wo 768 + 2048 + 1 = 2,817.
  # Unfactored (1 + 1 + size): norms 770, relative position tables (32, 12) 386.
  # Encoder layer: 2 norms + 4 attention + 3 MLP = 1,540 + 6,148 + 8,451 = 16,139;
  # decoder layer: 3 norms + 8 attention + 3 MLP = 2,310 + 12,296 + 8,451 = 23,057.
  # 2 * 32,897 + 12 * (16,139 + 23,057) + 2 * (770 + 386) = 65,794 + 470,352 + 2,312 = 538,458.
  assert floats(state_lib.param_axes(model_cfg)) == 538_458  # 2.15 MB of float32
  # Without views the 144 attention kernels keep 768 * 768 + 2 floats instead of 1,537:
  # 538,458 + 144 * (589,826 - 1,537) = 85,252,074 (341 MB).
  assert floats(None) == 85_252_074


def test_view_statistics_follow_the_kept_param_dims():
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2)),
                            jax.devices()[:8])
  params = {'q': jax.ShapeDtypeStruct((256, 4, 32), jnp.float32),
            'wi': jax.ShapeDtypeStruct((256, 1024), jnp.float32),
            'square': jax.ShapeDtypeStruct((256, 4, 64), jnp.float32)}
  axes = {'q': P('embed', 'heads', 'kv'), 'wi': P('embed', 'mlp'),
          'square': P('embed', 'heads', 'kv')}
  rules = mesh_lib.rule_table(config_lib.base_config().mesh.rules)
  param_shardings = mesh_lib.logical_to_sharding(axes, mesh, rules, shapes=params)
  replicated = jax.sharding.NamedSharding(mesh, P())

  def specs(name, logical_axes):
    tx = optim.make_optimizer(optim_cfg(name=name), 100, logical_axes=logical_axes)
    shardings = state_lib.opt_state_shardings(tx, params, param_shardings,
                                              jax.eval_shape(tx.init, params), replicated,
                                              logical_axes)
    return jax.tree.map(lambda s: s.spec, shardings)

  t5 = {n: optax.tree_utils.tree_get(specs('adafactor', axes), n) for n in ('v_row', 'v_col')}
  # q's view is (256, 128): optax's v_row keeps the second largest dim, heads * kv, made of two
  # param dims (heads on tensor): replicated; v_col keeps d_model, on fsdp like the param's.
  assert (t5['v_row']['q'], t5['v_col']['q']) == (P(None), P('fsdp'))
  assert (t5['v_row']['wi'], t5['v_col']['wi']) == (P('fsdp'), P('tensor'))
  # A square view's rows and columns have the same shape, so either could be which: replicated.
  assert (t5['v_row']['square'], t5['v_col']['square']) == (P(), P())
  assert optax.tree_utils.tree_get(specs('adamw', axes), 'mu') == {
      'q': P('fsdp', 'tensor', None), 'wi': P('fsdp', 'tensor'),
      'square': P('fsdp', 'tensor', None)}


@pytest.mark.parametrize('name, lr', [('adafactor', 0.1), ('adamw', 0.05), ('adamw_scaled', 0.1)])
def test_each_optimizer_reduces_a_quadratic(name, lr):
  target = jax.random.normal(jax.random.key(0), (256, 128))
  params = {'w': jnp.ones((256, 128)), 'b': jnp.ones((128,))}
  loss = lambda p: jnp.sum((p['w'] - target) ** 2) + jnp.sum(p['b'] ** 2)
  tx = optim.make_optimizer(optim_cfg(name=name, schedule='constant', learning_rate=lr), 20)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  start = loss(params)
  for _ in range(20):
    params, state = step(params, state)
  assert loss(params) < 0.7 * start


def test_clipping_is_by_global_norm_before_the_optimizer():
  params = {'w': jnp.ones((4, 3)), 'b': jnp.ones((3,))}
  grads = [jax.tree.map(lambda p: 10.0 * scale * p, params) for scale in (1.0, 0.01)]
  clipped = optim.make_optimizer(optim_cfg(name='adamw', clip_grad_norm=1.0), 10)
  plain = optim.make_optimizer(optim_cfg(name='adamw', clip_grad_norm=0.0), 10)
  state_clipped, state_plain = clipped.init(params), plain.init(params)
  for g in grads:
    norm = float(optax.global_norm(g))
    by_hand = jax.tree.map(lambda x: x * min(1.0, 1.0 / norm), g)
    got, state_clipped = clipped.update(g, state_clipped, params)
    want, state_plain = plain.update(by_hand, state_plain, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)


def adamw_scale_numpy(param, grads, lr, weight_decay, b1=0.9, b2=0.999, eps=1e-6):
  """nanoT5's AdamWScale.step, transcribed to numpy for one tensor."""
  p, m, v = param.astype(np.float64), np.zeros_like(param), np.zeros_like(param)
  for t, g in enumerate(grads, start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    step_size = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    step_size *= max(1e-3, np.sqrt(np.mean(p * p)))
    p = p - step_size * m / (np.sqrt(v) + eps)
    p = p - lr * weight_decay * p
  return p


@pytest.mark.parametrize('scale', [3.0, 1e-5])  # param RMS above and below the 1e-3 floor
def test_adamw_scaled_matches_nanot5(scale):
  rng = np.random.default_rng(0)
  param = scale * rng.normal(size=(8, 16)).astype(np.float32)
  grads = [rng.normal(size=(8, 16)).astype(np.float32) for _ in range(3)]
  cfg = optim_cfg(name='adamw_scaled', schedule='constant', learning_rate=0.01,
                  weight_decay=0.1, clip_grad_norm=0.0)
  tx = optim.make_optimizer(cfg, 3)
  p, state = jnp.asarray(param), tx.init(jnp.asarray(param))
  for g in grads:
    updates, state = tx.update(jnp.asarray(g), state, p)
    p = optax.apply_updates(p, updates)
  moved = adamw_scale_numpy(param, grads, lr=0.01, weight_decay=0.1) - param
  # The step is ~3 lr x max(1e-3, RMS(param)); nanoT5 decays the already-updated weight and adds
  # eps before bias correction, which moves it by well under 1%.
  np.testing.assert_allclose(np.abs(moved).max(), 3 * 0.01 * max(1e-3, scale), rtol=0.1)
  np.testing.assert_allclose(p - param, moved, rtol=0, atol=0.01 * np.abs(moved).max())
