"""The router's losses and metrics: hand-made router logits against hand-computed values and
against transformers' router_z_loss_func and load_balancing_loss_func; a batch's losses the sum
of its microbatches'."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.switch_transformers import modeling_switch_transformers as hf_switch

from t5lite import config as config_lib
from t5lite import objectives
from t5lite.models import ModelConfig, build, experts
from t5lite.objectives import routing


def layer_sums(logits, k=1, slots=None):
  logits = jnp.asarray(logits, jnp.float32)
  return experts.route(logits, k, slots or logits.shape[1]).sums


def test_hand_made_losses():
  """One row of 2 tokens, 2 experts, one layer: probabilities [.5 .5] and [.75 .25], both
  tokens choose expert 0 (a tie goes to the lower id); capacity 1 drops the second."""
  sums = routing.stack_sums([layer_sums(np.log([[[1., 1.], [3., 1.]]]), slots=1)], 2)
  metrics = routing.router_metrics({'encoder': sums})
  np.testing.assert_allclose(metrics['router_z_loss'], (np.log(2)**2 + np.log(4)**2) / 2,
                             rtol=1e-6)
  # f = [1, 0], P = [.625, .375]: 2 * (1 * .625)
  np.testing.assert_allclose(metrics['load_balance_loss'], 1.25, rtol=1e-6)
  np.testing.assert_allclose(metrics['router_confidence'], .625, rtol=1e-6)
  assert float(metrics['expert_dropped']) == .5
  assert (float(metrics['expert_load_min']), float(metrics['expert_load_max'])) == (0, 1)


def test_balanced_routing_scores_one():
  logits = np.log([[[4., 1.], [1., 4.], [4., 1.], [1., 4.]]])
  metrics = routing.router_metrics({'decoder': routing.stack_sums([layer_sums(logits)], 2)})
  np.testing.assert_allclose(metrics['load_balance_loss'], 1.0, rtol=1e-6)
  assert float(metrics['expert_load_min']) == float(metrics['expert_load_max']) == .5


@pytest.mark.parametrize('k', [1, 2])
def test_losses_are_transformers_over_pooled_layers(k):
  """Two sparse layers of 3 rows of 5 tokens and 4 experts, one of them scanned (a leading
  axis): transformers concatenates a stack's layers along the sequence and averages per row."""
  rng = np.random.RandomState(k)
  logits = [rng.randn(3, 5, 4).astype(np.float32) * 2 for _ in range(3)]
  first = layer_sums(logits[0], k)
  scanned = jax.tree.map(lambda *xs: jnp.stack(xs), layer_sums(logits[1], k),
                         layer_sums(logits[2], k))
  metrics = routing.router_metrics({'encoder': routing.stack_sums([first, scanned], 4)})
  joined = torch.from_numpy(np.concatenate(logits, axis=1))  # (rows, 3 * tokens, experts)
  top = torch.topk(joined, k, dim=-1).indices
  z = hf_switch.router_z_loss_func(joined)
  balance = hf_switch.load_balancing_loss_func(torch.softmax(joined, -1), top)
  np.testing.assert_allclose(metrics['router_z_loss'], float(z), rtol=1e-5)
  np.testing.assert_allclose(metrics['load_balance_loss'], float(balance), rtol=1e-5)


def moe_config():
  config = config_lib.base_config()
  config.model.update(vocab_size=128, d_model=16, d_ff=24, num_heads=2, d_kv=8,
                      num_encoder_layers=2, num_decoder_layers=2, num_experts=4,
                      train_capacity_factor=0.5, router_jitter=0.0)  # no draws: halves alike
  config.data.update(inputs_length=8, targets_length=6, batch_size=4)
  return config


def random_batch(rows: int) -> dict:
  rng = np.random.RandomState(0)
  batch = {name: rng.randint(2, 128, (rows, length)) for name, length in (
      ('encoder_input_tokens', 8), ('decoder_input_tokens', 6), ('decoder_target_tokens', 6))}
  batch['decoder_loss_weights'] = (rng.rand(rows, 6) < .8)
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.int32), batch)


def test_microbatches_add_up_to_the_batch():
  config = moe_config()
  model_cfg = config_lib.model_config(config)
  loss = objectives.make_loss(config, model_cfg)
  model = build(model_cfg, nnx.Rngs(0))
  batch = random_batch(4)
  sums = nnx.jit(lambda model, rows: loss.sums(model, rows, None, jax.random.key(0), train=True))
  whole = sums(model, batch)
  halves = [sums(model, jax.tree.map(lambda x, i=i: x[2 * i:2 * i + 2], batch)) for i in (0, 1)]
  added = jax.tree.map(jnp.add, *halves)
  denominators = loss.denominators(batch)
  np.testing.assert_allclose(loss.minimised(added, denominators),
                             loss.minimised(whole, denominators), rtol=1e-6)
  metrics = loss.metrics(whole)
  objective = loss.minimised(whole, denominators) - (
      1e-3 * metrics['router_z_loss'] + 1e-2 * metrics['load_balance_loss'])
  np.testing.assert_allclose(objective, metrics['loss'], rtol=1e-6)  # no loss_normalizer here
  assert 0 < float(metrics['expert_dropped']) < 1  # capacity 0.5 of a row
  assert metrics['expert_load_min'] <= 0.25 <= metrics['expert_load_max']
