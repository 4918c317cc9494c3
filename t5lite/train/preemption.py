"""How a run learns it must stop: SIGTERM (SLURM's time limit, `kill`) or a Cloud TPU maintenance
notice. The loop asks once per step and, on yes, saves that step and exits."""

import signal

import jax
from jax.experimental import multihost_utils


class Preempted:
  """Turns SIGTERM into a flag read at the next step boundary, where the loop saves and exits."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __call__(self, step: int) -> bool:
    # Cloud TPU preemption notices arrive through JAX's sync point, on every process alike.
    return self.requested or jax.distributed.is_initialized() and (
        multihost_utils.reached_preemption_sync_point(step))

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)
