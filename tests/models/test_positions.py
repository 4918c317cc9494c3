"""Position encodings: T5's bucketing against Hugging Face's, sinusoids, and RoPE's relativity."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models.config import ModelConfig
from t5lite.models.positions import (RelativePositionBias, apply_rope, bucket_thresholds,
                                     relative_position_bucket, sinusoidal_positions)


# The presets' setting (32, 128: every T5, LongT5 and UL2 preset), the tests' small ones, and
# wider ones whose boundaries float32's log rounds either way
SETTINGS = [(32, 128), (16, 40), (32, 20), (8, 16), (64, 256), (128, 1024), (32, 4096)]


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('num_buckets, max_distance', SETTINGS)
def test_relative_position_bucket_matches_transformers_up_to_65536(bidirectional, num_buckets,
                                                                    max_distance):
  """Every distance in [-65536, 65536], the integer thresholds against transformers' float log."""
  torch = pytest.importorskip('torch')
  from transformers.models.t5.modeling_t5 import T5Attention
  relative = np.arange(-65_536, 65_537)
  theirs = T5Attention._relative_position_bucket(
      torch.tensor(relative), bidirectional=bidirectional, num_buckets=num_buckets,
      max_distance=max_distance).numpy()
  ours = relative_position_bucket(jnp.asarray(relative), bidirectional=bidirectional,
                                  num_buckets=num_buckets, max_distance=max_distance)
  np.testing.assert_array_equal(ours, theirs)
  assert theirs.max() == num_buckets - 1  # the distances reach the last bucket


def test_bucket_thresholds_are_integers_that_need_no_log():
  """T5's boundaries for 16 buckets a direction and 128: 8 * 16**(k/8), so 16, 32 and 64 are
  exact (log gives exactly 2.0, 4.0, 6.0) and the others the next integer above 8 * 2**(k/2)."""
  assert bucket_thresholds(16, 128) == (12, 16, 23, 32, 46, 64, 91)
  buckets = relative_position_bucket(jnp.asarray([15, 16, 63, 64, 90, 91]), bidirectional=False,
                                     num_buckets=16, max_distance=128)
  assert buckets.tolist() == [0] * 6
  buckets = relative_position_bucket(-jnp.asarray([15, 16, 63, 64, 90, 91]), bidirectional=False,
                                     num_buckets=16, max_distance=128)
  assert buckets.tolist() == [9, 10, 13, 14, 14, 15]
  assert 'log' not in jax.jit(lambda d: relative_position_bucket(
      d, bidirectional=True, num_buckets=32, max_distance=128)).lower(
          jnp.arange(4)).as_text()


def test_relative_position_bucket_examples():
  buckets = relative_position_bucket(jnp.asarray([-1, 0, 1, 8, 200, -200]), bidirectional=True,
                                     num_buckets=32, max_distance=128)
  assert buckets.tolist() == [1, 0, 17, 24, 31, 15]
  causal = relative_position_bucket(jnp.asarray([3, 0, -1, -200]), bidirectional=False,
                                    num_buckets=32, max_distance=128)
  assert causal.tolist() == [0, 0, 1, 31]  # the future shares bucket 0 (it is masked anyway)


@pytest.mark.parametrize('bidirectional', [True, False])
def test_relative_bias_is_the_table_at_each_bucket_and_its_gradient_has_no_scatter(bidirectional):
  """The bias equals the table's row at each pair's bucket, bit for bit, also for a decoding
  step's queries past the start; and the table's gradient is a matmul, not a scatter-add (which
  a GPU sums in no fixed order: a resumed run's table differed from the uninterrupted run's)."""
  cfg = ModelConfig(num_heads=3, relative_buckets=8, relative_max_distance=16)
  bias = RelativePositionBias(cfg, bidirectional=bidirectional, rngs=nnx.Rngs(0))
  table = np.asarray(bias.embedding[...])
  for query_length, key_length, offset in ((5, 7, 0), (1, 9, 6)):
    queries = offset + np.arange(query_length)
    bucket = relative_position_bucket(np.arange(key_length)[None] - queries[:, None],
                                      bidirectional=bidirectional, num_buckets=8, max_distance=16)
    expected = table[np.asarray(bucket)].transpose(2, 0, 1)[None]  # (1, h, q, k)
    got = bias(query_length, key_length, jnp.int32(offset))
    assert got.shape == (1, 3, query_length, key_length)
    np.testing.assert_array_equal(got, expected)

  graphdef, params = nnx.split(bias)

  def loss(params):
    return jnp.sum(nnx.merge(graphdef, params)(6, 6) * jnp.arange(36.0).reshape(6, 6))

  assert 'scatter' not in jax.jit(jax.grad(loss)).lower(params).as_text()
  grad = np.asarray(jax.jit(jax.grad(loss))(params)['embedding'][...])
  bucket = np.asarray(relative_position_bucket(np.arange(6)[None] - np.arange(6)[:, None],
                                               bidirectional=bidirectional, num_buckets=8,
                                               max_distance=16))
  weights = np.arange(36.0).reshape(6, 6)
  for b in range(8):  # each bucket's row: the sum of the weights of its pairs, in every head
    np.testing.assert_allclose(grad[b], np.full(3, weights[bucket == b].sum()), rtol=1e-6)


def test_sinusoidal_positions():
  encoding = sinusoidal_positions(jnp.asarray([[0, 1, 5]]), 8)
  assert encoding.shape == (1, 3, 8)
  np.testing.assert_allclose(encoding[0, 0], [0, 0, 0, 0, 1, 1, 1, 1], atol=1e-7)
  np.testing.assert_allclose(encoding[0, 2, 0], np.sin(5.0), rtol=1e-6)  # fastest: timescale 1
  np.testing.assert_allclose(encoding[0, 2, 7], np.cos(5.0 / 10_000), rtol=1e-6)  # slowest


def test_rope_logits_depend_only_on_distance():
  rng = np.random.RandomState(0)
  q, k = (jnp.asarray(rng.randn(1, 1, 2, 8), jnp.float32) for _ in range(2))

  def logit(query_position, key_position):
    rotated_q = apply_rope(q, jnp.asarray([[query_position]]))
    rotated_k = apply_rope(k, jnp.asarray([[key_position]]))
    return jnp.einsum('bqhd,bkhd->bhqk', rotated_q, rotated_k)  # (b, 1, h, d) x2 -> (b, h, 1, 1)

  np.testing.assert_allclose(logit(3, 1), logit(10, 8), rtol=1e-5)
  np.testing.assert_allclose(logit(0, 0), jnp.einsum('bqhd,bkhd->bhqk', q, k), rtol=1e-6)
  assert not np.allclose(logit(3, 1), logit(3, 2))
