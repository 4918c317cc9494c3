"""`t5lite export` and `t5lite import-hf`: a workdir's checkpoint as a Hugging Face folder, and a
Hugging Face folder as step 0 of a new workdir."""

import dataclasses

import jax
import ml_collections

from t5lite import config as config_lib
from t5lite import outputs
from t5lite import paths
from t5lite.export import hf
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import loop
from t5lite.train import run as run_lib
from t5lite.train import state as state_lib


def export_workdir(config: ml_collections.ConfigDict, workdir: str, out_dir: str,
                   step: int | None = None, overwrite: bool = False) -> int:
  """Writes checkpoint `step` (default: the latest) as a Hugging Face folder `out_dir`; which
  `out_dir` may be written, checked before the restore: t5lite/outputs.py."""
  model_cfg = config_lib.model_config(config)
  hf.hf_config(model_cfg)  # a model export cannot write fails here, before the restore
  outputs.check_folder(out_dir, (hf.CONFIG_FILE, hf.WEIGHTS_FILE), workdir=workdir,
                       overwrite=overwrite)
  step, params = run_lib.make_run(config).restore_params(workdir, step)
  with outputs.writing(out_dir, folder=True) as temp:
    hf.export_hf(jax.device_get(params), model_cfg, temp)
  return step


def import_hf_workdir(hf_dir: str, workdir: str, overrides: list[str]) -> ml_collections.ConfigDict:
  """Writes step 0 of a run whose parameters are the Hugging Face model's; `train` continues it.
  The workdir must be new or empty: an import never mixes with a run that is there."""
  folder = paths.path(workdir)
  if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
    raise ValueError(f'--workdir {workdir} is not empty; import into a new workdir')
  model_cfg, params = hf.import_hf(hf_dir)
  config = config_lib.base_config()
  config.model.update(dataclasses.asdict(model_cfg))
  config_lib.override(config, overrides)
  run = run_lib.make_run(config)
  with run.sharding():
    state = state_lib.from_params(run.spec, run.optimizer, params, config.train.seed)
  loop.record_config(workdir, config)
  checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint)
  checkpointer.save(0, state, {}, config.to_dict())
  checkpointer.wait()
  checkpointer.close()
  return config
