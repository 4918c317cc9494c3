"""How a run learns it must stop: SIGTERM (SLURM's time limit, `kill`), Ctrl-C or a Cloud TPU
maintenance notice. The loop asks once per step and, on yes, saves that step and exits.

The processes of one run must all stop after the same step: the save, the log line and the next
step are collectives, so one process that stops alone leaves the others waiting for it forever.
`jax.distributed.initialize` starts JAX's preemption service (unless
`jax_enable_preemption_service` is off): its C++ handler catches SIGTERM and tells the
coordination service, and every process learns the same step to stop at, the fastest one's next.
A Python SIGTERM handler would replace JAX's, so with several processes there is none.
"""

import os
import signal

import jax
from jax.experimental import multihost_utils

# `t5lite train`'s exit status when it saved and stopped before train.steps (a preemption, SIGTERM,
# Ctrl-C): the run is not finished and resumes from its workdir. 75 is EX_TEMPFAIL, "try again".
EXIT_STOPPED_EARLY = 75


class Preempted:
  """`preempted(step)` after each step: whether to save it and stop.

  In one process, SIGTERM and Ctrl-C set a flag. With jax.distributed, SIGTERM goes to JAX's sync
  point, and so does Ctrl-C, sent on as SIGTERM: it reaches every process, each at its own step,
  and one that stopped there alone would hang the others. After a Ctrl-C the next one ends the
  process at once, by the default action (no traceback; an unfinished save is never seen).
  """

  def __init__(self, start: int):
    self.requested = False
    self._distributed = jax.distributed.is_initialized()
    if self._distributed:
      # JAX's count starts at 0: a notice before a resumed run's first step would name step 1.
      try:
        multihost_utils.reached_preemption_sync_point(start)
      except RuntimeError:
        raise ValueError("JAX's preemption service is off (jax_enable_preemption_service, "
                         'JAX_ENABLE_PREEMPTION_SERVICE); a run of several processes needs it to '
                         'stop them all at one step') from None
    handlers = {signal.SIGINT: self._interrupt}
    if not self._distributed:
      handlers[signal.SIGTERM] = self._handle
    self._previous = {signum: signal.signal(signum, handler)
                      for signum, handler in handlers.items()}

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def _interrupt(self, signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next Ctrl-C is not caught
    if self._distributed:
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self._handle(signum, frame)

  def __call__(self, step: int) -> bool:
    if self._distributed:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def restore(self):
    for signum, handler in self._previous.items():
      if signal.getsignal(signum) != signal.SIG_DFL:  # after a Ctrl-C, still on the way out
        signal.signal(signum, handler)
