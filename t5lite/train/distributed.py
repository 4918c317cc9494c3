"""Joining a multi-process run: explicit coordinator flags, or what SLURM / a TPU pod provides.

Called before anything touches a device. A single process with no cluster around it does
nothing, so the same command runs on a laptop and on a pod.
"""

import os
import socket
import time

import jax

# Environment variables that say this process is one of several JAX can find on its own.
CLUSTER_HINTS = ('SLURM_JOB_ID', 'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS')


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_seconds: int = 300,
               multihost: bool = False) -> None:
  """Joins the run when told to (flags, `--multihost`) or when SLURM says there are several tasks.

  `--multihost` lets JAX find the cluster itself (Cloud TPU VM metadata, SLURM, GKE); launchers
  pass it, since a TPU VM's environment variables do not reveal that it is part of a pod.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ValueError('--coordinator_address, --num_processes and --process_id go together')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'--process_id={process_id} must be in [0, --num_processes={num_processes})')
    if process_id != 0:
      wait_for_coordinator(coordinator_address, timeout_seconds)
  elif not multihost and (not any(h in os.environ for h in CLUSTER_HINTS) or _single_slurm_task()):
    return
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=timeout_seconds)
  except Exception as error:  # the coordination service raises bare RuntimeErrors/XlaErrors
    first_line = str(error).strip().splitlines()[0][:200] if str(error).strip() else ''
    raise ValueError(f'could not join the run at {coordinator_address or "the cluster"} within '
                     f'{timeout_seconds}s ({type(error).__name__}: {first_line}); check that '
                     'every process started with the same --coordinator_address and '
                     '--num_processes') from error


def wait_for_coordinator(address: str, timeout_seconds: float) -> None:
  """Polls process 0's port: JAX's client aborts the whole process (SIGABRT) when it times out,
  so an unreachable coordinator must be caught here, in Python, to give one clear line."""
  host, _, port = address.rpartition(':')
  if not host or not port.isdigit():
    raise ValueError(f'--coordinator_address={address!r} is not HOST:PORT')
  deadline = time.monotonic() + timeout_seconds
  while True:
    try:
      socket.create_connection((host, int(port)), timeout=1).close()
      return
    except OSError as error:
      if time.monotonic() >= deadline:
        raise ValueError(f'could not join the run at {address} within {timeout_seconds}s '
                         f'({error.strerror or error}); start process 0 first, or check '
                         '--coordinator_address') from None
      time.sleep(0.5)


def _single_slurm_task() -> bool:
  return 'SLURM_JOB_ID' in os.environ and os.environ.get('SLURM_NTASKS', '1') == '1' and (
      'TPU_WORKER_HOSTNAMES' not in os.environ)
