"""The router's losses and metrics around any objective's loss, for a model with sparse experts
(models/experts.py): what `make_loss` wraps a run's loss in when `model.num_experts` > 0.

Per layer stack, as Hugging Face's SwitchTransformers computes them:
- the router z-loss (ST-MoE, Zoph et al. 2022): logsumexp(router logits)^2, averaged over the
  stack's tokens and sparse layers;
- the load-balancing loss (Switch, Fedus et al. 2021, eqs. 4-6): per group of tokens,
  E * sum_e f_e * P_e, where f_e is the fraction of the group's tokens with expert e among their
  top k and P_e the mean router probability of e, both pooled over the stack's sparse layers;
  averaged over groups. 1 when balanced (top-1), E when one expert takes everything.
The run minimises the objective's loss + train.router_z_loss * (their sum over the stacks) +
train.load_balance_loss * (theirs). Both are kept as sums over tokens and divided by the whole
batch's tokens, so microbatches add up to the big batch exactly (a group never spans two rows'
microbatches: it is a row, or tokens of one microbatch).

Logged beside the objective's metrics, over all sparse layers: `router_z_loss` and
`load_balance_loss` (unweighted, summed over the stacks), `expert_dropped` (the fraction of
(token, choice) pairs past their expert's capacity), `expert_load_min` and `expert_load_max`
(the smallest and largest share of a layer's pairs one expert computed; 1/E when balanced) and
`router_confidence` (the mean top probability).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from t5lite.models.config import ModelConfig
from t5lite.models.experts import RouterStats, RouterSums
from t5lite.objectives.base import Loss, nonzero

STACKS = ('encoder', 'decoder')  # each read from its `{stack}_input_tokens`


def stack_sums(layers: list[RouterSums], num_experts: int) -> dict:
  """One stack's sums from its sparse layers' (each with any leading axes: a scanned stack's
  layers): the z-loss and load-balancing loss summed over tokens, and the metrics' counts."""
  loads = jnp.concatenate([layer.load.reshape(-1, num_experts) for layer in layers])  # (L, E)
  num_layers = loads.shape[0]

  def total(field):  # over layers (and a scan's leading axes), keeping (groups, E) if any
    parts = [getattr(layer, field) for layer in layers]
    rank = 2 if field in ('chosen', 'probability') else 0
    return sum(jnp.sum(p.reshape(-1, *p.shape[p.ndim - rank:]), axis=0) for p in parts)

  chosen, probability = total('chosen'), total('probability')  # (groups, E) pooled
  pooled = jnp.sum(probability, axis=-1)  # (groups,): tokens x layers
  # E * sum_e f_e P_e per group, weighted by its tokens (pooled / layers): the mean over groups
  # is this sum over the tokens
  balance = num_experts / num_layers * jnp.sum(
      jnp.sum(chosen * probability, axis=-1) / nonzero(pooled))
  return {'z_loss': total('z_loss') / num_layers, 'load_balance': balance,
          'tokens': total('tokens') / num_layers, 'routed': jnp.sum(loads) + total('dropped'),
          'dropped': total('dropped'), 'confidence': total('confidence'), 'load': loads}


def captured_sums(stats: nnx.State, num_experts: int) -> dict:
  """{stack: stack_sums} of what `nnx.capture` collected of a model's RouterStats."""
  out = {}
  for stack in STACKS:
    if stack in stats:
      layers = jax.tree.leaves(stats[stack], is_leaf=lambda x: isinstance(x, RouterSums))
      out[stack] = stack_sums(layers, num_experts)
  return out


def router_metrics(router: dict) -> dict:
  """The router's metrics from summed `captured_sums` (a step's, or an evaluation's)."""
  stacks = router.values()
  loads = jnp.concatenate([s['load'] for s in stacks])  # (all sparse layers, E)
  shares = loads / nonzero(jnp.sum(loads, axis=-1, keepdims=True))
  return {
      'router_z_loss': sum(s['z_loss'] / nonzero(s['tokens']) for s in stacks),
      'load_balance_loss': sum(s['load_balance'] / nonzero(s['tokens']) for s in stacks),
      'expert_dropped': sum(s['dropped'] for s in stacks) / nonzero(
          sum(s['routed'] for s in stacks)),
      'expert_load_min': jnp.min(shares), 'expert_load_max': jnp.max(shares),
      'router_confidence': sum(s['confidence'] for s in stacks) / nonzero(
          sum(s['tokens'] * s['load'].shape[0] for s in stacks)),
  }


def with_router_losses(loss: Loss, model_cfg: ModelConfig, train_cfg) -> Loss:
  """`loss` plus the router's z-loss and load-balancing loss at train.router_z_loss and
  train.load_balance_loss, their metrics beside its own."""
  z_weight, balance_weight = float(train_cfg.router_z_loss), float(train_cfg.load_balance_loss)

  def sums(model, batch, *args, **kwargs):
    captured = nnx.capture(lambda m: loss.sums(m, batch, *args, **kwargs), RouterStats)
    objective, stats = captured(model)
    return {'objective': objective, 'router': captured_sums(stats, model_cfg.num_experts)}

  def denominators(batch):
    return {'objective': loss.denominators(batch),
            'tokens': {stack: jnp.asarray(batch[f'{stack}_input_tokens'].size, jnp.float32)
                       for stack in STACKS if f'{stack}_input_tokens' in batch}}

  def minimised(sums, denominators):
    tokens = denominators['tokens']
    router = sums['router']
    return (loss.minimised(sums['objective'], denominators['objective'])
            + sum(z_weight * s['z_loss'] / tokens[stack]
                  + balance_weight * s['load_balance'] / tokens[stack]
                  for stack, s in router.items()))

  def metrics(sums):
    return {**loss.metrics(sums['objective']), **router_metrics(sums['router'])}

  return loss._replace(sums=sums, denominators=denominators, minimised=minimised,
                       metrics=metrics)
