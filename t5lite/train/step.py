"""The train and eval steps: pure functions of (state, batch), jitted once with explicit shardings.

One step serves every objective: the model maps a batch of seqio-named features to logits, and
the loss reads the targets and weights that the model family predicts (`target_features`).
Gradient accumulation splits the batch into microbatches inside the step, sums the loss over
them and divides once by the denominator of the whole batch, so that it equals one big batch.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jax.sharding import NamedSharding, PartitionSpec

from t5lite.models.config import ModelConfig
from t5lite.train import losses
from t5lite.train import mesh as mesh_lib
from t5lite.train.state import TrainState

# Which features hold what the model predicts, by architecture (seqio's feature converters).
TARGETS = {
    'encoder_decoder': ('decoder_target_tokens', 'decoder_loss_weights'),
    'decoder': ('decoder_target_tokens', 'decoder_loss_weights'),
    'encoder': ('encoder_target_tokens', 'encoder_loss_weights'),
}


def target_features(model_cfg: ModelConfig) -> tuple[str, str]:
  return TARGETS[model_cfg.arch]


def loss_sums(model, batch, model_cfg: ModelConfig, train_cfg, *, dropout_key=None):
  """Summed loss, z-loss, weight and correct predictions of one (micro)batch; dropout iff a key."""
  rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
  logits = model(batch, deterministic=rngs is None, rngs=rngs)  # (batch, length, vocab) float32
  targets, weights = (batch[name] for name in target_features(model_cfg))
  return losses.token_losses(logits, targets, weights, z_loss=train_cfg.z_loss,
                             label_smoothing=train_cfg.label_smoothing)


def split_microbatches(batch, num_microbatches: int):
  """(B, ...) -> (M, B/M, ...) taking every M-th row, so each device keeps an equal share."""
  def split(x):
    rows = x.shape[0] // num_microbatches
    # (B, ...) -> (B/M, M, ...) -> (M, B/M, ...): row r of microbatch m is original row r*M + m.
    return jnp.swapaxes(x.reshape(rows, num_microbatches, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def make_train_step(graphdef, rest, model_cfg: ModelConfig, train_cfg,
                    optimizer: optax.GradientTransformation, schedule: optax.Schedule
                    ) -> Callable:
  """Returns train_step(state, batch) -> (state, metrics); `rest` is the model's non-param state."""
  deterministic = model_cfg.dropout == 0.0
  num_microbatches = train_cfg.microbatches

  def grads_and_sums(params, batch, key, denominator):
    def loss_fn(params):
      model = nnx.merge(graphdef, params, rest)
      sums = loss_sums(model, batch, model_cfg, train_cfg,
                       dropout_key=None if deterministic else key)
      return sums['loss'] / denominator, sums
    grads, sums = jax.grad(loss_fn, has_aux=True)(params)
    return grads, sums

  def train_step(state: TrainState, batch):
    weights = batch[target_features(model_cfg)[1]]
    denominator = losses.loss_denominator(weights, train_cfg.loss_normalizer)
    key = jax.random.fold_in(state.rng, state.step)
    if num_microbatches == 1:
      grads, sums = grads_and_sums(state.params, batch, key, denominator)
    else:
      def accumulate(carry, microbatch_and_index):
        microbatch, index = microbatch_and_index
        grads, sums = grads_and_sums(state.params, microbatch, jax.random.fold_in(key, index),
                                     denominator)
        return jax.tree.map(jnp.add, carry, (grads, sums)), None
      zeros = jax.eval_shape(grads_and_sums, state.params, jax.tree.map(lambda x: x[0], (
          split_microbatches(batch, num_microbatches))), key, denominator)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      (grads, sums), _ = jax.lax.scan(
          accumulate, zeros,
          (split_microbatches(batch, num_microbatches), jnp.arange(num_microbatches)))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = summarize(sums)
    metrics['grad_norm'] = optax.global_norm(grads)
    metrics['learning_rate'] = schedule(state.step)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(graphdef, rest, model_cfg: ModelConfig, train_cfg) -> Callable:
  """Returns eval_step(params, batch) -> sums; the caller adds sums over batches, then divides."""
  def eval_step(params, batch):
    model = nnx.merge(graphdef, params, rest)
    return loss_sums(model, batch, model_cfg, train_cfg)
  return eval_step


def jit_train_step(spec, mesh, model_cfg: ModelConfig, train_cfg, optimizer, schedule):
  """The train step jitted once: state in its own shardings (donated), batch over the batch axes."""
  return jax.jit(
      make_train_step(spec.graphdef, spec.rest, model_cfg, train_cfg, optimizer, schedule),
      in_shardings=(spec.shardings, mesh_lib.batch_sharding(mesh)),
      out_shardings=(spec.shardings, NamedSharding(mesh, PartitionSpec())),
      donate_argnums=0)


def jit_eval_step(spec, mesh, model_cfg: ModelConfig, train_cfg):
  return jax.jit(make_eval_step(spec.graphdef, spec.rest, model_cfg, train_cfg),
                 in_shardings=(spec.shardings.params, mesh_lib.batch_sharding(mesh)))


def summarize(sums) -> dict:
  """Per-token metrics from summed ones (for one step, or added over many eval batches)."""
  weight = jnp.maximum(sums['weight'], 1e-8)
  return {
      'loss': sums['loss'] / weight,
      'z_loss': sums['z_loss'] / weight,
      'accuracy': sums['correct'] / weight,
      'target_tokens': sums['weight'],
  }
