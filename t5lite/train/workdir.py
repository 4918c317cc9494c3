"""What a finished or running workdir is used for: evaluate it, export it, or start one from HF.

All three go through `restore_params`, which rebuilds the run's state layout from its config and
reads one checkpoint into it, on whatever devices this process has.
"""

import dataclasses

import jax
import ml_collections
from flax import nnx

from t5lite import config as config_lib
from t5lite.data import pipeline
from t5lite.export import hf
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import loop
from t5lite.train import mesh as mesh_lib
from t5lite.train import state as state_lib
from t5lite.train import step as step_lib


def restore_params(config: ml_collections.ConfigDict, workdir: str, step: int | None = None):
  """(step, spec, params, mesh, rules) of checkpoint `step` (default: the latest) in `workdir`."""
  model_cfg, mesh, rules, optimizer, _ = loop.setup(config)
  checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint, read_only=True)
  step = checkpointer.latest_step() if step is None else step
  if step is None or step not in checkpointer.manager.all_steps():
    raise FileNotFoundError(f'no checkpoint{"" if step is None else f" at step {step}"} in '
                            f'{checkpointer.directory}')
  loop.check_same_model(checkpointer, step, config)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    spec = state_lib.state_spec(model_cfg, optimizer, config.train.seed, mesh, rules)
    state, _ = checkpointer.restore(step, spec.abstract)
  checkpointer.close()
  return step, spec, state.params, mesh, rules


def evaluate_workdir(config, workdir: str, data: str | None = None,
                     num_batches: int | None = None) -> dict:
  """Held-out loss/accuracy of the latest checkpoint on the validation split or a given file."""
  step, spec, params, mesh, rules = restore_params(config, workdir)
  split = 'validation'
  if data:
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.source, split = data, 'all'
  model_cfg = config_lib.model_config(config)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    batch_sharding = mesh_lib.batch_sharding(mesh)
    eval_step = step_lib.jit_eval_step(spec, mesh, model_cfg, config.train)
    metrics = loop.evaluate(eval_step, params, pipeline.make_pipeline(config.data, split),
                            num_batches or config.train.eval_batches, batch_sharding)
  return {'step': step, **metrics}


def export_workdir(config, workdir: str, out_dir: str, step: int | None = None) -> int:
  step, _, params, _, _ = restore_params(config, workdir, step)
  hf.export_hf(jax.device_get(params), config_lib.model_config(config), out_dir)
  return step


def import_hf_workdir(hf_dir: str, workdir: str, overrides: list[str]) -> ml_collections.ConfigDict:
  """Writes step 0 of a run whose parameters are the Hugging Face model's; `train` continues it."""
  model_cfg, params = hf.import_hf(hf_dir)
  config = config_lib.base_config()
  config.model.update(dataclasses.asdict(model_cfg))
  config_lib.override(config, overrides)
  _, mesh, rules, optimizer, _ = loop.setup(config)
  loop.prepare_workdir(workdir, config)
  checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint)
  if checkpointer.latest_step() is not None:
    raise ValueError(f'{workdir} already holds checkpoints; import into an empty workdir')
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    spec = state_lib.state_spec(config_lib.model_config(config), optimizer, config.train.seed,
                                mesh, rules)
    params = jax.device_put(params, spec.shardings.params)
    opt_state = jax.jit(optimizer.init, out_shardings=spec.shardings.opt_state)(params)
    state = state_lib.TrainState(step=jax.numpy.zeros((), 'int32'), params=params,
                                 opt_state=opt_state, rng=jax.random.PRNGKey(config.train.seed))
  checkpointer.save(0, state, {}, config.to_dict())
  checkpointer.wait()
  checkpointer.close()
  return config
