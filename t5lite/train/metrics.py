"""Where scalars go: TensorBoard events and `metrics.jsonl` in the workdir, and a console line.

Only process 0 writes. Eval scalars arrive already prefixed `eval_`, so one writer serves both.
"""

import contextlib
import json
import os
import socket
import time
from typing import NamedTuple

import jax
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer

from t5lite import files
from t5lite import paths

METRICS_FILE = 'metrics.jsonl'
TENSORBOARD_FOLDER = 'tensorboard'


class History(NamedTuple):
  """A workdir's metrics.jsonl as read: its text, and each row's step and line."""
  text: str
  rows: list[tuple[int, str]]


def read_history(workdir: str) -> History:
  """The workdir's metrics.jsonl, read and checked before a run writes anything: blank lines are
  skipped and a last line a kill cut short is left out; any other line that is not a JSON object
  with an integer "step" is refused, naming the file and the line."""
  path = paths.path(workdir) / METRICS_FILE
  if not path.exists():
    return History('', [])
  text, rows = files.read_text(path), []
  for number, line in enumerate(text.split('\n')[:-1], 1):  # the last: '' or cut short
    if not line.strip():
      continue
    row = files.parse_json(line, f'{path}:{number}')
    if not isinstance(row, dict) or type(row.get('step')) is not int:
      raise ValueError(f'{path}:{number} is not a row of metrics ({{"step": N, ...}}); correct '
                       'or delete that line')
    rows.append((row['step'], line + '\n'))
  return History(text, rows)


class MetricWriter:
  """Appends `{"step": .., name: value, ..}` to metrics.jsonl and the same to TensorBoard.

  TensorBoard's events are written with the `tensorboard` package's record format, without
  TensorFlow, which a run fed synthetic batches never loads; each run (a resumed one too) adds
  its own events file, as TensorFlow's writer does.

  A run resumed at `start_step` first drops the rows of `history` (metrics.jsonl as the run read
  it before writing anything) after it: a killed run wrote them for steps that are done again
  now, so each step keeps one row, the one the checkpoints agree with.
  """

  def __init__(self, workdir: str, start_step: int, history: History):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    folder = paths.path(workdir)
    path = folder / METRICS_FILE
    kept = ''.join(line for step, line in history.rows if step <= start_step)
    if kept != history.text:
      paths.write_text(path, kept)
    events = folder / TENSORBOARD_FOLDER
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


def console_line(step: int, total_steps: int, scalars: dict, seconds_per_step: float) -> str:
  """`step 500/2000 | loss 4.123 | acc 0.312 | lr 1.0e-02 | 41.2k tok/s | MFU 12.3% | ETA 3m05s`."""
  parts = [f'step {step}/{total_steps}']
  if 'loss' in scalars:
    parts += [f'loss {scalars["loss"]:.4f}', f'acc {scalars["accuracy"]:.3f}',
              f'lr {scalars["learning_rate"]:.1e}', f'{scalars["tokens_per_s"] / 1e3:.1f}k tok/s',
              f'MFU {100 * scalars["mfu"]:.1f}%',
              f'ETA {format_duration((total_steps - step) * seconds_per_step)}']
  if scalars.get('skipped_steps'):  # policy skip: updates a spike withheld, over the run
    parts.append(f'skipped {int(scalars["skipped_steps"])}')
  # a mixture's eval_loss/NAME, .. stay in metrics.jsonl and TensorBoard: one line stays short
  parts += [f'{name} {value:.4f}' for name, value in scalars.items()
            if name.startswith('eval_') and '/' not in name]
  return ' | '.join(parts)


def format_duration(seconds: float) -> str:
  minutes, seconds = divmod(max(int(seconds), 0), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{seconds:02d}s'
