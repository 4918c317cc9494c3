"""The run configuration: one ConfigDict of model / data / train / optim / mesh / checkpoint.

Every preset in `t5lite/configs/` starts from `base_config()` and changes what differs, so every
value of a run is visible in one printed config and can be overridden as `--config.a.b=value`.
`validate()` turns a ConfigDict into checked, typed pieces before anything compiles.
"""

import ast
import dataclasses
import importlib.machinery
import importlib.util
import os
import pathlib
import re
import traceback

import ml_collections

from t5lite import files
from t5lite import objectives
from t5lite import paths
from t5lite.data import vocabulary
from t5lite.inputs import mixture
from t5lite.models import registry
from t5lite.models.config import ModelConfig

# T5 v1.0 (Raffel et al. 2020): ReLU FFN, tied and scaled lm head.
T5_1_0 = dict(activation='relu', tie_embeddings=True, norm='rms', norm_position='pre',
              position='t5_relative', use_bias=False, dropout=0.1)
# T5 v1.1: gated-GELU FFN, untied lm head, no dropout in pretraining.
T5_1_1 = dict(T5_1_0, activation='gated-gelu', tie_embeddings=False, dropout=0.0)
# ByT5 (Xue et al. 2022): T5 v1.1 over UTF-8 bytes (384 ids, no model file), span corruption of
# 20-byte spans on average at 1,024 inputs; its encoder three times as deep as its decoder.
BYT5_DATA = dict(vocabulary='bytes', inputs_length=1024, targets_length=189,
                 mean_noise_span_length=20.0)
# mT5 (Xue et al. 2021) and UMT5 (Chung et al. 2023): T5 v1.1 at 1,024 inputs over a
# multilingual SentencePiece vocabulary the user brings (mT5's: 250,000 pieces + 100 sentinels,
# padded; UMT5's: 256,000 + 300)
MT5_DATA = dict(inputs_length=1024, targets_length=229)
MT5_VOCAB_SIZE, UMT5_VOCAB_SIZE = 250_112, 256_384
# BERT (Devlin et al. 2019), also RoBERTa's and BART's layers: post-LN, GELU, learned positions,
# LayerNorm over the embeddings, biases, tied output embedding.
BERT = dict(activation='gelu', norm='layer', norm_position='post', norm_eps=1e-12,
            position='learned', embed_norm=True, use_bias=True, tie_embeddings=True, dropout=0.1)
# The shipped presets, `--config=NAME` from any folder (installed with the package).
PRESETS = pathlib.Path(__file__).parent / 'configs'


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by all presets: T5 span-corruption pretraining with Adafactor."""
  return ml_collections.ConfigDict(dict(
      model=dataclasses.asdict(ModelConfig()), data=_data_defaults(), train=_train_defaults(),
      **_optim_mesh_checkpoint_defaults()))


def byt5(**shape: int) -> ml_collections.ConfigDict:
  """ByT5 of `shape` (d_model, d_ff, num_heads, the layers): T5 v1.1 over 384 byte ids with
  ByT5's data (BYT5_DATA)."""
  config = base_config()
  config.model.update(T5_1_1, vocab_size=384, d_kv=64, **shape)
  config.data.update(BYT5_DATA)
  return config


def multilingual(t5_1_1_preset: str, per_layer_bias: bool = False) -> ml_collections.ConfigDict:
  """mT5 at the shape of a T5 v1.1 preset ('t5_1_1_base'), its sizes being T5 v1.1's: mT5's
  vocabulary and lengths, exported as MT5; with `per_layer_bias`, UMT5: a bias table in every
  layer, UMT5's vocabulary."""
  config = load(t5_1_1_preset)
  config.model.update(vocab_size=UMT5_VOCAB_SIZE if per_layer_bias else MT5_VOCAB_SIZE,
                      relative_bias_per_layer=per_layer_bias,
                      hf_model_type='' if per_layer_bias else 'mt5')
  config.data.update(MT5_DATA)
  return config


def _data_defaults() -> ml_collections.ConfigDict:
  """What is read and how it is turned into batches."""
  data = ml_collections.ConfigDict()
  # bundled | a .txt/.jsonl path or glob | tfds:NAME (e.g. tfds:c4/en:3.1.0) | synthetic (random
  # tokens in the objective's features: t5lite/inputs/batches.py)
  data.source = 'bundled'
  data.tfds_data_dir = ''  # where the TFDS dataset was prepared; nothing is ever downloaded
  data.text_key = 'text'  # JSONL / TFDS feature holding the text
  # bundled | bytes (ByT5's UTF-8 bytes, no model file) | path to a SentencePiece .model
  # (sentinels are appended)
  data.vocabulary = 'bundled'
  # span_corruption | mlm | mlm_nsp | causal_lm | prefix_lm | bart | electra | seq2seq_lm
  # (t5lite/objectives)
  data.objective = 'span_corruption'
  # Lengths as seqio's feature converters read them: span_corruption and bart: encoder inputs and
  # decoder targets; mlm: the encoder's inputs_length (targets_length 0); causal_lm: the decoder's
  # targets_length (inputs_length 0); prefix_lm: a decoder row of inputs_length + targets_length.
  data.inputs_length = 512  # encoder length after corruption
  data.targets_length = 114  # decoder length; random_spans_helper's value for 512 inputs
  data.noise_density = 0.15  # fraction of tokens noised: span_corruption and mlm 0.15, bart 0.3
  data.mean_noise_span_length = 3.0  # span_corruption's mean span; bart's Poisson lambda
  data.mode = ''  # text every example's inputs start with: UL2's mode tokens ('[NLU]', ...)
  data.batch_size = 128  # global, across all processes
  data.validation_fraction = 0.05  # held out by whole document
  data.seed = 0
  # Named components mixed by weight, each {weight (> 0), and optionally its own source,
  # text_key, validation_fraction, objective, noise_density, mean_noise_span_length, mode; those
  # left out are data's}, e.g. --config.data.mixture.web.source=stores/web
  # --config.data.mixture.web.weight=3; empty: `source` alone (t5lite/inputs/mixture.py).
  data.mixture = ml_collections.ConfigDict()
  # How the components' rates are made (t5lite/inputs/mixture.py): weights (their weights) | size
  # (weight, 1 if left out, x the train tokens of the component's token store ** mixture_alpha:
  # mT5's language sampling)
  data.mixture_rule = 'weights'
  data.mixture_alpha = 0.3  # in (0, 1]: 1 in proportion to size, toward 0 alike (mT5: 0.3)
  data.threads = 0  # tf.data threads per process; 0: half of the host's cores (JAX keeps the rest)
  # Fine-tuning's (`t5lite finetune` sets them): 'sentiment' or a .tsv/.jsonl file of input and
  # target texts, and its columns / JSON keys; '' pretrains on `source`.
  data.task = ''
  data.inputs_key = 'input'
  data.targets_key = 'target'
  return data


def _train_defaults() -> ml_collections.ConfigDict:
  """The step loop, the loss and distillation."""
  train = ml_collections.ConfigDict()
  train.steps = 10_000
  train.microbatches = 1  # gradient accumulation: batch_size is split into this many
  train.seed = 0  # parameter initialisation and dropout
  train.z_loss = 1e-4
  # Sparse experts' router losses (t5lite/objectives/routing.py), their weights in the loss:
  # ST-MoE's router z-loss and the Switch Transformer's load-balancing loss
  train.router_z_loss = 0.001
  train.load_balance_loss = 0.01
  train.label_smoothing = 0.0
  train.loss_normalizer = 'real_tokens'  # real_tokens | total_tokens | a number (T5X's constant)
  # N > 0: the lm objective's cross entropy over N slices of the targets, each slice's logits
  # recomputed in the backward pass, so the (batch, length, vocab) logits never exist at once
  # (large vocabularies); 0: all logits at once, computed once.
  train.loss_chunks = 0
  train.log_every = 50
  train.eval_every = 1000
  train.eval_batches = 20
  # Distillation (Hinton et al. 2015) when teacher_workdir names a workdir with checkpoints: its
  # latest params are a frozen teacher of the same architecture family and vocabulary.
  train.teacher_workdir = ''
  train.distill_alpha = 0.5  # weight of the hard-label loss; 1 - alpha weighs T^2 KL to teacher
  train.distill_temperature = 2.0  # T: both softmaxes are taken of logits / T
  train.distill_hidden_weight = 0.0  # cosine loss between final hidden states (same d_model)
  # Sparse upcycling (t5lite/train/upcycle.py): a dense workdir whose latest parameters start
  # this run with experts, each a copy of its layer's MLP; '' starts from a random init.
  train.upcycle_workdir = ''
  train.spikes = _spikes_defaults()
  return train


def _spikes_defaults() -> ml_collections.ConfigDict:
  """Loss spikes (t5lite/train/spikes.py): a step whose loss or gradient norm is not finite, whose
  loss is `ceiling` times the run's first, or which lies more than `threshold` deviations above
  its moving mean; and what is done about it."""
  spikes = ml_collections.ConfigDict()
  # off: a NaN or Inf loss stops the run, a finite spike goes on | stop: any spike stops the run
  # | skip: a spike's update is not applied | rollback: back to the checkpoint before the spike,
  # its batches skipped
  spikes.policy = 'off'
  spikes.window = 100  # steps in the moving mean and variance
  # deviations above the mean that make a spike (loss or gradient norm), once 10 healthy steps
  # (or `window`, if fewer) are in the statistics
  spikes.threshold = 8.0
  spikes.ceiling = 4.0  # from the second step, a loss above this many times the first is a spike
  spikes.skip_limit = 5  # skip: skips within skip_window steps; the next spike rolls back
  spikes.skip_window = 1000
  spikes.rollback_skip_after = 20  # rollback: batches skipped past the spike's own
  spikes.max_rollbacks = 3  # rollbacks in a run; a spike past them stops it
  return spikes


def _optim_mesh_checkpoint_defaults() -> dict[str, ml_collections.ConfigDict]:
  """The optimizer, the device mesh and its sharding rules, and checkpointing."""
  optim = ml_collections.ConfigDict()
  optim.name = 'adafactor'  # adafactor | adamw | adamw_scaled (nanoT5)
  optim.schedule = 'rsqrt'  # rsqrt (T5) | cosine | constant
  optim.learning_rate = 0.01  # peak, or the constant of T5's rsqrt schedule
  optim.warmup_steps = 10_000
  optim.weight_decay = 0.0
  optim.clip_grad_norm = 1.0  # 0 disables

  mesh = ml_collections.ConfigDict()
  mesh.data = -1  # -1: the devices the other axes leave
  mesh.fsdp = 1
  mesh.expert = 1  # sparse experts split over this many devices (and the batch, as by data)
  mesh.tensor = 1
  # Across slices (TPU) or nodes (GPU), over the data-center network: data and fsdp repeat
  # dcn_data and dcn_fsdp times, whose product is the number of slices; expert and tensor never
  # cross.
  mesh.dcn_data = -1  # -1: the slices dcn_fsdp leaves (1 on one slice), as MaxText's default
  mesh.dcn_fsdp = 1
  # Logical axis -> the mesh axes it is split over ('data,fsdp' for two, '' replicated), as
  # MaxText's logical_axis_rules: parameters are sharded over fsdp and tensor (experts over
  # expert), batches over data, fsdp and expert (inside a sparse layer, batch_no_expert: data and
  # fsdp). `--config.mesh.rules.embed=` replicates the d_model dimension of every parameter.
  mesh.rules = ml_collections.ConfigDict(dict(
      batch='data,fsdp,expert', embed='fsdp', mlp='tensor', heads='tensor', vocab='tensor', kv='',
      length='', layers='', relpos_buckets='', expert='expert', batch_no_expert='data,fsdp'))

  ckpt = ml_collections.ConfigDict()
  ckpt.every_steps = 1000
  ckpt.keep = 3  # the last N
  ckpt.keep_period = 0  # also keep every K-th step forever; 0 keeps none
  ckpt.async_save = True
  return dict(optim=optim, mesh=mesh, checkpoint=ckpt)


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """The frozen ModelConfig of a run; raises ValueError with one line if it cannot work."""
  known = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(config.model.keys()) - known)
  if unknown:
    raise ValueError(f'unknown model setting(s): {", ".join("model." + k for k in unknown)}')
  model_cfg = ModelConfig(**config.model.to_dict())
  registry.check(model_cfg)
  return model_cfg


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses, in one line naming the setting, a value of train / checkpoint / optim / data that
  cannot be meant (a zero interval, no steps, keeping no checkpoint). The model's own checks are
  `model_config`'s; what needs the data or the devices is checked where they are known."""
  missing = [name for name in base_config() if name not in config]
  if missing:
    raise ValueError(f'the config has no {missing[0]} section; start presets from base_config()')
  train, ckpt, optim, data = config.train, config.checkpoint, config.optim, config.data
  at_least = [('train.steps', train.steps, 1), ('train.microbatches', train.microbatches, 1),
              ('train.log_every', train.log_every, 1), ('train.eval_every', train.eval_every, 0),
              ('train.eval_batches', train.eval_batches, 1),
              ('train.loss_chunks', train.loss_chunks, 0),
              ('checkpoint.every_steps', ckpt.every_steps, 1), ('checkpoint.keep', ckpt.keep, 1),
              ('checkpoint.keep_period', ckpt.keep_period, 0),
              ('optim.warmup_steps', optim.warmup_steps, 0),
              ('data.batch_size', data.batch_size, 1), ('data.threads', data.threads, 0),
              ('data.inputs_length', data.inputs_length, 0),
              ('data.targets_length', data.targets_length, 0)]
  for name, value, minimum in at_least:
    if value < minimum:
      raise ValueError(f'config.{name}={value} must be at least {minimum}')
  for name, value in [('optim.weight_decay', optim.weight_decay),
                      ('optim.clip_grad_norm', optim.clip_grad_norm),
                      ('train.z_loss', train.z_loss),
                      ('train.router_z_loss', train.router_z_loss),
                      ('train.load_balance_loss', train.load_balance_loss),
                      ('train.distill_hidden_weight', train.distill_hidden_weight)]:
    if value < 0:
      raise ValueError(f'config.{name}={value} must be at least 0')
  for name, value, one_allowed in [('train.label_smoothing', train.label_smoothing, False),
                                   ('train.distill_alpha', train.distill_alpha, True),
                                   ('data.validation_fraction', data.validation_fraction, False)]:
    if not (0 <= value < 1 or one_allowed and value == 1):
      raise ValueError(f'config.{name}={value} must be in [0, 1{"]" if one_allowed else ")"}')
  for name, value in [('optim.learning_rate', optim.learning_rate),
                      ('train.distill_temperature', train.distill_temperature)]:
    if value <= 0:
      raise ValueError(f'config.{name}={value} must be positive')
  for group in (('data', 'fsdp', 'expert', 'tensor'), ('dcn_data', 'dcn_fsdp')):
    check_mesh_sizes([config.mesh[name] for name in group],
                     ' '.join(f'mesh.{name}={config.mesh[name]}' for name in group))
  objectives.check_settings(data, 'config.data')
  mixture.check_rule(data)
  if train.eval_every and data.validation_fraction == 0 and not data.task:
    raise ValueError('config.train.eval_every needs held-out data, but '
                     'config.data.validation_fraction=0; set it above 0 or eval_every=0')


def check_mesh_sizes(sizes: list[int], described: str) -> None:
  """One line for a group of mesh axis sizes (the ICI axes, or the DCN ones) with a size below 1
  (-1 aside: the rest) or two -1s."""
  if sizes.count(-1) > 1 or any(size == 0 or size < -1 for size in sizes):
    raise ValueError(f'{described}: sizes must be positive, with at most one -1 (the rest)')


def presets() -> list[str]:
  """The names of the shipped presets, `--config=NAME` for t5lite/configs/NAME.py."""
  return sorted(path.stem for path in PRESETS.glob('*.py'))


def load(spec: str) -> ml_collections.ConfigDict:
  """Loads `path/to/preset.py` or a shipped preset's NAME, either optionally followed by `:arg`
  (arg goes to get_config, big_vision style). A file that exists wins over a preset of its name.
  Whatever goes wrong inside the file is one line naming it."""
  path, _, arg = spec.partition(':')
  if not os.path.exists(path) and re.fullmatch(r'\w+', path):
    if path not in presets():
      raise FileNotFoundError(
          f'--config {path}: no such preset or file; presets: {", ".join(presets())}')
    path = str(PRESETS / f'{path}.py')
  if not os.path.exists(path):
    raise FileNotFoundError(f'config file not found: {path}')
  files.check_file(path, '--config')
  name = f'_t5lite_config_{abs(hash(path))}'
  # a Python file whatever its name ends in: a `t5_tiny` of one's own wins over the preset
  module_spec = importlib.util.spec_from_file_location(
      name, path, loader=importlib.machinery.SourceFileLoader(name, path))
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    get_config = getattr(module, 'get_config', None)
    config = None if not callable(get_config) else get_config(arg) if arg else get_config()
  except Exception as error:  # pylint: disable=broad-except  # the user's own code: anything
    raise ValueError(f'--config {spec} failed{_line_in(path, error)}: {type(error).__name__}'
                     f'{": " + str(error).splitlines()[0] if str(error) else ""}') from None
  if not callable(get_config):
    raise ValueError(f'--config {path} has no get_config()')
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'--config {spec}: get_config() returned a {type(config).__name__}, '
                     'not an ml_collections.ConfigDict')
  return config


def _line_in(path: str, error: Exception) -> str:
  """' (line N)' of the config file where `error` arose, if it did there."""
  if isinstance(error, SyntaxError) and error.lineno:
    return f' (line {error.lineno})'
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if os.path.abspath(frame.filename) == os.path.abspath(path)]
  return f' (line {lines[-1]})' if lines else ''


def override(config: ml_collections.ConfigDict, assignments: list[str]) -> None:
  """Applies `--config.a.b=value` flags, parsing each value as the type the field already has."""
  for assignment in assignments:
    key, sep, text = assignment.removeprefix('--').removeprefix('config.').partition('=')
    if not sep:
      raise ValueError(f'expected --config.KEY=VALUE, got {assignment!r}')
    *parents, leaf = key.split('.')
    section = config
    for depth, name in enumerate(parents):
      if parents[:depth] == ['data', 'mixture'] and name not in section:
        section[name] = ml_collections.ConfigDict()  # a new mixture component
      if name not in section or not isinstance(section[name], ml_collections.ConfigDict):
        raise ValueError(f'unknown setting config.{key}')
      section = section[name]
    if parents[:2] == ['data', 'mixture'] and len(parents) == 3 and leaf not in section:
      # a component's setting; one it does not take is refused by mixture.check_components
      section[leaf] = mixture.COMPONENT_SETTINGS.get(leaf, str)()
    if leaf not in section:
      raise ValueError(f'unknown setting config.{key}')
    section[leaf] = _parse_like(section[leaf], text, key)


def _parse_like(current, text: str, key: str):
  """Parses `text` as the type of `current`; strings stay strings, a str field may take a number."""
  if isinstance(current, str):
    return text
  try:
    if isinstance(current, bool):
      if text.lower() not in ('true', 'false', '1', '0'):
        raise ValueError
      return text.lower() in ('true', '1')
    if isinstance(current, int):
      return int(text.replace('_', ''))
    if isinstance(current, float):
      return float(text)
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise ValueError(
        f'config.{key}={text!r} is not a valid {type(current).__name__}') from None


def from_workdir(workdir: str) -> ml_collections.ConfigDict:
  """The config a run saved in `workdir` (its config.json), read with `from_saved`."""
  path = paths.path(workdir) / 'config.json'
  if not path.exists():
    raise FileNotFoundError(f'{workdir} is not a t5lite workdir: no {path}')
  saved = files.read_json(path)
  missing = [name for name in ('model', 'data', 'train') if not isinstance(saved.get(name), dict)]
  if missing:
    raise ValueError(f'{path} is not a saved t5lite config: no {missing[0]} section')
  config = from_saved(saved, str(path))
  recorded = recorded_vocabulary(workdir)
  if recorded is not None and recorded['name'] == vocabulary.BUNDLED_V1:  # made before 2026-12-04
    config.data.vocabulary = vocabulary.BUNDLED_V1
  try:  # what a run saved passed these; a value edited out of range since is the file's fault
    validate(config)
    model_config(config)
  except ValueError as error:
    raise ValueError(f'{path}: {error}') from None
  return config


def recorded_vocabulary(workdir: str) -> dict | None:
  """The vocabulary `workdir` was made with, as its vocabulary.json records it (checked as
  vocabulary.IDENTITY). A workdir made before t5lite recorded it (2026-12-04) whose config names
  'bundled' was made with 'bundled-v1', the bundled model then; of another, None: unknown."""
  path = paths.path(workdir) / vocabulary.RECORD_FILE
  if not path.exists():
    return (vocabulary.load_vocabulary(vocabulary.BUNDLED_V1).identity(vocabulary.BUNDLED_V1)
            if _names_bundled(workdir) else None)
  recorded = files.read_json(path)
  files.check_schema(recorded, vocabulary.IDENTITY, files.named(path))
  return recorded


def _names_bundled(workdir: str) -> bool:
  """Whether `workdir` holds a config.json whose data.vocabulary is 'bundled'."""
  path = paths.path(workdir) / 'config.json'
  if not path.is_file():
    return False
  data = files.read_json(path).get('data')
  return isinstance(data, dict) and data.get('vocabulary') == vocabulary.BUNDLED


def check_workdir_vocabulary(config: ml_collections.ConfigDict, workdir: str,
                             flag: str = '--workdir') -> None:
  """Refuses, in one line naming both digests, config.data.vocabulary where `workdir` (given as
  `flag`) was made with another vocabulary, under the same name or not: its ids would mean other
  pieces. A workdir made before the record with another than the bundled one is not checked."""
  recorded = recorded_vocabulary(workdir)
  if recorded is not None:
    vocabulary.load_vocabulary(config.data.vocabulary).check_same(
        recorded, f'data.vocabulary={config.data.vocabulary!r}', f'{flag} {workdir}')


def from_saved(saved: dict, where: str = 'the saved config') -> ml_collections.ConfigDict:
  """A run's saved config (its workdir's config.json, named `where` in messages) over today's
  `base_config()`, so that settings added to t5lite since the run was saved take their defaults.
  A known setting of another type than today's (null, "64" for 64) is refused in one line;
  unknown ones are kept for `model_config` to name."""
  def merge(section: ml_collections.ConfigDict, values: dict, prefix: str) -> None:
    for key, value in values.items():
      current = section.get(key)
      if isinstance(current, ml_collections.ConfigDict):
        files.check_type(value, dict, f'{where}: {prefix}{key}')
        merge(current, value, f'{prefix}{key}.')
        continue
      if key in section:
        files.check_type(value, type(current), f'{where}: {prefix}{key}')
      section[key] = value
  config = base_config()
  merge(config, saved, '')
  if config.model.arch == 'electra' and config.data.objective == 'mlm':  # saved before 2026-11
    config.data.objective = 'electra'
  return config
