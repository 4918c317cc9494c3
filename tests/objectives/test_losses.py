"""Cross entropy with z-loss and label smoothing against an independent numpy implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp, softmax

from t5lite.objectives import losses


def numpy_losses(logits, targets, weights, z_loss, label_smoothing):
  """T5X's cross_entropy_with_logits the long way: an explicit smoothed one-hot target."""
  vocab = logits.shape[-1]
  low = label_smoothing / (vocab - 1)
  q = np.full(logits.shape, low)
  np.put_along_axis(q, targets[..., None], 1.0 - label_smoothing, axis=-1)
  log_z = logsumexp(logits, axis=-1)
  log_p = logits - log_z[..., None]
  entropy = -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), axis=-1)
  z = z_loss * log_z**2
  loss = -np.sum(q * log_p, axis=-1) - entropy + z
  return dict(loss=np.sum(loss * weights), z_loss=np.sum(z * weights), weight=np.sum(weights),
              correct=np.sum((logits.argmax(-1) == targets) * weights))


@pytest.fixture
def batch():
  rng = np.random.default_rng(0)
  logits = 3.0 * rng.normal(size=(2, 7, 11))
  targets = rng.integers(0, 11, size=(2, 7))
  weights = (rng.random((2, 7)) < 0.7).astype(np.float32)
  weights[0, 0] = 0.0
  return logits, targets, weights


@pytest.mark.parametrize('z_loss, label_smoothing', [(0.0, 0.0), (1e-4, 0.0), (0.0, 0.1),
                                                     (0.1, 0.2)])
def test_matches_numpy(batch, z_loss, label_smoothing):
  logits, targets, weights = batch
  got = losses.token_losses(jnp.asarray(logits, jnp.float32), targets, weights, z_loss=z_loss,
                            label_smoothing=label_smoothing)
  want = numpy_losses(logits, targets, weights, z_loss, label_smoothing)
  assert set(got) == set(want)
  for name in want:
    assert got[name].dtype == jnp.float32
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize('label_smoothing', [0.0, 0.1])
def test_a_perfect_prediction_costs_nothing(label_smoothing):
  vocab, targets = 32, np.array([[3, 0, 31]])
  q = np.full((1, 3, vocab), label_smoothing / (vocab - 1))
  np.put_along_axis(q, targets[..., None], 1.0 - label_smoothing, axis=-1)
  logits = np.log(np.maximum(q, 1e-30)) + 5.0  # softmax(logits) = q, shifted
  got = losses.token_losses(jnp.asarray(logits, jnp.float32), targets, np.ones((1, 3)),
                            label_smoothing=label_smoothing)
  np.testing.assert_allclose(got['loss'], 0.0, atol=1e-4)
  assert got['correct'] == 3


def test_z_loss_gradient(batch):
  logits, targets, weights = batch
  z_loss = 0.01
  grad = jax.grad(lambda x: losses.token_losses(x, targets, weights, z_loss=z_loss)['z_loss'])(
      jnp.asarray(logits, jnp.float32))
  # d/dx z * logsumexp(x)^2 = 2 z logsumexp(x) softmax(x), per weighted position.
  want = 2 * z_loss * logsumexp(logits, -1, keepdims=True) * softmax(logits, -1)
  np.testing.assert_allclose(grad, want * weights[..., None], rtol=1e-4, atol=1e-7)


def test_zero_weights_are_ignored(batch):
  logits, targets, weights = batch
  kwargs = dict(z_loss=1e-4, label_smoothing=0.1)
  base = losses.token_losses(jnp.asarray(logits), targets, weights, **kwargs)
  padding = weights == 0
  noisy = np.where(padding[..., None], 1e3 * np.random.default_rng(1).normal(size=logits.shape),
                   logits)
  moved = losses.token_losses(jnp.asarray(noisy), np.where(padding, 0, targets), weights, **kwargs)
  for name in base:
    np.testing.assert_allclose(moved[name], base[name], rtol=1e-6)


def test_microbatch_sums_add_up_to_the_batch(batch):
  logits, targets, weights = batch
  whole = losses.token_losses(jnp.asarray(logits), targets, weights, z_loss=1e-4)
  halves = [losses.token_losses(jnp.asarray(logits[i:i + 1]), targets[i:i + 1],
                                weights[i:i + 1], z_loss=1e-4) for i in (0, 1)]
  for name in whole:
    np.testing.assert_allclose(halves[0][name] + halves[1][name], whole[name], rtol=1e-6)


def test_bfloat16_logits_are_reduced_in_float32():
  logits = jnp.zeros((1, 4, 1000), jnp.bfloat16)
  got = losses.token_losses(logits, np.zeros((1, 4), np.int32), np.ones((1, 4)))
  np.testing.assert_allclose(got['loss'], 4 * np.log(1000), rtol=1e-6)


def test_loss_denominator():
  weights = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], np.float32)
  assert float(losses.loss_denominator(weights, 'real_tokens')) == 3.0
  assert float(losses.loss_denominator(weights, 'total_tokens')) == 8.0
  assert float(losses.loss_denominator(weights, 233472.0)) == 233472.0
  assert float(losses.loss_denominator(weights, '233472')) == 233472.0  # a --config override


@pytest.mark.parametrize('normalizer', ['tokens', 0, -1.0, 'nan', None])
def test_bad_normalizer_is_one_line(normalizer):
  with pytest.raises(ValueError, match='train.loss_normalizer=.* is not one of real_tokens, '
                                       'total_tokens or a positive number') as error:
    losses.loss_denominator(np.ones((2, 3)), normalizer)
  assert '\n' not in str(error.value)


def test_bad_label_smoothing():
  with pytest.raises(ValueError, match=r'train.label_smoothing must be in \[0, 1\), got 1.0'):
    losses.token_losses(jnp.zeros((1, 2, 5)), np.zeros((1, 2), int), np.ones((1, 2)),
                        label_smoothing=1.0)


@pytest.mark.parametrize('num_chunks', [1, 3, 4])
def test_chunked_losses_and_gradients_equal_unchunked(num_chunks):
  # 2 rows of 7 positions: 3 and 4 chunks leave padding (14 tokens, 7 per row, divide neither).
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(2, 7, 16)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(16, 50)) / 4, jnp.float32)
  # Half the targets are the argmax, so that `correct` counts something.
  targets = np.where(rng.random((2, 7)) < 0.5, np.argmax(x @ kernel, -1),
                     rng.integers(0, 50, (2, 7)))
  weights = (rng.random((2, 7)) < 0.8).astype(np.float32)
  options = dict(z_loss=1e-2, label_smoothing=0.1)

  def whole(x, kernel):
    return losses.token_losses(x @ kernel, targets, weights, **options)

  def chunked(x, kernel):
    return losses.chunked_token_losses(x, lambda h: h @ kernel, targets, weights, num_chunks,
                                       **options)

  want, got = whole(x, kernel), chunked(x, kernel)
  assert 0 < want['correct'] < want['weight'] and want['z_loss'] > 0
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)
  want_grads, got_grads = (jax.grad(lambda *a: f(*a)['loss'], argnums=(0, 1))(x, kernel)
                           for f in (whole, chunked))
  for want_grad, got_grad, name in zip(want_grads, got_grads, ('x', 'kernel')):
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7, err_msg=name)


def test_chunk_count_must_be_positive():
  with pytest.raises(ValueError, match='train.loss_chunks must be 0 .off. or a number of chunks, '
                                       'got -1'):
    losses.chunked_token_losses(jnp.zeros((1, 2, 3)), lambda h: h, np.zeros((1, 2), int),
                                np.ones((1, 2)), -1)


def group_batch(rows: int = 5):
  """Hidden states [5, 7, 16] and a projection to 50 logits; half the targets the argmax (so that
  `correct` counts something), padding here and there; rows in groups 0 1 0 2 1 of 4 (3 empty)."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(rows, 7, 16)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(16, 50)) / 4, jnp.float32)
  targets = np.where(rng.random((rows, 7)) < 0.5, np.argmax(x @ kernel, -1),
                     rng.integers(0, 50, (rows, 7)))
  weights = (rng.random((rows, 7)) < 0.8).astype(np.float32)
  component = np.array([0, 1, 0, 2, 1])[:rows]
  return x, kernel, targets, weights, component


@pytest.mark.parametrize('num_chunks', [0, 3])
@pytest.mark.parametrize('z_loss, label_smoothing', [(0.0, 0.0), (1e-2, 0.1)])
def test_group_sums_are_the_sums_over_each_groups_rows(num_chunks, z_loss, label_smoothing):
  x, kernel, targets, weights, component = group_batch()
  groups = jax.nn.one_hot(component, 4, dtype=jnp.float32)
  options = dict(z_loss=z_loss, label_smoothing=label_smoothing)
  if num_chunks:
    got = losses.chunked_token_losses(x, lambda h: h @ kernel, targets, weights, num_chunks,
                                      groups=groups, **options)
  else:
    got = losses.token_losses(x @ kernel, targets, weights, groups=groups, **options)
  for name in ('loss', 'weight', 'correct'):
    assert got[f'group_{name}'].shape == (4,) and got[f'group_{name}'].dtype == jnp.float32
  for group in range(4):
    rows = component == group
    alone = numpy_losses(np.asarray(x[rows] @ kernel, np.float64), targets[rows], weights[rows],
                         **options)
    for name in ('loss', 'weight', 'correct'):
      np.testing.assert_allclose(got[f'group_{name}'][group], alone[name], rtol=1e-5, atol=1e-6,
                                 err_msg=f'{name} of group {group}')
  assert got['group_weight'][3] == 0 and 0 < got['group_correct'][0] < got['group_weight'][0]
  for name in ('loss', 'weight', 'correct'):  # the groups make up the batch
    np.testing.assert_allclose(jnp.sum(got[f'group_{name}']), got[name], rtol=1e-5)


def test_groups_change_neither_the_sums_nor_the_gradient():
  x, kernel, targets, weights, component = group_batch()
  groups = jax.nn.one_hot(component, 3, dtype=jnp.float32)

  def total(x, groups=None):
    return losses.token_losses(x @ kernel, targets, weights, z_loss=1e-2, groups=groups)

  plain, grouped = total(x), total(x, groups)
  for name in plain:
    np.testing.assert_array_equal(grouped[name], plain[name], err_msg=name)
  np.testing.assert_array_equal(jax.grad(lambda x: total(x, groups)['loss'])(x),
                                jax.grad(lambda x: total(x)['loss'])(x))
  one = total(x, jnp.ones((len(component), 1)))  # a single group: the whole batch
  for name in ('loss', 'weight', 'correct'):
    np.testing.assert_allclose(one[f'group_{name}'], [plain[name]], rtol=1e-6, err_msg=name)
