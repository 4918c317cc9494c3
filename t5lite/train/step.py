"""The train and eval steps: pure functions of (state, batch, frozen), jitted once with explicit
shardings.

One step serves every objective (objectives.py): the objective maps the model and a batch of
seqio-named features to summed losses, and says what each sum is divided by. Gradient
accumulation splits the batch into microbatches inside the step, adds their sums and divides
once by the denominators of the whole batch, so that it equals one big batch. `frozen` holds
what the objective reads and never trains (a distillation teacher's parameters); None for most.
The token cross entropy every model family trains with (`loss_sums`, `summarize`) lives here.
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
    'electra': ('encoder_target_tokens', 'encoder_loss_weights'),  # the generator's MLM targets
}


def target_features(model_cfg: ModelConfig) -> tuple[str, str]:
  return TARGETS[model_cfg.arch]


def loss_sums(model, batch, model_cfg: ModelConfig, train_cfg, *, dropout_key=None,
              sequences: bool = False):
  """Summed loss, z-loss, weight and correct predictions of one (micro)batch; dropout iff a key;
  with `sequences`, also the counts of target sequences and exact ones.

  With `train.loss_chunks` the logits are projected and reduced chunk by chunk
  (`losses.chunked_token_losses`), except for counting exact sequences, which reads every
  position's argmax: that is evaluation, without gradients, on short fine-tuning targets.
  """
  rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
  targets, weights = (batch[name] for name in target_features(model_cfg))
  options = dict(z_loss=train_cfg.z_loss, label_smoothing=train_cfg.label_smoothing)
  if train_cfg.loss_chunks and not sequences:
    x = model.hidden_states(batch, deterministic=rngs is None, rngs=rngs)  # (batch, length, d)
    return losses.chunked_token_losses(x, model.lm_logits, targets, weights,
                                       train_cfg.loss_chunks, **options)
  logits = model(batch, deterministic=rngs is None, rngs=rngs)  # (batch, length, vocab) float32
  sums = losses.token_losses(logits, targets, weights, **options)
  if sequences:
    side = target_features(model_cfg)[0].split('_')[0]  # decoder_target_tokens -> decoder
    segment_ids = batch.get(f'{side}_segment_ids', (weights > 0).astype(jnp.int32))
    sums.update(losses.sequence_sums(logits, targets, weights, segment_ids))
  return sums


def split_microbatches(batch, num_microbatches: int):
  """(B, ...) -> (M, B/M, ...) taking every M-th row, so each device keeps an equal share."""
  def split(x):
    rows = x.shape[0] // num_microbatches
    # (B, ...) -> (B/M, M, ...) -> (M, B/M, ...): row r of microbatch m is original row r*M + m.
    return jnp.swapaxes(x.reshape(rows, num_microbatches, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def make_train_step(graphdef, rest, objective, train_cfg, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule) -> Callable:
  """Returns train_step(state, batch, frozen) -> (state, metrics) minimising `objective`
  (objectives.py); `rest` is the model's non-param state, `frozen` the objective's."""
  num_microbatches = train_cfg.microbatches

  def grads_and_sums(params, batch, frozen, key, denominators):
    def loss_fn(params):
      model = nnx.merge(graphdef, params, rest)
      sums = objective.sums(model, batch, frozen, key, train=True)
      return objective.loss(sums, denominators), sums
    grads, sums = jax.grad(loss_fn, has_aux=True)(params)
    return grads, sums

  def train_step(state: TrainState, batch, frozen):
    denominators = objective.denominators(batch)
    key = jax.random.fold_in(state.rng, state.step)
    if num_microbatches == 1:
      grads, sums = grads_and_sums(state.params, batch, frozen, key, denominators)
    else:
      def accumulate(carry, microbatch_and_index):
        microbatch, index = microbatch_and_index
        grads, sums = grads_and_sums(state.params, microbatch, frozen,
                                     jax.random.fold_in(key, index), denominators)
        return jax.tree.map(jnp.add, carry, (grads, sums)), None
      zeros = jax.eval_shape(grads_and_sums, state.params, jax.tree.map(lambda x: x[0], (
          split_microbatches(batch, num_microbatches))), frozen, key, denominators)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      (grads, sums), _ = jax.lax.scan(
          accumulate, zeros,
          (split_microbatches(batch, num_microbatches), jnp.arange(num_microbatches)))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = objective.metrics(sums)
    metrics['grad_norm'] = optax.global_norm(grads)
    metrics['learning_rate'] = schedule(state.step)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


# Evaluation draws what it samples (ELECTRA's replacements) from one fixed key: a checkpoint's
# eval metrics do not depend on when they are computed.
EVAL_KEY = 0


def make_eval_step(graphdef, rest, objective) -> Callable:
  """Returns eval_step(params, batch, frozen) -> sums; the caller adds sums over batches, then
  turns them into metrics with `objective.metrics`."""
  def eval_step(params, batch, frozen):
    model = nnx.merge(graphdef, params, rest)
    return objective.sums(model, batch, frozen, jax.random.PRNGKey(EVAL_KEY), train=False)
  return eval_step


def jit_train_step(spec, mesh, objective, train_cfg, optimizer, schedule):
  """The train step jitted once: state in its own shardings (donated), batch over the batch axes,
  the objective's frozen arrays where they already are."""
  return jax.jit(
      make_train_step(spec.graphdef, spec.rest, objective, train_cfg, optimizer, schedule),
      in_shardings=(spec.shardings, mesh_lib.batch_sharding(mesh), frozen_shardings(objective)),
      out_shardings=(spec.shardings, NamedSharding(mesh, PartitionSpec())),
      donate_argnums=0)


def jit_eval_step(spec, mesh, objective):
  return jax.jit(make_eval_step(spec.graphdef, spec.rest, objective),
                 in_shardings=(spec.shardings.params, mesh_lib.batch_sharding(mesh),
                               frozen_shardings(objective)))


def frozen_shardings(objective):
  return jax.tree.map(lambda x: x.sharding, objective.frozen)


def summarize(sums) -> dict:
  """Per-token metrics from summed ones (for one step, or added over many eval batches)."""
  weight = jnp.maximum(sums['weight'], 1e-8)
  metrics = {
      'loss': sums['loss'] / weight,
      'z_loss': sums['z_loss'] / weight,
      'accuracy': sums['correct'] / weight,
      'target_tokens': sums['weight'],
  }
  if 'sequences' in sums:
    metrics.update(exact_match=sums['exact'] / jnp.maximum(sums['sequences'], 1e-8),
                   sequences=sums['sequences'])
  return metrics
