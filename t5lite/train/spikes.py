"""Loss spikes: found on the devices inside the step, acted on by the policy of `train.spikes`.

Each step compares its loss and gradient norm with their exponential moving mean and variance
over about `window` healthy steps, kept in the train state (`SpikeStats`) so that a resumed run
goes on with the same numbers, bitwise. A step is a spike when

  - its loss or gradient norm is not finite;
  - from the run's second step, its loss exceeds `ceiling` times the run's first loss (a model
    that starts near the uniform cross entropy never goes far above it while it learns: a run
    that does is diverging, the way runs most often diverge, in their first steps);
  - once FIRST_DECISION healthy steps (or `window`, if fewer) are in the statistics, its loss or
    gradient norm lies more than `threshold` deviations above its mean. With fewer, a z-score is
    a Student-t of few degrees of freedom, whose tails make healthy steps look like spikes.

A spike never enters the statistics.

  policy    what a spike does
  off       nothing, but a NaN or Inf loss stops the run (t5lite's behaviour before spikes)
  stop      stops the run with one line; nothing is saved after the spike
  skip      the step's update is not applied; `skip_limit` skips within `skip_window` steps
            escalate to rollback
  rollback  reloads the last checkpoint before the spike and skips the batches from its
            position to `rollback_skip_after` past the spike's (batches.SKIPPED_FILE)

The step marks the first spike the host must act on (`action_step`, -1 for none); the host reads
it where it already waits on the devices (log and save points), so no step waits for it.
"""

import json
import math

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections

from t5lite import paths
from t5lite.inputs import batches as batches_lib

POLICIES = ('off', 'stop', 'skip', 'rollback')
# Healthy steps in the statistics before their z-scores decide: a z-score of 10 samples lies
# above 8 with probability 1e-5 (Student's t, 9 degrees of freedom), of 3 samples with 0.008
FIRST_DECISION = 10
_EPSILON = 1e-12  # keeps a z-score finite when every step had the same value


class SpikeStats(flax.struct.PyTreeNode):
  """Running statistics of healthy steps and what the host has to act on; all scalars."""
  seen: jax.Array  # int32: healthy steps in the statistics
  loss_mean: jax.Array
  loss_var: jax.Array
  grad_mean: jax.Array
  grad_var: jax.Array
  loss_start: jax.Array  # the loss of the run's first step, what `ceiling` multiplies
  skipped: jax.Array  # int32: steps whose update was not applied, over the run
  window_start: jax.Array  # int32: the first step of the current skip window
  window_skips: jax.Array  # int32: skips since window_start
  action_step: jax.Array  # int32: the first spike the host must act on; -1 for none
  action_loss: jax.Array  # its loss, gradient norm and their z-scores, for the host's line
  action_grad_norm: jax.Array
  action_loss_z: jax.Array
  action_grad_z: jax.Array


def init_stats() -> SpikeStats:
  """Zeros and no action, each leaf its own array: a train state is donated to the step, and two
  leaves sharing one buffer would hand it over twice."""
  def int_zero():
    return jnp.zeros((), jnp.int32)

  def zero():
    return jnp.zeros((), jnp.float32)
  return SpikeStats(seen=int_zero(), loss_mean=zero(), loss_var=zero(), grad_mean=zero(),
                    grad_var=zero(), loss_start=zero(), skipped=int_zero(), window_start=int_zero(),
                    window_skips=int_zero(), action_step=jnp.full((), -1, jnp.int32),
                    action_loss=zero(), action_grad_norm=zero(), action_loss_z=zero(),
                    action_grad_z=zero())


def completed(saved: dict) -> SpikeStats:
  """The statistics a checkpoint saved by an older t5lite holds (`saved`, by field), the rest
  fresh: all of them for a state saved before spike statistics; for one saved before
  `loss_start`, its moving mean, the one scale of the run's loss it kept."""
  fresh = init_stats()
  if 'loss_start' not in saved and 'loss_mean' in saved:
    saved = dict(saved, loss_start=jnp.array(saved['loss_mean'], copy=True))  # its own buffer
  return fresh.replace(**saved)


def _moments(mean, var, value, weight):
  """The exponentially weighted mean and variance after `value` (West 1979): weight 1/n for the
  first n values (their plain mean and variance), then 1/window."""
  delta = value - mean
  return mean + weight * delta, (1 - weight) * (var + weight * delta * delta)


def observe(stats: SpikeStats, step, loss, grad_norm, spikes_cfg):
  """(the statistics after step `step`, whether it withholds its update, its metrics: spike
  (0/1) and the z-scores). Traced inside the train step; `step` counts from 1. Under `skip` a
  spike's update is withheld (an escalated one's too: the run rolls back from before it)."""
  loss, grad_norm = loss.astype(jnp.float32), grad_norm.astype(jnp.float32)
  loss_z = (loss - stats.loss_mean) * jax.lax.rsqrt(stats.loss_var + _EPSILON)
  grad_z = (grad_norm - stats.grad_mean) * jax.lax.rsqrt(stats.grad_var + _EPSILON)
  warm = stats.seen >= min(spikes_cfg.window, FIRST_DECISION)
  nonfinite = ~(jnp.isfinite(loss) & jnp.isfinite(grad_norm))
  above_ceiling = (spikes_cfg.ceiling > 0) & (stats.seen > 0) & (stats.loss_start > 0) & (
      loss > spikes_cfg.ceiling * stats.loss_start)
  spike = nonfinite | above_ceiling | warm & (
      (loss_z > spikes_cfg.threshold) | (grad_z > spikes_cfg.threshold))
  weight = 1.0 / jnp.minimum(stats.seen + 1, spikes_cfg.window).astype(jnp.float32)
  loss_mean, loss_var = _moments(stats.loss_mean, stats.loss_var, loss, weight)
  grad_mean, grad_var = _moments(stats.grad_mean, stats.grad_var, grad_norm, weight)
  healthy = stats.replace(seen=stats.seen + 1, loss_mean=loss_mean, loss_var=loss_var,
                          grad_mean=grad_mean, grad_var=grad_var,
                          loss_start=jnp.where(stats.seen == 0, loss, stats.loss_start))
  stats = jax.tree.map(lambda old, new: jnp.where(spike, old, new), stats, healthy)
  stats, acted = _decide(stats, step, spike, nonfinite, spikes_cfg)
  first_action = acted & (stats.action_step < 0)
  stats = jax.tree.map(lambda old, new: jnp.where(first_action, new, old),
                       stats, stats.replace(
                           action_step=jnp.asarray(step, jnp.int32), action_loss=loss,
                           action_grad_norm=grad_norm, action_loss_z=jnp.where(warm, loss_z, 0),
                           action_grad_z=jnp.where(warm, grad_z, 0)))
  metrics = {'spike': spike.astype(jnp.float32), 'loss_z': jnp.where(warm, loss_z, 0.0),
             'grad_norm_z': jnp.where(warm, grad_z, 0.0)}
  return stats, spike & (spikes_cfg.policy == 'skip'), metrics


def _decide(stats: SpikeStats, step, spike, nonfinite, spikes_cfg) -> tuple[SpikeStats, jax.Array]:
  """(statistics with the skip counts, whether the host must act on this spike). `skip`
  skips a spike unless it is the (skip_limit + 1)-th within skip_window steps: that one rolls
  back."""
  policy = spikes_cfg.policy
  if policy == 'off':
    return stats, nonfinite
  if policy != 'skip':
    return stats, spike
  new_window = step - stats.window_start >= spikes_cfg.skip_window
  window_start = jnp.where(spike & new_window, step, stats.window_start)
  window_skips = jnp.where(spike & new_window, 0, stats.window_skips)
  escalate = spike & (window_skips >= spikes_cfg.skip_limit)
  skip = spike & ~escalate
  return stats.replace(skipped=stats.skipped + skip, window_start=window_start,
                       window_skips=window_skips + skip), escalate


def check_settings(config: ml_collections.ConfigDict) -> None:
  """Refuses, in one line naming the setting, spike settings that cannot work."""
  spikes = config.train.spikes
  if spikes.policy not in POLICIES:
    raise ValueError(f'config.train.spikes.policy={spikes.policy!r} is not one of '
                     f'{", ".join(POLICIES)}')
  for name, minimum in [('window', 1), ('skip_limit', 0), ('skip_window', 1),
                        ('rollback_skip_after', 0), ('max_rollbacks', 1)]:
    if spikes[name] < minimum:
      raise ValueError(f'config.train.spikes.{name}={spikes[name]} must be at least {minimum}')
  if not spikes.threshold > 0:
    raise ValueError(f'config.train.spikes.threshold={spikes.threshold} must be positive')
  if not (spikes.ceiling == 0 or spikes.ceiling > 1):
    raise ValueError(f'config.train.spikes.ceiling={spikes.ceiling} must be above 1 (or 0: off)')
  if spikes.policy in ('skip', 'rollback') and config.data.task:
    raise ValueError(f'config.train.spikes.policy={spikes.policy!r} can roll back only a '
                     "pretraining run's batches; use 'stop' for fine-tuning")


def record_rollback(workdir: str, rollbacks: list[dict]) -> None:
  """Writes the rollbacks, whole or not at all (process 0)."""
  if jax.process_index() == 0:
    paths.write_text(paths.path(workdir) / batches_lib.SKIPPED_FILE,
                     json.dumps({'rollbacks': rollbacks}, indent=2) + '\n')


class Responder:
  """The host's side: at a log or save point, reads the step's mark (one scalar) and stops the
  run or rolls it back: to the last checkpoint, or where none was saved yet, to the run's start,
  `initial_state()` (its random init, the same bits again). `open_batches(start, ranges)` makes
  the training batches from a checkpoint's position, skipping `ranges`."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, rollbacks: list[dict],
               checkpointer, abstract_state, open_batches, initial_state):
    self._cfg, self._workdir, self.rollbacks = config.train.spikes, workdir, rollbacks
    self._checkpointer, self._abstract, self._open = checkpointer, abstract_state, open_batches
    self._initial_state = initial_state

  def act(self, state, batch_of_step: dict[int, int]):
    """None when no spike waits; (state, batches, step, record) after a rollback. Stops with
    FloatingPointError (one line) under `off` and `stop`, or when it cannot roll back.
    `batch_of_step` maps each step since the last call to the batch number it read."""
    if int(state.spikes.action_step) < 0:
      return None
    spike = spike_record(jax.device_get(state.spikes))
    if self._cfg.policy in ('off', 'stop'):
      raise FloatingPointError(f'{describe(spike)}; nothing was saved after it (latest '
                               f'checkpoint: {self._checkpointer.latest_step()}). Lower '
                               'optim.learning_rate or check the data')
    self._checkpointer.wait()
    latest = self._checkpointer.latest_step()
    if len(self.rollbacks) >= self._cfg.max_rollbacks:
      raise FloatingPointError(
          f'{describe(spike)}; {len(self.rollbacks)} rollbacks already '
          f'(train.spikes.max_rollbacks): stopped, nothing saved after step {latest or 0}. '
          'Lower optim.learning_rate or check the data')
    if latest is None:
      restored, start, latest = self._initial_state(), 0, 0
    else:
      restored, position = self._checkpointer.restore(latest, self._abstract)
      start = position.get('processes') or 0  # an import's step 0 has no position
    first = start[0]['batch'] if start else 0  # global batches: the same on every process
    end = batch_of_step[spike['step']] + 1 + self._cfg.rollback_skip_after
    self.rollbacks.append(dict(spike, checkpoint=latest, batches=[first, end]))
    record_rollback(self._workdir, self.rollbacks)
    batches = self._open(start, batches_lib.skipped_ranges(self.rollbacks))
    return restored, batches, latest, self.rollbacks[-1]


def spike_record(stats: SpikeStats) -> dict:
  """The spike the host acts on, as plain numbers (a rollback's record)."""
  return {'step': int(stats.action_step), 'loss': float(stats.action_loss),
          'grad_norm': float(stats.action_grad_norm), 'loss_z': float(stats.action_loss_z),
          'grad_norm_z': float(stats.action_grad_z), 'loss_start': float(stats.loss_start)}


def describe(spike: dict) -> str:
  """'loss spike at step 37: loss 9.8123 (1.1x the first step's, z +12.3), grad_norm 1.2000 (z
  +0.4)': z, the deviations from the moving mean (0 before they decide)."""
  if not (math.isfinite(spike['loss']) and math.isfinite(spike['grad_norm'])):
    return (f'loss became NaN or Inf at step {spike["step"]} (loss {spike["loss"]}, grad_norm '
            f'{spike["grad_norm"]})')
  start = spike.get('loss_start', 0.0)  # a rollback recorded before 2026-12-04 has none
  ratio = f'{spike["loss"] / start:.1f}x the first step\'s, ' if start > 0 else ''
  return (f'loss spike at step {spike["step"]}: loss {spike["loss"]:.4f} ({ratio}z '
          f'{spike["loss_z"]:+.1f}), grad_norm {spike["grad_norm"]:.4f} (z '
          f'{spike["grad_norm_z"]:+.1f})')
