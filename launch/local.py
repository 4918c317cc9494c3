"""Run `t5lite train` as N processes of one JAX run on this machine, each with fake CPU devices.

  python launch/local.py --num_processes=2 --devices_per_process=4 -- \\
      --config=configs/t5_tiny.py --workdir=runs/two_processes

Process i runs `python -m t5lite train FLAGS --coordinator_address=127.0.0.1:PORT
--num_processes=N --process_id=i` with XLA_FLAGS=--xla_force_host_platform_device_count=D and
JAX_PLATFORMS=cpu: the multi-host code path of a pod (a data shard per process, global arrays,
collectives between processes) on a laptop. Each output line starts with `[i] `; process 0's go to
stdout, the others' to stderr. When one process fails the others are stopped, since they would
wait for it forever. SIGTERM or Ctrl-C goes on to every process: they save the same step and exit
75, and so does this launcher; run the same command again to resume.
"""

import argparse
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
# t5lite.train.preemption's, not imported: this launcher runs without JAX.
EXIT_STOPPED_EARLY = 75
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


def process_env(devices: int, env: dict | None = None) -> dict:
  """This environment updated with `env`, with exactly `devices` fake CPU devices and no others."""
  merged = dict(os.environ, **(env or {}))
  kept = re.sub(rf'{DEVICE_COUNT_FLAG}=\S*', '', merged.get('XLA_FLAGS', '')).split()
  merged.update(XLA_FLAGS=' '.join([*kept, f'{DEVICE_COUNT_FLAG}={devices}']),
                JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
  merged.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  return merged


def forward(pipe, prefix: str, stream, lock: threading.Lock):
  """Copy a pipe line by line, prefixed; whole lines only, so processes never mix within one."""
  for line in pipe:
    with lock:
      stream.write(prefix + line)
      stream.flush()


def wait(processes: list, timeout: float | None) -> tuple[int, str | None]:
  """(0, None) once all succeed, (75, None) once all have exited, some after saving early (75);
  else (status, why) as soon as one fails or time runs out."""
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    codes = [process.poll() for process in processes]
    for i, code in enumerate(codes):  # a signal gives a negative code; report it as a shell would
      if code not in (None, 0, EXIT_STOPPED_EARLY):
        return (code if code > 0 else 128 - code), f'process {i} exited with status {code}'
    if None not in codes:
      return max(codes), None
    if deadline is not None and time.monotonic() > deadline:
      return 124, f'timed out after {timeout:g} s'
    time.sleep(0.05)


@contextlib.contextmanager
def forwarding_signals(processes: list):
  """SIGTERM, Ctrl-C (SIGINT) or SIGHUP to this launcher goes on to every process still running.

  The processes have their own process group, so a terminal's Ctrl-C reaches them only this way,
  and once: t5lite train saves and exits 75 on the first and stops at once on the second.
  """
  def send(signum, frame):
    del frame
    for process in processes:
      if process.poll() is None:
        process.send_signal(signum)

  previous = {signum: signal.signal(signum, send) for signum in FORWARDED}
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def stop(processes: list):
  """SIGTERM, then SIGKILL for those that do not exit within 5 s (stuck in a collective)."""
  for process in processes:
    if process.poll() is None:
      process.terminate()
  for process in processes:
    try:
      process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def launch_local(args: list[str], num_processes: int, devices_per_process: int,
                 env: dict | None = None, timeout: float | None = None,
                 command: list[str] | None = None) -> int:
  """Run `command ARGS` (default `python -m t5lite train`) as num_processes JAX processes.

  Returns 0 when all succeed, 75 when they saved and stopped early (see forwarding_signals),
  else the first failure's status (124 on timeout) after stopping the rest and printing one line
  about it to stderr. Call it from the main thread: it handles signals while it runs.
  """
  if num_processes < 1 or devices_per_process < 1:
    raise ValueError(f'need at least one process and one device each, got {num_processes} '
                     f'processes of {devices_per_process} devices')
  command = command or [sys.executable, '-m', 't5lite', 'train']
  coordinator = f'--coordinator_address=127.0.0.1:{free_port()}'
  lock, processes, threads, running = threading.Lock(), [], [], 0
  with forwarding_signals(processes):
    try:
      for i in range(num_processes):
        flags = [coordinator, f'--num_processes={num_processes}', f'--process_id={i}']
        process = subprocess.Popen(
            [*command, *args, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, errors='replace',
            env=process_env(devices_per_process, env), process_group=0)
        processes.append(process)
        for pipe in (process.stdout, process.stderr):  # apart: C++ logs would split Python lines
          threads.append(threading.Thread(target=forward, daemon=True, args=(
              pipe, f'[{i}] ', sys.stdout if i == 0 else sys.stderr, lock)))
          threads[-1].start()
      status, why = wait(processes, timeout)
      running = sum(process.poll() is None for process in processes)
    finally:
      stop(processes)
      for thread in threads:
        thread.join()
  if why:
    print(f'launch/local.py: {why}; stopped the {running} still running', file=sys.stderr)
  elif status == EXIT_STOPPED_EARLY:
    print('launch/local.py: the processes saved and stopped early (status 75); the same command '
          'resumes the run', file=sys.stderr)
  return status


def positive(text: str) -> int:
  if not text.isdigit() or int(text) < 1:
    raise argparse.ArgumentTypeError(f'{text!r} is not a positive integer')
  return int(text)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='launch/local.py', description=__doc__.split('\n')[0])
  parser.add_argument('--num_processes', type=positive, default=2)
  parser.add_argument('--devices_per_process', type=positive, default=4)
  parser.add_argument('--timeout', type=float, help='seconds; stop all processes after that')
  parser.add_argument('--command', help='run this instead of `python -m t5lite train`, e.g. a '
                      'stand-in script; it gets the same flags')
  parser.add_argument('train_flags', nargs='*', metavar='-- T5LITE_TRAIN_FLAGS')
  args = parser.parse_args(argv)
  return launch_local(args.train_flags, args.num_processes, args.devices_per_process,
                      timeout=args.timeout, command=shlex.split(args.command or '') or None)


if __name__ == '__main__':
  sys.exit(main())
