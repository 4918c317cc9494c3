"""Hugging Face export and import: config.json + model.safetensors.

What each architecture exports as is its family's (`Family.hf`, models/hf_mapping.py): T5 and
BART encoder-decoders (T5ForConditionalGeneration, BartForConditionalGeneration) and T5 with
sparse experts (SwitchTransformersForConditionalGeneration, models/switch.py), GPT-2 decoders
(GPT2LMHeadModel), encoders with HF's MLM head (BertForPreTraining, BertForMaskedLM,
RobertaForMaskedLM) and ELECTRA (ElectraForPreTraining, its generator as ElectraForMaskedLM in
the subfolder `generator/`) go both ways; BERT with next-sentence prediction but our plain MLM
head exports its encoder, pooler and classifier (BertForNextSentencePrediction). Here is what
they share: the family's checks, its config.json, and every tensor its table names, reshaped to
PyTorch's Linear (or GPT-2's Conv1D) layout and concatenated where one HF tensor fuses several of
ours. Import picks the model by config.json's model_type, and among BERT's and ELECTRA's by its
architectures. Export needs neither torch nor transformers;
tensors are written as float32.
"""

import dataclasses
import json
import math
import os
from typing import Any

from flax import nnx
import numpy as np
import safetensors.numpy

from t5lite import files
from t5lite import paths
from t5lite.models import build, family, registry
from t5lite.models.architecture import Family
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel, Row
from t5lite.models.params import Params, flatten, stack_layers, unstack_layers

CONFIG_FILE, WEIGHTS_FILE = 'config.json', 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'  # sharded checkpoints


def hf_model(cfg: ModelConfig) -> HfModel:
  """cfg's Hugging Face model (of model_type cfg.hf_model_type, if set), once cfg is checked to
  be that model exactly."""
  fitting = [hf for hf in family(cfg.arch).hf if not hf.folder and hf.fits(cfg)
             and cfg.hf_model_type in ('', hf.model_type)]
  if not fitting and cfg.hf_model_type:
    raise ValueError(f'model.hf_model_type={cfg.hf_model_type!r} does not fit this model '
                     f'(arch={cfg.arch}, relative_bias_per_layer={cfg.relative_bias_per_layer}, '
                     f'position={cfg.position})')
  if not fitting:
    models = [hf for f in registry.FAMILIES.values() for hf in f.hf]
    raise ValueError(f'export supports {_listed(models, "and")} models; got arch={cfg.arch}')
  fitting[0].check(cfg)
  return fitting[0]


def hf_models(cfg: ModelConfig) -> list[HfModel]:
  """cfg's Hugging Face model and those an export writes beside it in subfolders (ELECTRA's
  generator), each checked."""
  models = [hf_model(cfg), *(hf for hf in family(cfg.arch).hf if hf.folder and hf.fits(cfg))]
  for hf in models[1:]:
    hf.check(cfg)
  return models


def _listed(models: list[HfModel], conjunction: str) -> str:
  """Each model's name once: 'T5, BERT and GPT-2'."""
  names = list(dict.fromkeys(hf.name for hf in models))
  return f'{", ".join(names[:-1])} {conjunction} {names[-1]}' if len(names) > 1 else names[0]


def hf_config(cfg: ModelConfig, hf: HfModel | None = None) -> dict[str, Any]:
  """The config.json of `hf` (default: the Hugging Face model `cfg` exports as)."""
  hf = hf or hf_model(cfg)
  return {'architectures': [hf.architecture], 'model_type': hf.model_type, **hf.config(cfg)}


def export_hf(params: nnx.State | Params, cfg: ModelConfig, out_dir: str) -> None:
  """Writes `params` (`nnx.state(model, nnx.Param)` or `get_params(model)`) as an HF folder, and
  any model of the run written beside it into its subfolder."""
  models = hf_models(cfg)
  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  if cfg.scan_layers:
    params = unstack_layers(params)
  flat = dict(flatten(params))
  for hf in models:
    _write_model(flat, cfg, hf, os.path.join(out_dir, hf.folder))


def _write_model(flat: dict[tuple, Any], cfg: ModelConfig, hf: HfModel, out_dir: str) -> None:
  """config.json and model.safetensors of `hf` from the flattened params."""
  table = hf.table(cfg)
  absent = [row.path for row in table if row.path not in flat]
  if absent:
    raise ValueError(f'params have no {"/".join(map(str, absent[0]))}; are they of this config?')
  tensors = {}
  for name, rows in _by_tensor(table).items():
    parts = [_to_hf(flat[row.path] if row.index is None else flat[row.path][row.index], row)
             for row in rows]
    tensors[name] = np.ascontiguousarray(np.concatenate(parts, axis=_output_axis(rows[0])))
  if hf.extra:
    tensors.update(hf.extra(cfg))
  os.makedirs(out_dir, exist_ok=True)
  config_file, weights_file = os.path.join(out_dir, CONFIG_FILE), os.path.join(out_dir, WEIGHTS_FILE)
  with open(config_file, 'w') as f:
    json.dump(hf_config(cfg, hf), f, indent=2)
  safetensors.numpy.save_file(tensors, weights_file, metadata={'format': 'pt'})
  # safetensors creates its file private (0600); the export's files share one mode
  os.chmod(weights_file, os.stat(config_file).st_mode & 0o777)


def _reader(folder: str, config: dict[str, Any]) -> tuple[Family, HfModel]:
  """The family and HF model that read a folder of this config.json: by its model_type, and
  where several HF models that import share one (BERT's), by its architectures."""
  importable = {}
  for f in registry.FAMILIES.values():
    for hf in f.hf:
      if hf.load:
        importable.setdefault(hf.model_type, []).append((f, hf))
  model_type, architectures = config.get('model_type'), config.get('architectures') or []
  files.check_type(architectures, list, f'{folder}/{CONFIG_FILE}: architectures')
  if not isinstance(model_type, str) or model_type not in importable:
    models = [hf for same_type in importable.values() for _, hf in same_type]
    raise ValueError(f'{folder} is not a {_listed(models, "or")} checkpoint: '
                     f'model_type={config.get("model_type")!r}')
  readers = importable[model_type]
  named = [(f, hf) for f, hf in readers if hf.architecture in architectures]
  if len(readers) > 1 and not named:
    raise ValueError(f'{folder} holds architectures={config.get("architectures")}; import reads '
                     f'{" or ".join(hf.architecture for _, hf in readers)}')
  return (named or readers)[0]


def _read_folder(folder: str) -> tuple[tuple[Family, HfModel], dict[str, Any],
                                      dict[str, np.ndarray]]:
  """The family and HF model that read a folder, its config.json and every tensor of
  model.safetensors (single or sharded); a local folder or a gs:// one."""
  root = paths.path(folder)
  if not (root / CONFIG_FILE).exists():
    raise ValueError(f'{folder} is not a Hugging Face checkpoint: no {CONFIG_FILE}')
  config = files.read_json(root / CONFIG_FILE)
  reader = _reader(folder, config)
  if (root / INDEX_FILE).exists():
    weight_files = _sharded_files(root / INDEX_FILE)
  elif (root / WEIGHTS_FILE).exists():
    weight_files = [WEIGHTS_FILE]
  else:
    raise ValueError(f'{folder} has no {WEIGHTS_FILE} (PyTorch .bin checkpoints are not read)')
  tensors = {}
  for name in weight_files:
    raw = files.read_bytes(root / name)
    try:
      tensors.update(safetensors.numpy.load(raw))
    except (safetensors.SafetensorError, ValueError) as error:
      raise ValueError(f'{root / name} cannot be read ({error}); is it complete?') from None
  return reader, config, tensors


def _sharded_files(index) -> list[str]:
  """The safetensors files a sharded checkpoint's index names, each a file of its folder."""
  weight_map = files.read_json(index).get('weight_map', {})
  files.check_type(weight_map, dict, f'{index}: weight_map')
  for name in weight_map.values():
    if not isinstance(name, str) or os.path.basename(name) != name or name in ('', '.', '..'):
      raise ValueError(f'{index}: weight_map names {name!r}, not a file of its folder')
  return sorted(set(weight_map.values()))


def import_hf(folder: str, **overrides: Any) -> tuple[ModelConfig, Params]:
  """(ModelConfig, params) of an HF folder of a model that imports (T5, Switch, BART, GPT-2,
  BERT, RoBERTa, ELECTRA), with the models of the run in its subfolders (an ELECTRA discriminator's
  `generator/`); params load with `load_params(build(cfg), ...)`. Parameters no model holds (an
  ELECTRA discriminator's generator, imported alone) are absent: `state.from_params` initialises
  them. Where two models hold a tensor (ELECTRA's shared embeddings), they must agree.

  overrides set ModelConfig fields HF does not know (scan_layers, dtype, remat_policy, ...).
  """
  (imported, hf), config, tensors = _read_folder(folder)
  models = [(hf, folder, config, tensors)]
  for beside in imported.hf:
    subfolder = os.path.join(folder, beside.folder)
    if beside.folder and beside is not hf and (paths.path(subfolder) / CONFIG_FILE).is_file():
      (_, read), config, tensors = _read_folder(subfolder)
      if read is not beside:
        raise ValueError(f'{subfolder} holds architectures={config.get("architectures")}, '
                         f'not {beside.architecture}')
      models.append((beside, subfolder, config, tensors))
  loaded = [(hf, where, *_load(hf, where, config, tensors))
            for hf, where, config, tensors in models]
  fields = {}
  for _, _, model_fields, _ in reversed(loaded):  # the folder's own model decides
    fields.update(model_fields)
  try:
    cfg = ModelConfig(**{'arch': imported.arch, **fields, **overrides})
  except ValueError as error:
    raise ValueError(f'{folder}/{CONFIG_FILE}: {error}') from None
  unrolled = dataclasses.replace(cfg, scan_layers=False)
  abstract = nnx.eval_shape(lambda: build(unrolled, nnx.Rngs(0)))
  shapes = dict(flatten(nnx.to_pure_dict(nnx.state(abstract, nnx.Param))))
  flat = {}
  for hf, where, _, tensors in loaded:
    for path, value in _read_table(hf, cfg, where, tensors, shapes).items():
      if path in flat and not np.array_equal(flat[path], value):
        raise ValueError(f'{folder} and {where} hold different {"/".join(map(str, path))}; '
                         f't5lite\'s {hf.name} shares it')
      flat[path] = value
  params: Params = {}
  for path, value in flat.items():
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return cfg, stack_layers(params) if cfg.scan_layers else params


def _load(hf: HfModel, folder: str, config: dict, tensors: dict) -> tuple[dict, dict]:
  """`hf.load` of a folder's config.json and tensors: a setting or tensor it lacks, or a setting
  of a type its arithmetic cannot take ("256" // 4), is one line naming the file."""
  try:
    return hf.load(config, tensors)
  except KeyError as error:
    name = error.args[0]
    file = WEIGHTS_FILE if '.' in str(name) else CONFIG_FILE  # HF's tensor names have dots
    raise ValueError(f'{folder}/{file} has no {name!r}') from None
  except (TypeError, ArithmeticError) as error:
    raise ValueError(f'{folder}/{CONFIG_FILE} holds a setting of the wrong type ({error})'
                     ) from None


def _read_table(hf: HfModel, cfg: ModelConfig, folder: str, tensors: dict[str, np.ndarray],
                shapes: dict[tuple, Any]) -> dict[tuple, np.ndarray]:
  """Our params (path -> array of its shape in `shapes`) from the tensors `hf.table` names."""
  by_tensor = _by_tensor(hf.table(cfg))
  sharded = (paths.path(folder) / INDEX_FILE).exists()
  weights = os.path.join(folder, INDEX_FILE if sharded else WEIGHTS_FILE)  # in messages
  missing = [name for name in by_tensor if tensors.get(name) is None]
  if missing:
    raise ValueError(f'{weights} misses {len(missing)} {hf.name} tensor(s), e.g. {missing[0]}')
  flat = {}
  for name, rows in by_tensor.items():
    try:
      values = _our_parts(name, tensors[name], rows,
                          [shapes[row.path].shape[row.index is not None:] for row in rows])
    except ValueError as error:
      raise ValueError(f'{weights}: {error}') from None
    for row, value in zip(rows, values):
      if row.index is None:
        flat[row.path] = value
      else:  # one entry (an expert) of the param
        flat.setdefault(row.path, np.zeros(shapes[row.path].shape, np.float32))[row.index] = value
  return flat


def _by_tensor(table: list[Row]) -> dict[str, list[Row]]:
  """HF's tensors in table order, each with the rows of its parts (GPT-2's fused q, k, v)."""
  parts = {}
  for row in table:
    parts.setdefault(row.name, []).append(row)
  return parts


def _output_axis(row: Row) -> int:
  """The axis of HF's tensor that its parts are concatenated along: the output dim."""
  return 0 if row.num_in and not row.conv1d else -1


def _hf_shape(shape: tuple, row: Row) -> tuple:
  """The shape `_to_hf` gives our array of `shape`."""
  if row.num_in:
    in_out = math.prod(shape[:row.num_in]), math.prod(shape[row.num_in:])
    return in_out if row.conv1d else in_out[::-1]
  if row.name.endswith('.bias'):
    return (math.prod(shape),)
  return (shape[0] + row.leading_rows, *shape[1:])


def _to_hf(value, row: Row) -> np.ndarray:
  """Our array -> its part of HF's tensor: scaled, a kernel (in..., out...) as (in, out) (Conv1D)
  or (out, in) (Linear), (heads, d_kv) biases flattened, zero rows before a table's."""
  value = np.asarray(value, np.float32) * np.float32(row.scale)
  if row.num_in:
    value = value.reshape(math.prod(value.shape[:row.num_in]), -1)
    return value if row.conv1d else value.T
  if row.leading_rows:
    return np.pad(value, [(row.leading_rows, 0)] + [(0, 0)] * (value.ndim - 1))
  return value.reshape(-1) if row.name.endswith('.bias') else value


def _our_parts(name: str, value: np.ndarray, rows: list[Row], shapes: list[tuple]
               ) -> list[np.ndarray]:
  """HF's tensor `name` -> our arrays of `shapes`, one per row of its parts (`_to_hf` undone)."""
  axis = _output_axis(rows[0])
  hf_shapes = [_hf_shape(shape, row) for row, shape in zip(rows, shapes)]
  sizes = [hf_shape[axis] for hf_shape in hf_shapes]
  expected = list(hf_shapes[0])
  expected[axis] = sum(sizes)
  if value.shape != tuple(expected):
    raise ValueError(f'{name} has shape {value.shape}, config.json implies {tuple(expected)}')
  parts = np.split(value.astype(np.float32), np.cumsum(sizes)[:-1], axis=axis)
  return [_from_hf(part, row, shape) for row, part, shape in zip(rows, parts, shapes)]


def _from_hf(part: np.ndarray, row: Row, shape: tuple) -> np.ndarray:
  """`_to_hf` undone: HF's part -> our array of `shape`."""
  if row.num_in and not row.conv1d:
    part = part.T  # (out, in) -> (in, out)
  part = part[row.leading_rows:]  # a table's rows HF's has before ours
  return (part / np.float32(row.scale)).reshape(shape)
