"""Hugging Face export and import: config.json + model.safetensors.

What each architecture exports as is its family's (`Family.hf`, models/hf_mapping.py): T5
encoder-decoders go both ways (T5ForConditionalGeneration); ELECTRA exports its discriminator
(ElectraForPreTraining) and BERT with next-sentence prediction its encoder, pooler and classifier
(BertForNextSentencePrediction). Here is what they share: the family's checks, its config.json,
and every tensor its table names, reshaped to PyTorch's Linear layout. Export needs neither torch
nor transformers; tensors are written as float32.
"""

import dataclasses
import json
import math
import os
from typing import Any

from flax import nnx
import numpy as np
import safetensors.numpy

from t5lite import paths
from t5lite.models import build, family, registry
from t5lite.models.architecture import Family
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel
from t5lite.models.params import Params, flatten, stack_layers, unstack_layers

CONFIG_FILE, WEIGHTS_FILE = 'config.json', 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'  # sharded checkpoints


def _hf_model(cfg: ModelConfig) -> HfModel:
  """cfg's Hugging Face model, once cfg is checked to be that model exactly."""
  hf = family(cfg.arch).hf
  if hf is None:
    names = [f.hf.name for f in registry.FAMILIES.values() if f.hf]
    raise ValueError(f'export supports {", ".join(names[:-1])} and {names[-1]} models; '
                     f'got arch={cfg.arch}')
  hf.check(cfg)
  return hf


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json of the Hugging Face model `cfg` exports as."""
  hf = _hf_model(cfg)
  return {'architectures': [hf.architecture], 'model_type': hf.model_type, **hf.config(cfg)}


def export_hf(params: nnx.State | Params, cfg: ModelConfig, out_dir: str) -> None:
  """Writes `params` (`nnx.state(model, nnx.Param)` or `get_params(model)`) as an HF folder."""
  config = hf_config(cfg)
  hf = family(cfg.arch).hf
  if isinstance(params, nnx.State):
    params = params.to_pure_dict()
  if cfg.scan_layers:
    params = unstack_layers(params)
  flat = dict(flatten(params))
  tensors = {}
  for path, name, num_in, scale in hf.table(cfg):
    if path not in flat:
      raise ValueError(f'params have no {"/".join(map(str, path))}; are they of this config?')
    value = np.asarray(flat[path], np.float32) * np.float32(scale)
    if num_in:  # (in..., out...) -> (in, out) -> (out, in)
      value = value.reshape(math.prod(value.shape[:num_in]), -1).T
    elif name.endswith('.bias'):  # (heads, d_kv) -> (heads * d_kv,)
      value = value.reshape(-1)
    tensors[name] = np.ascontiguousarray(value)
  if hf.extra:
    tensors.update(hf.extra(cfg))
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG_FILE), 'w') as f:
    json.dump(config, f, indent=2)
  safetensors.numpy.save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE),
                              metadata={'format': 'pt'})


def _importable() -> dict[str, Family]:
  """The families that import, by the model_type of their Hugging Face model."""
  return {f.hf.model_type: f for f in registry.FAMILIES.values() if f.hf and f.hf.load}


def _read_folder(folder: str) -> tuple[Family, dict[str, Any], dict[str, np.ndarray]]:
  """The family that reads a folder, its config.json and every tensor of model.safetensors
  (single or sharded); a local folder or a gs:// one."""
  root = paths.path(folder)
  config = _read_json(root / CONFIG_FILE, f'{folder} is not a Hugging Face checkpoint')
  importable = _importable()
  if config.get('model_type') not in importable:
    names = ' or '.join(f.hf.name for f in importable.values())
    raise ValueError(f'{folder} is not a {names} checkpoint: '
                     f'model_type={config.get("model_type")!r}')
  if (root / INDEX_FILE).is_file():
    files = sorted(set(_read_json(root / INDEX_FILE, folder).get('weight_map', {}).values()))
  elif (root / WEIGHTS_FILE).is_file():
    files = [WEIGHTS_FILE]
  else:
    raise ValueError(f'{folder} has no {WEIGHTS_FILE} (PyTorch .bin checkpoints are not read)')
  tensors = {}
  for name in files:
    try:
      tensors.update(safetensors.numpy.load((root / name).read_bytes()))
    except (OSError, safetensors.SafetensorError) as error:
      raise ValueError(f'{root / name} cannot be read ({error}); is it complete?') from None
  return importable[config['model_type']], config, tensors


def _read_json(file, what: str) -> dict:
  if not file.is_file():
    raise ValueError(f'{what}: no {file.name}')
  try:
    return json.loads(file.read_text())
  except (ValueError, UnicodeDecodeError) as error:
    raise ValueError(f'{file} is not JSON ({error})') from None


def import_hf(folder: str, **overrides: Any) -> tuple[ModelConfig, Params]:
  """(ModelConfig, params) of an HF folder of a family that imports (T5); params load with
  `load_params(build(cfg), ...)`.

  overrides set ModelConfig fields HF does not know (scan_layers, dtype, remat_policy, ...).
  """
  imported, config, tensors = _read_folder(folder)
  hf = imported.hf
  fields, tensors = hf.load(config, tensors)
  cfg = ModelConfig(**{'arch': imported.arch, **fields, **overrides})
  unrolled = dataclasses.replace(cfg, scan_layers=False)
  abstract = nnx.eval_shape(lambda: build(unrolled, nnx.Rngs(0)))
  shapes = dict(flatten(nnx.state(abstract, nnx.Param).to_pure_dict()))
  table = hf.table(cfg)
  missing = [row.name for row in table if tensors.get(row.name) is None]
  if missing:
    raise ValueError(f'{folder} misses {len(missing)} {hf.name} tensor(s), e.g. {missing[0]}')
  params: Params = {}
  for path, name, num_in, scale in table:
    shape = shapes[path].shape
    hf_shape = (math.prod(shape[num_in:]), math.prod(shape[:num_in])) if num_in else shape
    value = tensors[name].astype(np.float32) / np.float32(scale)
    if value.shape != hf_shape:
      raise ValueError(f'{name} has shape {value.shape}, config.json implies {hf_shape}')
    if num_in:
      value = value.T.reshape(shape)  # (out, in) -> (in, out) -> (in..., out...)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return cfg, stack_layers(params) if cfg.scan_layers else params
