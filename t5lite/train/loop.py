"""The training loop: build the run, resume if the workdir has a checkpoint, step.

`train(config, workdir)` is the whole run, written as a handful of small functions. Nothing in
the loop waits on the device except at log, eval and save points: metrics stay on device until
a log interval ends, the spike check (t5lite/train/spikes.py) is a device-side mark read at
those points, and the next two batches are already on the devices while a step runs
(`DeviceBatches`).
"""

import collections
import contextlib
import functools
import json
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from t5lite import files
from t5lite import lock as lock_lib
from t5lite import outputs
from t5lite import paths
from t5lite.data import vocabulary
from t5lite.inputs import batches as batches_lib
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import flops as flops_lib
from t5lite.train import metrics as metrics_lib
from t5lite.train import preemption
from t5lite.train import run as run_lib
from t5lite.train import spikes as spikes_lib
from t5lite.train import state as state_lib

# What a run keeps in its workdir, each a folder (True) or a file: a resumed run reads them.
WORKDIR_PARTS = {'config.json': False, 'checkpoints': True, metrics_lib.METRICS_FILE: False,
                 metrics_lib.TENSORBOARD_FOLDER: True, batches_lib.SKIPPED_FILE: False,
                 vocabulary.RECORD_FILE: False}


def record_config(workdir: str, config: ml_collections.ConfigDict,
                  vocab: vocabulary.Vocabulary | None = None) -> None:
  """Creates the workdir and records the run's config there (process 0), and what its vocabulary
  is (`vocab`, default config.data.vocabulary's; vocabulary.RECORD_FILE), each whole or not at
  all: a kill may come at any moment. One line if the workdir cannot be written."""
  vocab = vocab or vocabulary.load_vocabulary(config.data.vocabulary)
  try:
    folder = paths.path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
      paths.write_text(folder / vocabulary.RECORD_FILE,
                       json.dumps(vocab.identity(config.data.vocabulary), indent=1) + '\n')
      paths.write_text(folder / 'config.json', json.dumps(config.to_dict(), indent=2))
  except OSError as error:
    raise ValueError(f'cannot write to workdir {workdir}: {error.strerror or error}') from None


def global_batch(local_batch: dict, sharding: NamedSharding) -> dict:
  """Per-process numpy arrays -> global jax.Arrays laid out over the mesh's batch axes (a
  mixture's `component` of each row too: the losses sum per component by it)."""
  return {name: jax.make_array_from_process_local_data(sharding, value)
          for name, value in local_batch.items()}


def evaluate(eval_step, loss, params, batches, num_batches: int, sharding,
             components: tuple[str, ...] = ()) -> dict:
  """Held-out loss and accuracy over `num_batches` (validation pipelines repeat), summed first;
  a mixture's per component too, named by `components` (`Run.components`)."""
  if num_batches < 1:
    raise ValueError(f'evaluation needs at least one batch, got {num_batches}')
  totals = None
  for _ in range(num_batches):
    sums = eval_step(params, global_batch(next(batches), sharding), loss.frozen_params)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  metrics = named_metrics(loss.metrics(jax.device_get(totals)), components)
  return {f'eval_{k}': float(v) for k, v in metrics.items()}


def named_metrics(metrics: dict, components: tuple[str, ...]) -> dict:
  """Metrics as scalars by name: a mixture's arrays per component ({'components': {'loss': [G],
  ..}}, `base.component_metrics`) become loss/NAME, .. for NAME in `components`. A component
  without target tokens keeps only its target_tokens/NAME (0): it has no loss or accuracy.
  {'loss': 2.5, 'components': {'loss': [2, 3], 'target_tokens': [5, 5]}}, ('books', 'web') ->
  {'loss': 2.5, 'loss/books': 2, 'loss/web': 3, 'target_tokens/books': 5, 'target_tokens/web': 5}
  """
  named = {name: value for name, value in metrics.items() if name != 'components'}
  per_component = metrics.get('components', {})
  for index, component in enumerate(components):
    has_tokens = per_component['target_tokens'][index] > 0
    for name, values in per_component.items():
      if has_tokens or name == 'target_tokens':
        named[f'{name}/{component}'] = values[index]
  return named


class Inputs(NamedTuple):
  """Where a run's batches come from: the pretraining pipeline, or a fine-tuning task."""
  train: Callable  # start (a batch number or saved positions) -> batches with a state()
  held_out: Callable  # () -> (an iterator of held-out batches, how many of them to evaluate)
  exact_match: bool = False  # evaluation also counts target sequences predicted exactly


def pretraining_inputs(config: ml_collections.ConfigDict) -> Inputs:
  """The objective's batches of `config.data` (text, or synthetic); eval on
  `train.eval_batches` held-out batches."""
  return Inputs(
      train=lambda start: batches_lib.make_batches(config.data, 'train', start=start),
      held_out=lambda: (batches_lib.make_batches(config.data, 'validation'),
                        config.train.eval_batches))


def train(config: ml_collections.ConfigDict, workdir: str, *, inputs: Inputs | None = None,
          init_params: Callable | None = None, keep_best: Callable | None = None,
          command: str = 't5lite train') -> dict:
  """Trains to `config.train.steps`, resuming from the workdir's latest checkpoint; returns the
  last logged metrics, the step it stopped at and whether that finished the run (False: it saved
  and stopped early, on SIGTERM, Ctrl-C or a preemption notice).

  Everything the run depends on is read and checked before the workdir is written: the config,
  the workdir's parts, the teacher, the checkpoint it resumes (read, not opened for writing), its
  metrics.jsonl, the first training batch, a held-out one and the compiled step. Only then does
  the run lock the workdir (`command` names it to a second run), record its config and trim its
  metrics to the step it resumes from.

  Pretraining by default; fine-tuning composes the same run from `inputs` (a task's batches),
  `init_params()` (the parameters a new run starts from instead of a random init) and
  `keep_best(step, state, eval_metrics)`, called after each evaluation (fine-tuning keeps its
  best checkpoint there; closed at the end of the run).
  """
  inputs = inputs or pretraining_inputs(config)
  run = run_lib.make_run(config)
  check_workdir(workdir, config)
  teacher = run.load_teacher() if config.train.teacher_workdir else None
  reader = checkpoint_lib.Checkpointer(workdir, config.checkpoint, read_only=True)
  latest = reader.latest_step()
  if latest is not None and trained_already(reader, latest, config, workdir):
    return {'step': latest, 'finished': True}
  history = metrics_lib.read_history(workdir)
  rollbacks = batches_lib.read_skipped(workdir)
  # measures the CPU's matmul rate: outside the mesh
  rates = throughput_rates(config, run.model_cfg, None if teacher is None else teacher.cfg)
  with run.sharding():
    state, data_start = initial_state(run, reader, latest, init_params)
    reader.close()
    open_batches = functools.partial(device_batches, inputs.train, run.batch_sharding)
    batches = checked_batches(config, inputs, open_batches(
        data_start, batches_lib.skipped_ranges(rollbacks)))
    loss = run.loss(teacher, exact_match=inputs.exact_match)
    train_step, speed = compiled_train_step(run, loss, state, batches.peek(), rates)
    evaluator = make_evaluator(run, loss, inputs, keep_best)
    if jax.process_index() == 0:  # the run's config, once every check has passed
      print(config, flush=True)
    with lock_workdir(workdir, command):
      record_config(workdir, config)
      checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint)
      responder = spikes_lib.Responder(config, workdir, rollbacks, checkpointer,
                                       run.spec.abstract, open_batches,
                                       lambda: initial_state(run, reader, None, init_params)[0])
      try:
        return run_steps(config, workdir, state, batches, train_step, evaluator, checkpointer,
                         speed, history, responder)
      finally:
        checkpointer.wait()
        checkpointer.close()
        if keep_best:
          keep_best.close()  # its last save too is written under the lock


def trained_already(reader, latest: int, config: ml_collections.ConfigDict, workdir: str) -> bool:
  """Checks that checkpoint `latest` is of this model; True (the reader closed) if it is at
  config.train.steps already: a finished job run again, no mistake, nothing to write."""
  reader.check_model(latest, config)
  if latest < config.train.steps:
    return False
  if jax.process_index() == 0:
    print(f'{workdir} is at step {latest} already, config.train.steps={config.train.steps}: '
          'nothing to train', flush=True)
  reader.close()
  return True


def make_evaluator(run: run_lib.Run, loss, inputs: Inputs, keep_best: Callable | None):
  """evaluator(step, state) -> the held-out metrics (the same held-out batches each time),
  which `keep_best` sees first."""
  eval_step = run.jit_eval_step(loss)

  def evaluator(step: int, state) -> dict:
    metrics = evaluate(eval_step, loss, state.params, *inputs.held_out(), run.batch_sharding,
                       run.components)
    if keep_best:
      keep_best(step, state, metrics)
    return metrics
  return evaluator


def initial_state(run: run_lib.Run, reader, latest: int | None, init_params):
  """(the train state a run starts from, the data position to start at): the checkpoint
  `latest` of `reader`, else `init_params()` or a random init at step 0."""
  if latest is None:
    state = run.spec.init() if init_params is None else state_lib.from_params(
        run.spec, run.optimizer, init_params(), run.config.train.seed)
    return state, 0
  state, data_position = reader.restore(latest, run.spec.abstract)
  logging.info('resumed from %s at step %d', reader.directory, latest)
  return state, data_position.get('processes') or int(state.step)  # HF imports have none


class Speed(NamedTuple):
  """What the console's speed numbers are made of: a step of s seconds runs
  tokens_per_step / s tokens per second, at an MFU of peak_fraction_per_second / s."""
  compile_seconds: float
  tokens_per_step: int
  peak_fraction_per_second: float


def compiled_train_step(run: run_lib.Run, loss, state, batch, rates) -> tuple[Callable, Speed]:
  """The train step compiled for `state` and `batch` before the workdir is written (a step that
  cannot compile changes nothing), called as train_step(state, batch)."""
  start = time.perf_counter()
  compiled = run.jit_train_step(loss).lower(state, batch, loss.frozen_params).compile()
  speed = Speed(time.perf_counter() - start, *rates)
  return lambda state, batch: compiled(state, batch, loss.frozen_params), speed


def check_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Refuses a workdir inside another one (e.g. its checkpoints/), one that is its own
  distillation teacher, or one whose WORKDIR_PARTS are of the other kind (a file named
  checkpoints)."""
  for name, is_folder in WORKDIR_PARTS.items():
    part = paths.path(workdir) / name
    if is_folder and part.exists() and not part.is_dir():
      raise ValueError(f'{part} is not a folder; a t5lite workdir keeps its {name} there')
    if not is_folder and part.exists():
      files.check_file(part)
  enclosing = [f for f in paths.ancestors(paths.path(workdir))[1:] if outputs.is_workdir(f)]
  if enclosing:
    raise ValueError(f'--workdir {workdir} is inside the workdir {enclosing[0]}; give a '
                     'folder of its own')
  if config.train.teacher_workdir and paths.within(config.train.teacher_workdir, workdir):
    raise ValueError(f'config.train.teacher_workdir is the run\'s own --workdir {workdir}')


def device_batches(train_batches: Callable, sharding: NamedSharding, start,
                   ranges: list[tuple[int, int]]) -> 'DeviceBatches':
  """The training batches from `start` (`Inputs.train`'s), laid out on the devices, past the
  ranges of batch numbers that rollbacks dropped."""
  return DeviceBatches(batches_lib.skipping(train_batches, start, ranges), sharding)


def checked_batches(config, inputs: Inputs, batches: 'DeviceBatches') -> 'DeviceBatches':
  """The training batches, their first one already made, and with evaluation on, a held-out
  batch made too: data that cannot be read fails here, before the workdir is written."""
  batches.peek()
  if config.train.eval_every:
    next(inputs.held_out()[0])
  return batches


@contextlib.contextmanager
def lock_workdir(workdir: str, command: str):
  """Holds the workdir's lock, taken by process 0; every process fails alike when it is refused."""
  lock = lock_lib.Lock(workdir, command, enabled=jax.process_index() == 0)
  refused = None
  try:
    lock.acquire()
  except ValueError as error:
    refused = error
  if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(bool(refused))):
    raise refused or ValueError(f'process 0 could not lock --workdir {workdir}')
  if refused:
    raise refused
  try:
    yield
  finally:
    lock.release()


def throughput_rates(config, model_cfg, teacher_cfg=None) -> tuple[float, float]:
  """(tokens per step, FLOPs per step as a fraction of the devices' peak in one second): a step
  of s seconds then runs at tokens/s and MFU of those divided by s. A distillation teacher adds
  its forward pass."""
  data_cfg = config.data
  flops = flops_lib.train_flops_per_step(model_cfg, data_cfg.inputs_length,
                                         data_cfg.targets_length, batch_size=data_cfg.batch_size)
  if teacher_cfg is not None:
    flops += data_cfg.batch_size * flops_lib.flops_per_example(
        teacher_cfg, data_cfg.inputs_length, data_cfg.targets_length)
  peak = flops_lib.peak_flops_per_device()[0] * jax.device_count()
  return data_cfg.batch_size * (data_cfg.inputs_length + data_cfg.targets_length), flops / peak


def run_steps(config, workdir, state, batches, train_step, evaluator, checkpointer,
              speed: Speed, history: metrics_lib.History,
              responder: spikes_lib.Responder) -> dict:
  """The step loop proper: step, log, evaluate, save; stop at the end, on SIGTERM or on a spike
  (or roll back from it: `responder`, which reads the step's mark where the host waits anyway).

  `batches` are the training pipeline's `DeviceBatches` (their `state()` is saved),
  `train_step(state, batch)` returns the next state and its metrics, and
  `evaluator(step, state)` the eval_ metrics; `history` is metrics.jsonl as read at the start.
  """
  train_cfg = config.train
  components = batches_lib.component_names(config.data)
  start = int(state.step)
  writer = metrics_lib.MetricWriter(workdir, start, history)
  preempted = preemption.Preempted(start)
  pending, last, step, previous_loss, batch_of_step = [], {}, start, None, {}
  try:
    writer.write(start, {'compile_seconds': speed.compile_seconds})
    tic = time.perf_counter()
    while step < train_cfg.steps:
      state, metrics = train_step(state, next(batches))
      step += 1
      batch_of_step[step] = batches.state()['batch'] - 1
      # Wait for the step before, this one queued behind it: the chips stay busy, and the host,
      # never more than a step ahead, sees a SIGTERM within two steps. Running further ahead, it
      # would see it only when it next waited, at the log line: up to log_every steps late.
      jax.block_until_ready(previous_loss)
      previous_loss = metrics['loss']
      pending.append(metrics)
      done, stop = step == train_cfg.steps, preempted(step)
      log = step % train_cfg.log_every == 0 or done or stop
      if log or step % config.checkpoint.every_steps == 0:
        rolled_back = responder.act(state, batch_of_step)
        batch_of_step = {}
        if rolled_back:
          state, batches, step, record = rolled_back
          report_rollback(writer, record)
          pending, tic = [], time.perf_counter()
          continue
      if log:
        seconds = (time.perf_counter() - tic) / len(pending)
        last = mean_metrics(pending, components)
        last.update(tokens_per_s=speed.tokens_per_step / seconds, step_seconds=seconds,
                    mfu=speed.peak_fraction_per_second / seconds, **device_memory(),
                    **skipped_steps(train_cfg, state))
        if train_cfg.eval_every and (step % train_cfg.eval_every == 0 or done):
          last.update(evaluator(step, state))
        writer.write(step, last)
        if jax.process_index() == 0:
          print(metrics_lib.console_line(step, train_cfg.steps, last, seconds), flush=True)
        pending, tic = [], time.perf_counter()
      if step % config.checkpoint.every_steps == 0 or done or stop:
        checkpointer.save(step, state, all_data_positions(batches), config.to_dict())
      if stop:
        logging.warning('preempted: saved step %d, exiting', step)
        break
  finally:
    preempted.restore()
    writer.close()
  return dict(last, step=step, finished=step >= train_cfg.steps)


def skipped_steps(train_cfg, state) -> dict:
  """{'skipped_steps': the run's steps whose update a spike withheld} under policy `skip`."""
  if train_cfg.spikes.policy != 'skip':
    return {}
  return {'skipped_steps': int(state.spikes.skipped)}


def report_rollback(writer: metrics_lib.MetricWriter, record: dict) -> None:
  """One console line and a metrics row (metrics.jsonl, TensorBoard) at the spike's step."""
  first, end = record['batches']
  writer.write(record['step'], {'rollback_to_step': record['checkpoint'],
                                'skipped_batches_first': first, 'skipped_batches_end': end})
  if jax.process_index() == 0:
    print(f'rollback: {spikes_lib.describe(record)}; back to step {record["checkpoint"]}, '
          f'batches {first} to {end - 1} skipped', flush=True)


def device_memory() -> dict:
  """The allocator's peak so far on this process's first device, where the backend keeps one
  (GPUs and TPUs; XLA:CPU does not): what to size the batch and remat policy by."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' not in stats:
    return {}
  return {'peak_memory_gib': stats['peak_bytes_in_use'] / 2**30}


class DeviceBatches:
  """The training pipeline `ahead` batches ahead, already laid out on the devices: the host
  copies batch k+1 and k+2 while step k runs, so a slow moment of the pipeline or the copy does not
  stall the chips. `state()` is the pipeline's position after the last batch handed out (not the
  ones waiting), which is what a checkpoint must save to resume exactly."""

  def __init__(self, batches, sharding: NamedSharding, ahead: int = 2):
    self._batches, self._sharding, self._ahead = batches, sharding, ahead
    self._waiting = collections.deque()  # (global batch, pipeline position after it)
    self._position = batches.state()

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    self._fill()
    batch, self._position = self._waiting.popleft()
    return batch

  def peek(self) -> dict:
    """The batch `next` returns, left in place (to compile the step for, or to check the data)."""
    self._fill()
    return self._waiting[0][0]

  def _fill(self) -> None:
    while len(self._waiting) < self._ahead:
      local = next(self._batches, None)
      if local is None:
        break
      self._waiting.append((global_batch(local, self._sharding), self._batches.state()))
    if not self._waiting:
      raise StopIteration

  def state(self) -> dict:
    return dict(self._position)


def all_data_positions(batches) -> dict:
  """Every process's pipeline position (streamed sources differ per process), gathered as JSON."""
  local = json.dumps(batches.state()).encode().ljust(POSITION_BYTES)
  if len(local) > POSITION_BYTES:
    raise ValueError(f'data pipeline state over {POSITION_BYTES} bytes: {local[:80]!r}...')
  gathered = multihost_utils.process_allgather(np.frombuffer(local, np.uint8), tiled=False)
  rows = np.asarray(gathered).reshape(jax.process_count(), POSITION_BYTES)
  return {'processes': [json.loads(bytes(row).decode().strip()) for row in rows]}


POSITION_BYTES = 8192  # a mixture's position names its components


def mean_metrics(metrics: list[dict], components: tuple[str, ...] = ()) -> dict:
  """The steps' metrics, named (`named_metrics`), each the mean over the steps that have it: a
  component's loss over the steps where it had target tokens."""
  host = [named_metrics(m, components) for m in jax.device_get(metrics)]
  names = dict.fromkeys(name for m in host for name in m)  # in order, each once
  return {name: float(np.mean([m[name] for m in host if name in m])) for name in names}
