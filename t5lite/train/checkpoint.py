"""Checkpoints with orbax: train state, data position and config, saved asynchronously.

Orbax writes each step into a temporary directory and renames it only once every process has
finished, so a crash mid-save leaves no checkpoint that restores wrongly: `latest_step` only sees
complete ones. Restoring takes an abstract state whose leaves carry target shardings, which is
how a run saved on one mesh resumes on another.
"""

import contextlib
import dataclasses
import os

import jax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx

from t5lite import files
from t5lite import paths
from t5lite.models.config import ModelConfig
from t5lite.models.params import flatten
from t5lite.train import spikes

ITEMS = ('state', 'data', 'config')

# Model settings that change parameter shapes: a checkpoint cannot move across them.
STRUCTURAL = ('arch', 'vocab_size', 'd_model', 'd_ff', 'num_heads', 'd_kv', 'num_encoder_layers',
              'num_decoder_layers', 'activation', 'position', 'relative_buckets',
              'relative_bias_per_layer', 'tie_embeddings', 'embed_norm', 'next_sentence',
              'mlm_transform', 'use_bias', 'norm', 'scan_layers', 'max_length')

# Orbax warns on every read-only open, which `t5lite eval` and `export` always are.
logging.get_absl_logger().addFilter(
    lambda record: not record.getMessage().startswith('Given directory is read only'))


class Checkpointer:
  """The workdir's `checkpoints/` folder: keep the last `keep`, and every `keep_period`-th.

  With `best_fn` (saved metrics -> a score to maximise) it keeps the `keep` best-scoring
  checkpoints instead; orbax stores each one's metrics, so the ranking survives a restart.
  """

  def __init__(self, workdir: str, checkpoint_cfg, *, read_only: bool = False, best_fn=None):
    self.directory = paths.path(workdir) / 'checkpoints'
    check_kinds(self.directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else checkpoint_cfg.keep,
        save_interval_steps=0 if read_only else 1,
        keep_period=None if read_only else checkpoint_cfg.keep_period or None,
        enable_async_checkpointing=checkpoint_cfg.async_save and not read_only,
        best_fn=best_fn,
        best_mode='max',
        create=not read_only,
        cleanup_tmp_directories=not read_only,  # what a kill during a save left behind
        read_only=read_only)
    self.manager = self._reading(lambda: ocp.CheckpointManager(
        self.directory, options=options, item_names=ITEMS))

  def latest_step(self) -> int | None:
    return self._reading(self.manager.latest_step)

  def all_steps(self) -> list[int]:
    return self._reading(self.manager.all_steps)

  def _reading(self, read):
    """`read()`, which has orbax read each checkpoint's metadata: damage there (orbax raises any
    type for it) is one line naming the folder."""
    try:
      return read()
    except Exception as error:  # pylint: disable=broad-except
      raise ValueError(f'{self.directory} holds a damaged checkpoint ({type(error).__name__}: '
                       f'{_sentence(error)}); move it out of {self.directory}') from None

  def save(self, step: int, state, data_position: dict, config_dict: dict,
           metrics: dict | None = None) -> None:
    """Starts an asynchronous save; training goes on while orbax writes. (The previous save's
    failure, if it failed, surfaces here.)"""
    with self._saving():
      self.manager.save(step, force=True, metrics=metrics, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_position),
          config=ocp.args.JsonSave(config_dict)))

  @contextlib.contextmanager
  def _saving(self):
    """A save that fails for want of space or permission is one line naming the folder and the
    checkpoint a resume would start from; the incomplete one is never used (see the module)."""
    try:
      yield
    except Exception as error:  # pylint: disable=broad-except  # orbax and tensorstore: any type
      text = str(error)
      why = ('no space left on the device' if 'No space left' in text or 'ENOSPC' in text else
             'permission denied' if 'Permission denied' in text else None)
      if why is None:
        raise
      latest = self.manager.latest_step()
      raise OSError(f'{why} while saving a checkpoint in {self.directory}; ' + (
          'none is complete' if latest is None else f'the latest complete one is step {latest}')
      ) from None

  def saved_config(self, step: int) -> dict:
    return self._restore(step, config=ocp.args.JsonRestore())['config']

  def check_model(self, step: int, config) -> None:
    """Refuses to restore a checkpoint of another architecture instead of failing inside orbax."""
    saved = self.saved_config(step)
    if not isinstance(saved, dict) or not isinstance(saved.get('model'), dict):
      raise ValueError(f'checkpoint {self.directory}/{step} holds no model in its saved config; '
                       f'if it is damaged, move it out of {self.directory} to use the one before it')
    diffs = structural_diffs(saved['model'], config.model.to_dict())
    if diffs:
      raise ValueError(f'{self.directory} holds a checkpoint of another model '
                       f'({", ".join(diffs)}); use a new --workdir')

  def restore(self, step: int, abstract_state):
    """(state, data position) at `step`, placed by the shardings on `abstract_state`'s leaves.

    A saved state of other shapes (an optimizer state saved by an older t5lite, before Adafactor
    factored attention kernels as T5 does, or by another optimizer) is refused in one line first:
    orbax would fail inside its readers.
    """
    saved = self._saved_metadata(step)
    # saved before the train state kept spike statistics (2026-11-28), or some of today's
    # (2026-12-04): what was saved is restored, the rest made by spikes.completed
    saved_spikes = None if saved is None else set(saved.get('spikes', {}))
    older = saved_spikes is not None and saved_spikes != set(spikes.SpikeStats.__dataclass_fields__)
    full_state = abstract_state
    if older:
      abstract_state = {name: getattr(full_state, name)
                        for name in ('step', 'params', 'opt_state', 'rng')}
      if saved_spikes:
        abstract_state['spikes'] = {name: getattr(full_state.spikes, name)
                                    for name in sorted(saved_spikes)}
    if saved is not None:
      self._check_params(step, saved['params'], full_state.params)
      saved = sorted(tuple(x.shape) for x in jax.tree.leaves(saved))
    ours = sorted(tuple(x.shape) for x in jax.tree.leaves(abstract_state))
    if saved is not None and saved != ours:
      raise ValueError(
          f'checkpoint {self.directory}/{step} holds a train state of another layout than this '
          "run's (e.g. an optimizer state saved by an older t5lite or by another optimizer); "
          'eval, export, infer and finetune --from still read its parameters; to train on, '
          'start a new workdir from them (t5lite export, then import-hf)')
    restored = self._restore(step, state=ocp.args.StandardRestore(abstract_state),
                             data=ocp.args.JsonRestore())
    state = restored['state']
    if older:
      state = type(full_state)(**dict(state, spikes=jax.device_put(
          spikes.completed(state.get('spikes', {})),
          jax.tree.map(lambda leaf: leaf.sharding, full_state.spikes))))
    return state, self._checked_position(step, restored['data'])

  def _checked_position(self, step: int, data) -> dict:
    """The data position saved with `step`: {'processes': [each process's pipeline state, a dict
    of counts]}, or {} (an import's step 0); anything else is refused as damaged."""
    processes = data.get('processes', []) if isinstance(data, dict) else None
    if not isinstance(processes, list) or not all(
        isinstance(state, dict) and type(state.get('batch')) is int
        and all(type(count) is int and count >= 0 for count in state.values())
        for state in processes):
      raise ValueError(f'checkpoint {self.directory}/{step} holds a damaged data position; move '
                       f'it out of {self.directory} to use the one before it')
    return data

  def _saved_metadata(self, step: int):
    """The saved train state's array metadata (shapes), in its tree; None if it cannot be read
    (a damaged checkpoint: restoring it says so)."""
    reader = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            read_only=True, create=False, save_interval_steps=0),
        item_handlers={'state': ocp.StandardCheckpointHandler(),
                       'data': ocp.JsonCheckpointHandler(), 'config': ocp.JsonCheckpointHandler()})
    try:
      return reader.item_metadata(step)['state']
    except Exception:  # pylint: disable=broad-except
      return None
    finally:
      reader.close()

  def _check_params(self, step: int, saved, abstract_params) -> None:
    """Refuses parameters saved in another layout than the model's, which a t5lite that built the
    model otherwise wrote (ELECTRA's generator before 2026-11-24), instead of failing in orbax."""
    def shapes(tree):
      return {'/'.join(str(key) for key in path if key != 'value'): tuple(leaf.shape)
              for path, leaf in flatten(tree)}

    saved, ours = shapes(saved), shapes(nnx.to_pure_dict(abstract_params))
    if saved != ours:
      path = sorted(saved.keys() ^ ours.keys() or
                    {path for path in ours if saved[path] != ours[path]})[0]
      raise ValueError(
          f'checkpoint {self.directory}/{step} holds parameters of another layout than '
          f'this model\'s ({path}: saved {saved.get(path, "none")}, the model\'s '
          f'{ours.get(path, "none")}); an older t5lite wrote it: read it with that version')

  def restore_params(self, step: int, abstract_params):
    """The train state's parameters alone (a distillation teacher's): the optimizer state is
    never read."""
    saved = self._saved_metadata(step)
    if saved is not None:
      self._check_params(step, saved['params'], abstract_params)
    item = {'params': abstract_params}
    return self._restore(step, state=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
        partial_restore=True))['state']['params']

  def _restore(self, step: int, **items):
    """Reads `items` of checkpoint `step`. One damaged on disk (files cut short) is named in one
    line and left where it is: moving it away, to resume from the one before, is the user's call."""
    try:
      return self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:  # orbax raises many types for damaged files
      raise ValueError(
          f'checkpoint {self.directory}/{step} cannot be read ({type(error).__name__}: '
          f'{_sentence(error)}); if it is damaged, move it out of {self.directory} to use the one '
          'before it') from error

  def wait(self) -> None:
    with self._saving():
      self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def _sentence(error: Exception) -> str:
  """The first sentence of an error's message, at most 160 characters."""
  return (str(error).strip().splitlines() or [''])[0].split('. ')[0][:160]


def check_kinds(directory) -> None:
  """Refuses a local checkpoints folder holding anything but folders and regular files: orbax
  would open a FIFO put there in a thread of its own and wait for ever."""
  if paths.is_uri(directory) or not os.path.isdir(directory):
    return
  for root, _, names in os.walk(directory):
    for name in names:
      files.check_file(os.path.join(root, name))


def structural_diffs(saved: dict, model: dict) -> list[str]:
  """'d_ff 128 vs 256' for each STRUCTURAL setting where `model` differs from `saved`; a setting
  an older run did not save has today's default."""
  saved = {**dataclasses.asdict(ModelConfig()), **saved}
  return [f'{k} {saved.get(k)} vs {v}' for k, v in model.items()
          if k in STRUCTURAL and saved.get(k) != v]
