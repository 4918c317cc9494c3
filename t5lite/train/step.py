"""The train and eval steps: pure functions of (state, batch, frozen_params), jitted once with
explicit shardings by `Run.jit_train_step` and `Run.jit_eval_step`.

One step serves every objective: its `Loss` (t5lite/objectives/base.py) maps the model and a
batch of seqio-named features to summed losses, and says what each sum is divided by. Gradient
accumulation splits the batch into microbatches inside the step, adds their sums and divides
once by the denominators of the whole batch, so that it equals one big batch. `frozen_params`
are what the loss reads and never trains (a distillation teacher's parameters); None for most.
A mixture's steps take its number of components, and give its losses the rows' components
one-hot (`base.with_component_groups`), for metrics per component.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from t5lite.objectives import base
from t5lite.train import spikes
from t5lite.train.state import TrainState


def split_microbatches(batch, num_microbatches: int):
  """(B, ...) -> (M, B/M, ...) taking every M-th row, so each device keeps an equal share."""
  def split(x):
    rows = x.shape[0] // num_microbatches
    # (B, ...) -> (B/M, M, ...) -> (M, B/M, ...): row r of microbatch m is original row r*M + m.
    return jnp.swapaxes(x.reshape(rows, num_microbatches, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def make_train_step(graphdef, non_params, loss, train_cfg, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule, num_components: int = 0) -> Callable:
  """Returns train_step(state, batch, frozen_params) -> (state, metrics) minimising `loss` (an
  objective's `Loss`); `non_params` is the model's state other than parameters;
  `num_components` a mixture's (0 without one)."""
  num_microbatches = train_cfg.microbatches

  def grads_and_sums(params, batch, frozen_params, key, denominators):
    def loss_fn(params):
      model = nnx.merge(graphdef, params, non_params)
      sums = loss.sums(model, batch, frozen_params, key, train=True)
      return loss.minimised(sums, denominators), sums
    grads, sums = jax.grad(loss_fn, has_aux=True)(params)
    return grads, sums

  def train_step(state: TrainState, batch, frozen_params):
    batch = base.with_component_groups(batch, num_components)
    denominators = loss.denominators(batch)
    key = jax.random.fold_in(state.rng, state.step)
    if num_microbatches == 1:
      grads, sums = grads_and_sums(state.params, batch, frozen_params, key, denominators)
    else:
      def accumulate(carry, microbatch_and_index):
        microbatch, index = microbatch_and_index
        grads, sums = grads_and_sums(state.params, microbatch, frozen_params,
                                     jax.random.fold_in(key, index), denominators)
        return jax.tree.map(jnp.add, carry, (grads, sums)), None
      zeros = jax.eval_shape(grads_and_sums, state.params, jax.tree.map(lambda x: x[0], (
          split_microbatches(batch, num_microbatches))), frozen_params, key, denominators)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      (grads, sums), _ = jax.lax.scan(
          accumulate, zeros,
          (split_microbatches(batch, num_microbatches), jnp.arange(num_microbatches)))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = loss.metrics(sums)
    metrics['grad_norm'] = optax.tree.norm(grads)
    metrics['learning_rate'] = schedule(state.step)
    spike_stats, withheld, spike_metrics = spikes.observe(
        state.spikes, state.step + 1, metrics['loss'], metrics['grad_norm'], train_cfg.spikes)
    if train_cfg.spikes.policy != 'off':
      metrics.update(spike_metrics)
    if train_cfg.spikes.policy == 'skip':  # a spike leaves params and optimizer state as they were
      params, opt_state = jax.tree.map(lambda old, new: jnp.where(withheld, old, new),
                                       (state.params, state.opt_state), (params, opt_state))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         spikes=spike_stats), metrics

  return train_step


# Evaluation draws what it samples (ELECTRA's replacements) from one fixed key: a checkpoint's
# eval metrics do not depend on when they are computed.
EVAL_KEY = 0


def make_eval_step(graphdef, non_params, loss, num_components: int = 0) -> Callable:
  """Returns eval_step(params, batch, frozen_params) -> sums; the caller adds sums over batches,
  then turns them into metrics with `loss.metrics`."""
  def eval_step(params, batch, frozen_params):
    batch = base.with_component_groups(batch, num_components)
    model = nnx.merge(graphdef, params, non_params)
    return loss.sums(model, batch, frozen_params, jax.random.PRNGKey(EVAL_KEY), train=False)
  return eval_step
