"""Checkpoints with orbax: train state, data position and config, saved asynchronously.

Orbax writes each step into a temporary directory and renames it only once every process has
finished, so a crash mid-save leaves no checkpoint that restores wrongly: `latest_step` only sees
complete ones. Restoring takes an abstract state whose leaves carry target shardings, which is
how a run saved on one mesh resumes on another.
"""

import os

import orbax.checkpoint as ocp

ITEMS = ('state', 'data', 'config')


class Checkpointer:
  """The workdir's `checkpoints/` folder: keep the last `keep`, and every `keep_period`-th."""

  def __init__(self, workdir: str, checkpoint_cfg, *, read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else checkpoint_cfg.keep,
        save_interval_steps=0 if read_only else 1,
        keep_period=checkpoint_cfg.keep_period or None,
        enable_async_checkpointing=checkpoint_cfg.async_save and not read_only,
        create=not read_only,
        read_only=read_only)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_position: dict, config_dict: dict) -> None:
    """Starts an asynchronous save; training goes on while orbax writes."""
    self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_position),
        config=ocp.args.JsonSave(config_dict)))

  def saved_config(self, step: int) -> dict:
    return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))[
        'config']

  def restore(self, step: int, abstract_state):
    """(state, data position) at `step`, placed by the shardings on `abstract_state`'s leaves."""
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception as error:  # orbax raises many types for damaged files; say which step
      first_line = str(error).strip().splitlines()[0] if str(error).strip() else ''
      raise ValueError(
          f'checkpoint {self.directory}/{step} cannot be restored ({type(error).__name__}: '
          f'{first_line[:200]}); move it away to resume from an earlier one') from error
    return restored['state'], restored['data']

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
