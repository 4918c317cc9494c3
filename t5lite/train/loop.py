"""The training loop: build the mesh and state, resume if the workdir has a checkpoint, step.

`train(config, workdir)` is the whole run, written as a handful of small functions. Nothing in
the loop waits on the device except at log, eval and save points: metrics stay on device until
a log interval ends, the NaN check is a device-side flag read at those points, and the next two
batches are already on the devices while a step runs (`DeviceBatches`).
"""

import collections
import contextlib
import dataclasses
import json
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from t5lite import config as config_lib
from t5lite import objectives
from t5lite import outputs
from t5lite import paths
from t5lite.data import pipeline
from t5lite.data import vocabulary
from t5lite.models.config import ModelConfig
from t5lite.objectives import distillation
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import flops as flops_lib
from t5lite.train import lock as lock_lib
from t5lite.train import mesh as mesh_lib
from t5lite.train import optim
from t5lite.train import preemption
from t5lite.train import state as state_lib
from t5lite.train import step as step_lib
from t5lite.train.metrics import MetricWriter, console_line


def record_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Creates the workdir and records the run's config there (process 0), whole or not at all: a
  kill may come at any moment. One line if the workdir cannot be written."""
  try:
    folder = paths.path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
      paths.write_text(folder / 'config.json', json.dumps(config.to_dict(), indent=2))
  except OSError as error:
    raise ValueError(f'cannot write to workdir {workdir}: {error.strerror or error}') from None


def check_same_model(checkpointer, step: int, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume a checkpoint of another architecture instead of failing inside orbax."""
  diffs = structural_diffs(checkpointer.saved_config(step)['model'], config.model.to_dict())
  if diffs:
    raise ValueError(f'{checkpointer.directory} holds a checkpoint of another model '
                     f'({", ".join(diffs)}); use a new --workdir')


def structural_diffs(saved: dict, model: dict) -> list[str]:
  """'d_ff 128 vs 256' for each STRUCTURAL setting where `model` differs from `saved`; a setting
  an older run did not save has today's default."""
  saved = {**dataclasses.asdict(ModelConfig()), **saved}
  return [f'{k} {saved.get(k)} vs {v}' for k, v in model.items()
          if k in STRUCTURAL and saved.get(k) != v]


# Model settings that change parameter shapes: a checkpoint cannot move across them.
STRUCTURAL = ('arch', 'vocab_size', 'd_model', 'd_ff', 'num_heads', 'd_kv', 'num_encoder_layers',
              'num_decoder_layers', 'activation', 'position', 'relative_buckets',
              'tie_embeddings', 'embed_norm', 'next_sentence', 'use_bias', 'norm', 'scan_layers',
              'max_length')


def global_batch(local_batch: dict, sharding: NamedSharding) -> dict:
  """Per-process numpy arrays -> global jax.Arrays laid out over the mesh's batch axes."""
  return {name: jax.make_array_from_process_local_data(sharding, value)
          for name, value in local_batch.items()}


def evaluate(eval_step, loss, params, batches, num_batches: int, sharding) -> dict:
  """Held-out loss and accuracy over `num_batches` (validation pipelines repeat), summed first."""
  if num_batches < 1:
    raise ValueError(f'evaluation needs at least one batch, got {num_batches}')
  totals = None
  for _ in range(num_batches):
    sums = eval_step(params, global_batch(next(batches), sharding), loss.frozen_params)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return {f'eval_{k}': float(v) for k, v in loss.metrics(jax.device_get(totals)).items()}


def setup(config: ml_collections.ConfigDict):
  """Everything a run needs before its first step, checked before anything compiles."""
  config_lib.validate(config)
  model_cfg = config_lib.model_config(config)
  vocab_size = vocabulary.load_vocabulary(config.data.vocabulary).vocab_size
  if vocab_size > model_cfg.vocab_size:
    raise ValueError(f'config.model.vocab_size={model_cfg.vocab_size} is smaller than the '
                     f'{vocab_size} ids of data.vocabulary={config.data.vocabulary!r}')
  objectives.for_run(config, model_cfg)
  mesh = mesh_lib.make_mesh(config.mesh)
  mesh_lib.check_divisibility(model_cfg, config.data, mesh,
                              microbatches=config.train.microbatches)
  optimizer = optim.make_optimizer(config.optim, config.train.steps,
                                   logical_axes=state_lib.param_axes(model_cfg))
  schedule = optim.make_schedule(config.optim, config.train.steps)
  rules = mesh_lib.DEFAULT_RULES
  return model_cfg, mesh, rules, optimizer, schedule


class Inputs(NamedTuple):
  """Where a run's batches come from: the pretraining pipeline, or a fine-tuning task."""
  train: Callable  # start (a batch number or saved positions) -> batches with a state()
  held_out: Callable  # () -> (an iterator of held-out batches, how many of them to evaluate)
  exact_match: bool = False  # evaluation also counts target sequences predicted exactly


def pretraining_inputs(config: ml_collections.ConfigDict) -> Inputs:
  """The span-corrupted text of `config.data`; eval on `train.eval_batches` held-out batches."""
  return Inputs(
      train=lambda start: pipeline.make_pipeline(config.data, 'train', start=start),
      held_out=lambda: (pipeline.make_pipeline(config.data, 'validation'),
                        config.train.eval_batches))


def train(config: ml_collections.ConfigDict, workdir: str, *, inputs: Inputs | None = None,
          init_params: Callable | None = None, keep_best: Callable | None = None,
          command: str = 't5lite train') -> dict:
  """Trains to `config.train.steps`, resuming from the workdir's latest checkpoint; returns the
  last logged metrics, the step it stopped at and whether that finished the run (False: it saved
  and stopped early, on SIGTERM, Ctrl-C or a preemption notice).

  Everything the run depends on is checked before the workdir is written: the config, the
  teacher, the checkpoint it resumes (read, not opened for writing), the first training batch and
  a held-out one. Only then does the run lock the workdir (`command` names it to a second run)
  and record its config.

  Pretraining by default; fine-tuning composes the same run from `inputs` (a task's batches),
  `init_params()` (the parameters a new run starts from instead of a random init) and
  `keep_best` (see `run_steps`; closed at the end of the run).
  """
  inputs = inputs or pretraining_inputs(config)
  model_cfg, mesh, rules, optimizer, schedule = setup(config)
  check_place(workdir, config)
  teacher = (load_teacher(config, model_cfg, mesh, rules)
             if config.train.teacher_workdir else None)
  reader = checkpoint_lib.Checkpointer(workdir, config.checkpoint, read_only=True)
  latest = reader.latest_step()
  if latest is not None:
    check_same_model(reader, latest, config)
    if latest >= config.train.steps:  # a finished job run again: no mistake, nothing to write
      if jax.process_index() == 0:
        print(f'{workdir} is at step {latest} already, config.train.steps='
              f'{config.train.steps}: nothing to train', flush=True)
      reader.close()
      return {'step': latest, 'finished': True}
  # measures the CPU's matmul rate: before the mesh
  rates = throughput_rates(config, model_cfg, None if teacher is None else teacher.cfg)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    spec = state_lib.state_spec(model_cfg, optimizer, config.train.seed, mesh, rules)
    if latest is None:
      data_start = 0
      state = spec.init() if init_params is None else state_lib.from_params(
          spec, optimizer, init_params(), config.train.seed)
    else:
      state, data_position = reader.restore(latest, spec.abstract)
      data_start = data_position.get('processes') or int(state.step)  # HF imports have none
      logging.info('resumed from %s at step %d', reader.directory, latest)
    reader.close()
    batch_sharding = mesh_lib.batch_sharding(mesh)
    batches = checked_batches(config, inputs, data_start, batch_sharding)
    loss = objectives.make_loss(config, model_cfg, teacher, exact_match=inputs.exact_match)
    train_step = step_lib.jit_train_step(spec, mesh, loss, config.train, optimizer, schedule)
    eval_step = step_lib.jit_eval_step(spec, mesh, loss)

    def evaluator(params):  # new held-out batches each time: the same ones
      return evaluate(eval_step, loss, params, *inputs.held_out(), batch_sharding)

    if jax.process_index() == 0:  # the run's config, once every check has passed
      print(config, flush=True)
    with lock_workdir(workdir, command):
      record_config(workdir, config)
      checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint)
      try:
        return run_steps(config, workdir, state, batches, train_step, evaluator, checkpointer,
                         rates, keep_best, loss.frozen_params)
      finally:
        checkpointer.wait()
        checkpointer.close()
        if keep_best:
          keep_best.close()  # its last save too is written under the lock


def load_teacher(config: ml_collections.ConfigDict, model_cfg: ModelConfig, mesh, rules, *,
                 restore: bool = True) -> distillation.Teacher:
  """The latest parameters of `train.teacher_workdir`, read-only, placed on `mesh` by the run's
  rules; restore=False gives their shapes and shardings alone (`t5lite plan`). Checks first that
  the teacher can teach this student, with one line if not."""
  checkpointer = checkpoint_lib.Checkpointer(config.train.teacher_workdir, config.checkpoint,
                                             read_only=True)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise FileNotFoundError(f'train.teacher_workdir: no checkpoint in {checkpointer.directory}')
    saved = ml_collections.ConfigDict(checkpointer.saved_config(step))
    teacher_cfg = config_lib.model_config(saved)
    distillation.check_teacher(teacher_cfg, saved.data.vocabulary, model_cfg, config)
    spec = state_lib.state_spec(teacher_cfg, optax.identity(), 0, mesh, rules)
    params = (checkpointer.restore_params(step, spec.abstract.params) if restore
              else spec.abstract.params)
  finally:
    checkpointer.close()
  return distillation.Teacher(teacher_cfg, spec.graphdef, spec.rest, params)


def check_place(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Refuses a workdir inside another one (e.g. its checkpoints/) or one that is its own
  distillation teacher."""
  enclosing = [f for f in paths.ancestors(paths.path(workdir))[1:] if outputs.is_workdir(f)]
  if enclosing:
    raise ValueError(f'--workdir {workdir} is inside the workdir {enclosing[0]}; give a '
                     'folder of its own')
  if config.train.teacher_workdir and paths.within(config.train.teacher_workdir, workdir):
    raise ValueError(f'config.train.teacher_workdir is the run\'s own --workdir {workdir}')


def checked_batches(config, inputs: Inputs, start, sharding: NamedSharding) -> 'DeviceBatches':
  """The training batches from `start`, their first one already made, and with evaluation on, a
  held-out batch made too: data that cannot be read fails here, before the workdir is written."""
  batches = DeviceBatches(inputs.train(start), sharding)
  batches.peek()
  if config.train.eval_every:
    next(inputs.held_out()[0])
  return batches


@contextlib.contextmanager
def lock_workdir(workdir: str, command: str):
  """Holds the workdir's lock, taken by process 0; every process fails alike when it is refused."""
  lock = lock_lib.WorkdirLock(workdir, command, enabled=jax.process_index() == 0)
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


def run_steps(config, workdir, state, batches, train_step, evaluator, checkpointer, rates,
              keep_best=None, frozen_params=None) -> dict:
  """The step loop proper: step, log, evaluate, save; stop at the end, on SIGTERM or on NaN.

  `batches` are the training pipeline's `DeviceBatches` (their `state()` is saved),
  `evaluator(params)` returns the eval_ metrics, and `keep_best(step, state, metrics)`, if given,
  sees the state and metrics after each evaluation (fine-tuning keeps its best checkpoint there).
  `frozen_params` go to every step (see step.py).
  """
  train_cfg = config.train
  start = int(state.step)
  writer = MetricWriter(workdir, start)
  preempted = preemption.Preempted(start)
  tokens_per_step, peak_fraction_per_second = rates
  nonfinite = jnp.zeros((), jnp.bool_)
  pending, last, step = [], {}, start
  try:
    compile_start = time.perf_counter()
    train_step = train_step.lower(state, batches.peek(), frozen_params).compile()
    writer.write(start, {'compile_seconds': time.perf_counter() - compile_start})
    tic = time.perf_counter()
    while step < train_cfg.steps:
      state, metrics = train_step(state, next(batches), frozen_params)
      step += 1
      nonfinite = nonfinite | ~jnp.isfinite(metrics['loss'])
      pending.append(metrics)
      done, stop = step == train_cfg.steps, preempted(step)
      if step % train_cfg.log_every == 0 or done or stop:
        check_finite(nonfinite, step, checkpointer)
        seconds = (time.perf_counter() - tic) / len(pending)
        last = mean_metrics(pending)
        last.update(tokens_per_s=tokens_per_step / seconds, step_seconds=seconds,
                    mfu=peak_fraction_per_second / seconds)
        if train_cfg.eval_every and (step % train_cfg.eval_every == 0 or done):
          last.update(evaluator(state.params))
          if keep_best:
            keep_best(step, state, last)
        writer.write(step, last)
        if jax.process_index() == 0:
          print(console_line(step, train_cfg.steps, last, seconds), flush=True)
        pending, tic = [], time.perf_counter()
      if step % config.checkpoint.every_steps == 0 or done or stop:
        check_finite(nonfinite, step, checkpointer)
        checkpointer.save(step, state, all_data_positions(batches), config.to_dict())
      if stop:
        logging.warning('preempted: saved step %d, exiting', step)
        break
  finally:
    preempted.restore()
    writer.close()
  return dict(last, step=step, finished=step >= train_cfg.steps)


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


POSITION_BYTES = 1024


def check_finite(nonfinite, step: int, checkpointer) -> None:
  if bool(nonfinite):
    latest = checkpointer.latest_step()
    raise FloatingPointError(
        f'loss became NaN or Inf at or before step {step}; nothing was saved after it '
        f'(latest checkpoint: {latest}). Lower optim.learning_rate or check the data')


def mean_metrics(metrics: list[dict]) -> dict:
  host = jax.device_get(metrics)
  return {name: float(np.mean([m[name] for m in host])) for name in host[0]}
