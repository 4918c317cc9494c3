"""What a finished or running workdir is used for: evaluate it, decode with it (`t5lite infer`),
export it, or start one from HF.

All go through `restore_params`, which rebuilds the run's parameter layout from its config and
reads the parameters of one checkpoint into it (never the optimizer state), on whatever devices
this process has.
"""

import dataclasses
import json
import os
import sys

import jax
import ml_collections
import numpy as np
from flax import nnx

from t5lite import config as config_lib
from t5lite import objectives
from t5lite import paths
from t5lite import outputs as outputs_lib
from t5lite.data import pipeline
from t5lite.data import vocabulary
from t5lite.export import hf
from t5lite.models import decoding, family
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
    params = checkpointer.restore_params(step, spec.abstract.params)
  checkpointer.close()
  return step, spec, params, mesh, rules


def evaluate_workdir(config, workdir: str, data: str | None = None,
                     num_batches: int | None = None, inputs: loop.Inputs | None = None) -> dict:
  """Held-out loss/accuracy of the latest checkpoint on the validation split or a given file,
  or on the held-out batches of `inputs` (a fine-tuning task's, with exact match).

  A distilled student is evaluated on its own (its teacher need not exist any more); an ELECTRA
  run reports its generator's and discriminator's metrics."""
  step, spec, params, mesh, rules = restore_params(config, workdir)
  split = 'validation'
  if data:
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.source, split = data, 'all'
  model_cfg = config_lib.model_config(config)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    batch_sharding = mesh_lib.batch_sharding(mesh)
    loss = objectives.make_loss(config, model_cfg,
                                exact_match=bool(inputs and inputs.exact_match))
    eval_step = step_lib.jit_eval_step(spec, mesh, loss)
    batches, count = inputs.held_out() if inputs else (
        pipeline.make_pipeline(config.data, split), config.train.eval_batches)
    metrics = loop.evaluate(eval_step, loss, params, batches, num_batches or count,
                            batch_sharding)
  return {'step': step, **metrics}


def export_workdir(config, workdir: str, out_dir: str, step: int | None = None,
                   overwrite: bool = False) -> int:
  """Writes checkpoint `step` (default: the latest) as a Hugging Face folder `out_dir`; which
  `out_dir` may be written, checked before the restore: t5lite/outputs.py."""
  model_cfg = config_lib.model_config(config)
  hf.hf_config(model_cfg)  # a model export cannot write fails here, before the restore
  outputs_lib.check_folder(out_dir, (hf.CONFIG_FILE, hf.WEIGHTS_FILE), workdir=workdir,
                           overwrite=overwrite)
  step, _, params, _, _ = restore_params(config, workdir, step)
  with outputs_lib.writing(out_dir, folder=True) as temp:
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
  _, mesh, rules, optimizer, _ = loop.setup(config)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    spec = state_lib.state_spec(config_lib.model_config(config), optimizer, config.train.seed,
                                mesh, rules)
    state = state_lib.from_params(spec, optimizer, params, config.train.seed)
  loop.record_config(workdir, config)
  checkpointer = checkpoint_lib.Checkpointer(workdir, config.checkpoint)
  checkpointer.save(0, state, {}, config.to_dict())
  checkpointer.wait()
  checkpointer.close()
  return config


def read_inputs(texts: list[str], input_file: str | None = None, key: str = 'input') -> list[str]:
  """The `--input` texts, then one per line of input_file (of a .jsonl file, each line's `key`).

  An empty input is a ValueError that names it: a blank line is more likely a mistake than a
  request to decode nothing.
  """
  inputs = []
  for number, text in enumerate(texts, 1):
    if not text.strip():
      raise ValueError(f'--input number {number} is empty')
    inputs.append(text)
  if input_file:
    file = paths.path(input_file)
    if not file.is_file():
      raise FileNotFoundError(f'no such input file: --input_file={input_file}')
    with file.open() as f:
      for number, line in enumerate(f, 1):
        text = line.rstrip('\r\n')
        if input_file.endswith('.jsonl') and text.strip():
          try:
            text = json.loads(text)[key]
          except (ValueError, KeyError, TypeError):
            text = None
          if not isinstance(text, str):
            raise ValueError(f'{input_file} line {number} is not a JSON object with a string '
                             f'"{key}" field')
        if not text.strip():
          raise ValueError(f'{input_file} line {number} is empty: give one input per line')
        inputs.append(text)
  if not inputs:
    raise ValueError('nothing to decode: give --input=TEXT or --input_file=FILE')
  return inputs


def encode_inputs(vocab: vocabulary.Vocabulary, inputs: list[str], length: int, *, eos: bool
                  ) -> np.ndarray:
  """(len(inputs), length) int32 ids, EOS appended if `eos`, 0-padded. Longer inputs keep their
  first tokens, with one warning line each on stderr and a count after them."""
  tokens = np.zeros((len(inputs), length), np.int32)
  truncated = 0
  for row, text in enumerate(inputs):
    ids = vocab.encode(text)
    room = length - eos
    if len(ids) > room:
      truncated += 1
      print(f'warning: input {row + 1} has {len(ids) + eos} tokens, more than '
            f'data.inputs_length={length}; keeping the first {room}'
            f'{" and EOS" if eos else ""}', file=sys.stderr)
      ids = ids[:room]
    ids += [vocabulary.EOS_ID] * eos
    tokens[row, :len(ids)] = ids
  if truncated:
    print(f'warning: truncated {truncated} of {len(inputs)} inputs', file=sys.stderr)
  return tokens


def infer_workdir(config, workdir: str, inputs: list[str], *, step: int | None = None,
                  out: str | None = None, overwrite: bool = False,
                  max_decode_length: int | None = None, seed: int = 0, **options) -> list[str]:
  """Decoded text of each input (sentinels shown as <extra_id_N>) with checkpoint `step`
  (default: the latest) of `workdir`; `out` also gets them as JSONL {"input": .., "output": ..}.

  Inputs are tokenized with the run's vocabulary, EOS appended for an encoder, and padded to
  data.inputs_length. `options` go to `decoding.generate` (method, temperature, top_k, top_p,
  beam_size, alpha); max_decode_length defaults to data.targets_length; sampling draws from
  `seed`. Which `out` may be written, checked before anything is decoded: t5lite/outputs.py.
  """
  keys = ('input', 'output')  # of each JSONL line
  if out:
    outputs_lib.check_file(out, lambda path: outputs_lib.is_jsonl_of(path, keys),
                           workdir=workdir, overwrite=overwrite)
  model_cfg = config_lib.model_config(config)
  vocab = vocabulary.load_vocabulary(config.data.vocabulary)
  tokens = encode_inputs(vocab, inputs, config.data.inputs_length,
                         eos=family(model_cfg.arch).prompt == 'encoder')
  max_decode_length = max_decode_length or config.data.targets_length
  decoding.check_options(model_cfg, tokens.shape[1], max_decode_length=max_decode_length,
                         **options)
  rng = jax.random.key(seed)
  _, spec, params, mesh, rules = restore_params(config, workdir, step)
  # Fixed-size batches (one compilation), split over the mesh's batch axes.
  shards = mesh_lib.batch_shards(mesh)
  batch_size = -(-min(len(inputs), config.data.batch_size) // shards) * shards
  tokens = np.pad(tokens, ((0, -len(inputs) % batch_size), (0, 0)))
  decoded = []
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    model = nnx.merge(spec.graphdef, params, spec.rest)
    for start in range(0, len(tokens), batch_size):
      batch = jax.device_put(tokens[start:start + batch_size], mesh_lib.batch_sharding(mesh))
      decoded.extend(jax.device_get(decoding.generate(
          model, batch, max_decode_length=max_decode_length,
          rng=jax.random.fold_in(rng, start), **options)))
  outputs = [vocab.decode(row) for row in decoded[:len(inputs)]]
  if out:
    with outputs_lib.writing(out) as temp, open(temp, 'w', encoding='utf-8') as f:
      for row in zip(inputs, outputs):
        f.write(json.dumps(dict(zip(keys, row))) + '\n')
  return outputs
