"""Where scalars go: TensorBoard events and `metrics.jsonl` in the workdir, and a console line.

Only process 0 writes. Eval scalars arrive already prefixed `eval_`, so one writer serves both.
"""

import contextlib
import json
import os
import socket
import time

import jax
from etils import epath
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer

from t5lite import paths


class MetricWriter:
  """Appends `{"step": .., name: value, ..}` to metrics.jsonl and the same to TensorBoard.

  TensorBoard's events are written with the `tensorboard` package's record format, without
  TensorFlow, which a run fed synthetic batches never loads; each run (a resumed one too) adds
  its own events file, as TensorFlow's writer does.

  A run resumed at `start_step` first drops the rows after it: a killed run wrote them for steps
  that are done again now, so each step keeps one row, the one the checkpoints agree with.
  """

  def __init__(self, workdir: str, start_step: int):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    folder = paths.path(workdir)
    path = folder / 'metrics.jsonl'
    if path.exists():
      drop_rows_after(path, start_step)
    events = folder / 'tensorboard'
    events.mkdir(parents=True, exist_ok=True)
    name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2'
    # Held open for the run (epath's open is a context manager on gs://, where each flush
    # uploads the file again)
    self._files = contextlib.ExitStack()
    self._jsonl = self._files.enter_context(path.open('a'))
    self._events = record_writer.RecordWriter(self._files.enter_context((events / name).open('ab')))
    self._write_event(event_pb2.Event(file_version='brain.Event:2'))

  def write(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    scalars = {name: float(value) for name, value in scalars.items()}
    self._jsonl.write(json.dumps({'step': step, **scalars}) + '\n')
    self._jsonl.flush()
    values = [summary_pb2.Summary.Value(tag=name, simple_value=value)
              for name, value in scalars.items()]
    self._write_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=values)))

  def _write_event(self, event: event_pb2.Event) -> None:
    event.wall_time = time.time()
    self._events.write(event.SerializeToString())
    self._events.flush()

  def close(self) -> None:
    if self.enabled:
      self._files.close()


def drop_rows_after(path: epath.Path, step: int) -> None:
  """Rewrites metrics.jsonl without rows past `step` or a last line a kill cut short; atomically."""
  lines = path.read_text().splitlines(keepends=True)
  kept = [line for line in lines if line.endswith('\n') and json.loads(line)['step'] <= step]
  if len(kept) < len(lines):
    paths.write_text(path, ''.join(kept))


def console_line(step: int, total_steps: int, scalars: dict, seconds_per_step: float) -> str:
  """`step 500/2000 | loss 4.123 | acc 0.312 | lr 1.0e-02 | 41.2k tok/s | MFU 12.3% | ETA 3m05s`."""
  parts = [f'step {step}/{total_steps}']
  if 'loss' in scalars:
    parts += [f'loss {scalars["loss"]:.4f}', f'acc {scalars["accuracy"]:.3f}',
              f'lr {scalars["learning_rate"]:.1e}', f'{scalars["tokens_per_s"] / 1e3:.1f}k tok/s',
              f'MFU {100 * scalars["mfu"]:.1f}%',
              f'ETA {format_duration((total_steps - step) * seconds_per_step)}']
  parts += [f'{name} {value:.4f}' for name, value in scalars.items() if name.startswith('eval_')]
  return ' | '.join(parts)


def format_duration(seconds: float) -> str:
  minutes, seconds = divmod(max(int(seconds), 0), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{seconds:02d}s'
