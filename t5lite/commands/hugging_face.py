"""`t5lite export` and `t5lite import-hf`: a workdir's checkpoint as a Hugging Face folder (model
and tokenizer), and a Hugging Face folder as step 0 of a new workdir (model and vocabulary)."""

import dataclasses
import os
import sys

import jax
import ml_collections
from flax import nnx

from t5lite import config as config_lib
from t5lite import outputs
from t5lite import models
from t5lite import paths
from t5lite.data import vocabulary
from t5lite.export import hf
from t5lite.export import tokenizer
from t5lite.models.config import ModelConfig
from t5lite.models.params import flatten
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import loop
from t5lite.train import run as run_lib
from t5lite.train import state as state_lib


def export_workdir(config: ml_collections.ConfigDict, workdir: str, out_dir: str,
                   step: int | None = None, overwrite: bool = False) -> int:
  """Writes checkpoint `step` (default: the latest) as a Hugging Face folder `out_dir`; which
  `out_dir` may be written, checked before the restore: t5lite/outputs.py."""
  model_cfg = config_lib.model_config(config)
  # a model export cannot write fails here, before the restore
  hf_models = hf.hf_models(model_cfg)
  written = [os.path.join(model.folder, name) for model in hf_models
             for name in (hf.CONFIG_FILE, hf.WEIGHTS_FILE,
                          *tokenizer.files_written(config.data.vocabulary, model.text))]
  outputs.check_folder(out_dir, written, workdir=workdir, overwrite=overwrite)
  step, params = run_lib.make_run(config).restore_params(workdir, step)
  with outputs.writing(out_dir, folder=True) as temp:
    hf.export_hf(jax.device_get(params), model_cfg, temp)
    learned = model_cfg.position == 'learned'  # the longest input the model has positions for
    for model in hf_models:
      tokenizer.export_tokenizer(config.data.vocabulary, os.path.join(temp, model.folder),
                                 model.text,
                                 model_max_length=model_cfg.max_length if learned else None)
  return step


def import_hf_workdir(hf_dir: str, workdir: str, overrides: list[str]) -> ml_collections.ConfigDict:
  """Writes step 0 of a run whose parameters are the Hugging Face model's; `train` continues it,
  pretraining as that kind of model does (`HfModel.data`: GPT-2 a causal LM, BERT MLM, ...).
  The folder's vocabulary (spiece.model, or a T5 tokenizer.json) becomes `<workdir>/spiece.model`
  and the run's data.vocabulary, unless an override names another; a ByT5 folder's is 'bytes',
  which needs no file, with ByT5's span corruption (config.BYT5_DATA); a folder without one
  leaves the bundled vocabulary, with a warning. The workdir must be new or empty: an import never mixes
  with a run that is there."""
  folder = paths.path(workdir)
  if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
    raise ValueError(f'--workdir {workdir} is not empty; import into a new workdir')
  model_cfg, params = hf.import_hf(hf_dir)
  proto = tokenizer.import_tokenizer(hf_dir)
  config = config_lib.base_config()
  config.model.update(dataclasses.asdict(model_cfg))
  config.data.update(hf.hf_model(model_cfg).data(model_cfg))
  imported_vocabulary = str(folder / tokenizer.SPIECE_FILE if paths.is_uri(workdir) else
                            os.path.abspath(folder / tokenizer.SPIECE_FILE))
  if proto == vocabulary.BYTES:  # a ByT5 folder: it pretrains as ByT5 did
    config.data.update(config_lib.BYT5_DATA)
  elif proto is not None:
    config.data.vocabulary = imported_vocabulary
  config_lib.override(config, overrides)
  copy_vocabulary = proto is not None and config.data.vocabulary == imported_vocabulary
  vocab = (vocabulary.SentencePieceVocabulary(proto, hf_dir) if copy_vocabulary
           else vocabulary.load_vocabulary(config.data.vocabulary))
  if copy_vocabulary:  # checked from memory: the file is written with the checkpoint
    run_lib.check_vocabulary(vocab, config_lib.model_config(config), f'the vocabulary of {hf_dir}')
  run = run_lib.make_run(config, reads_text=not copy_vocabulary)
  if run.model_cfg.scan_layers:
    params = models.stack_layers(params)
  fresh = _parts_absent(params, model_cfg, run, hf_dir)
  with run.sharding():
    state = state_lib.from_params(run.spec, run.optimizer, params, config.train.seed)
  if proto is None:
    print(f'warning: {hf_dir} has no {tokenizer.SPIECE_FILE} or {tokenizer.TOKENIZER_JSON_FILE}; '
          f'the run reads data.vocabulary={config.data.vocabulary!r}', file=sys.stderr)
  if fresh:
    print(f'warning: {hf_dir} holds no {", ".join(fresh)}; they start as a new run\'s do '
          f'(train.seed={config.train.seed})', file=sys.stderr)
  loop.record_config(workdir, config, vocab)
  if copy_vocabulary:
    (folder / tokenizer.SPIECE_FILE).write_bytes(proto)
  checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint)
  checkpointer.save(0, state, {}, config.to_dict())
  checkpointer.wait()
  checkpointer.close()
  return config



def _parts_absent(params: dict, imported: ModelConfig, run: run_lib.Run, hf_dir: str
                  ) -> list[str]:
  """The model's parts (a layer stack's by name, 'generator/layers') that imported `params`
  lack; refuses overrides that reshape what they hold (ELECTRA's generator_size may shape the
  generator that an ELECTRA discriminator's folder lacks)."""
  stacks = models.family(run.model_cfg.arch).stacks
  expected = dict(flatten(nnx.to_pure_dict(run.spec.abstract.params)))
  given = dict(flatten(params))
  for path, value in given.items():
    shape = expected[path].shape if path in expected else None
    if shape != value.shape:
      diffs = checkpoint_lib.structural_diffs(dataclasses.asdict(imported),
                                              dataclasses.asdict(run.model_cfg))
      raise ValueError(f'the overrides change the model of {hf_dir} ({", ".join(diffs)}: '
                       f'{"/".join(map(str, path))} is {value.shape} there, {shape} with them); '
                       'drop those --config.model settings')
  absent = [path for path in expected if path not in given]
  return list(dict.fromkeys('/'.join(map(str, path[:2 if path[0] in stacks else 1]))
                            for path in absent))
