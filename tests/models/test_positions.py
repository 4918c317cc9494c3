"""Position encodings: T5's bucketing against Hugging Face's, sinusoids, and RoPE's relativity."""

import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models.positions import apply_rope, relative_position_bucket, sinusoidal_positions


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('num_buckets, max_distance', [(32, 128), (16, 40)])
def test_relative_position_bucket_matches_transformers(bidirectional, num_buckets, max_distance):
  torch = pytest.importorskip('torch')
  from transformers.models.t5.modeling_t5 import T5Attention
  relative = np.arange(-600, 600)
  theirs = T5Attention._relative_position_bucket(
      torch.tensor(relative), bidirectional=bidirectional, num_buckets=num_buckets,
      max_distance=max_distance).numpy()
  ours = relative_position_bucket(jnp.asarray(relative), bidirectional=bidirectional,
                                  num_buckets=num_buckets, max_distance=max_distance)
  np.testing.assert_array_equal(ours, theirs)


def test_relative_position_bucket_examples():
  buckets = relative_position_bucket(jnp.asarray([-1, 0, 1, 8, 200, -200]), bidirectional=True,
                                     num_buckets=32, max_distance=128)
  assert buckets.tolist() == [1, 0, 17, 24, 31, 15]
  causal = relative_position_bucket(jnp.asarray([3, 0, -1, -200]), bidirectional=False,
                                    num_buckets=32, max_distance=128)
  assert causal.tolist() == [0, 0, 1, 31]  # the future shares bucket 0 (it is masked anyway)


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
