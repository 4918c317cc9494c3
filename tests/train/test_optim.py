"""Schedules at known steps, Adafactor's factored state, nanoT5's AdamWScale against numpy."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from t5lite.config import base_config
from t5lite.train import optim


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


def test_weight_decay_mask_spares_masked_parameters():
  params = {'w': jnp.ones((4, 4)), 'scale': jnp.ones((4,))}
  zeros = jax.tree.map(jnp.zeros_like, params)
  for name in optim.OPTIMIZERS:
    cfg = optim_cfg(name=name, schedule='constant', learning_rate=0.1, weight_decay=0.5)
    tx = optim.make_optimizer(cfg, 10, weight_decay_mask={'w': True, 'scale': False})
    updates, _ = tx.update(zeros, tx.init(params), params)
    assert float(jnp.max(updates['w'])) < 0, name
    np.testing.assert_array_equal(updates['scale'], 0.0)
