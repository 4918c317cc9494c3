"""The mistakes a new user makes, through the real `t5lite` command: exit status 2, one line on
stderr that names the culprit (the flag, setting or file the user gave), and the file system
exactly as it was (issue #14).

Each row of MISTAKES is (id, argv, culprit, watched folder). The argv is built in the case's own
folder from copies of one tiny trained workdir, its Hugging Face export and a fine-tuning run
from it, made once per module. Before and after the command, the watched folder and the whole case
folder are hashed (every file's path and SHA-256, and every folder): a refused command changes
nothing, and creates no workdir or output where none existed. Most rows run in this process
through `cli.main` (stderr captured at the file descriptor); a few also run as real processes,
which shows that nothing else reaches stderr (TensorFlow's oneDNN banner, absl warnings) and that
the process exits 2. The faults (a disk that fills during a save, resuming at or below the saved
step) are tests of their own at the end.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import types
from typing import Callable, NamedTuple

import jax
import numpy as np
import pytest

from t5lite import cli
from t5lite.data import vocabulary
from t5lite.train import run as run_lib
from tests.fs import changes, snapshot
from tests.texts import keyword_task, random_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, 'configs')
# tests/train/test_loop.py's SMALL: any T5 config shrunk to seconds per run (1+1 layers of width
# 64, 32 input / 8 target tokens, batch 8 over the 8 fake devices), one step. Every case whose
# config is not the trained run's carries it, so that a mistake that is not caught trains a tiny
# model for a step instead of a big one for long.
TINY_SHAPE = ['--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
              '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
              '--config.model.num_decoder_layers=1', '--config.data.batch_size=8',
              '--config.data.inputs_length=32', '--config.data.targets_length=8',
              '--config.train.steps=1', '--config.train.log_every=1',
              '--config.train.eval_every=0', '--config.checkpoint.async_save=false']
TINY_RUN = [f'--config={CONFIGS}/t5_tiny.py', *TINY_SHAPE]
# The same shrinking for gpt2_small, a decoder-only causal LM.
TINY_GPT = [f'--config={CONFIGS}/gpt2_small.py', '--config.model.vocab_size=8192',
            '--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
            '--config.model.d_kv=32', '--config.model.max_length=64',
            '--config.model.num_decoder_layers=1', '--config.data.batch_size=8',
            '--config.train.steps=1', '--config.train.eval_every=0',
            '--config.checkpoint.async_save=false', '--config.optim.schedule=constant']
# A fine-tuning run kept to one step and no evaluation, were it (wrongly) to start.
TINY_FINETUNE = ['--config.train.steps=1', '--config.train.eval_every=0',
                 '--config.checkpoint.async_save=false']

GOOD_CONFIG = ('from t5lite import config as t5config\n\n\n'
               'def get_config():\n  return t5config.base_config()\n')
BAD_CONFIGS = {
    'syntax_error.py': 'def get_config(:\n  return None\n',
    'raises.py': 'def get_config():\n  raise KeyError("model")\n',
    'import_error.py': 'import t5lite.no_such_module\n\n\ndef get_config():\n  return None\n',
    'no_get_config.py': ('from t5lite import config as t5config\n\n'
                         'CONFIG = t5config.base_config()\n'),
    'takes_no_arg.py': GOOD_CONFIG,  # given as takes_no_arg.py:small
    'needs_arg.py': ('from t5lite import config as t5config\n\n\n'
                     'def get_config(size):\n  return t5config.base_config()\n'),
    'returns_dict.py': 'def get_config():\n  return {"train": {"steps": 10}}\n',
}


def truncate_arrays(directory) -> None:
  """Cuts every array data file under `directory` (OCDBT's d/ files) to half its size: a damaged
  checkpoint whichever arrays a command reads (the parameters alone, or all)."""
  files = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names
           if os.path.basename(root) == 'd']
  assert files, f'no array data under {directory}'
  for path in files:
    os.truncate(path, os.path.getsize(path) // 2)


class World(NamedTuple):
  """What the module makes once: a corpus, a task, a trained run, its export, a fine-tune."""
  text: str  # write_corpus
  task: str  # write_task
  run: str  # 2 steps of TINY_RUN on `text`, checkpoints 1 and 2
  hf: str  # `run` exported to Hugging Face
  ft: str  # 1 step of fine-tuning `run` on `task`, checkpoint 1; no evaluation, so no best/


@pytest.fixture(scope='module')
def world(tmp_path_factory) -> World:
  base = tmp_path_factory.mktemp('world')
  text, task = random_corpus(base / 'text.txt'), keyword_task(base / 'task.tsv', 200)
  run, hf, ft = str(base / 'run'), str(base / 'hf'), str(base / 'ft')
  assert cli.main(['train', f'--workdir={run}', *TINY_RUN, '--config.train.steps=2',
                   '--config.checkpoint.every_steps=1', f'--config.data.source={text}']) == 0
  assert sorted(os.listdir(os.path.join(run, 'checkpoints'))) == ['1', '2']
  assert cli.main(['export', f'--workdir={run}', f'--out={hf}']) == 0
  assert cli.main(['finetune', f'--workdir={ft}', f'--from={run}', f'--task={task}',
                   *TINY_FINETUNE]) == 0
  return World(text, task, run, hf, ft)


class Setup:
  """One case's folder and what its command names, made on demand in it: copies of the module's
  runs, files of given contents, damaged copies."""

  def __init__(self, folder, world: World):
    self.folder, self.world = str(folder), world
    self.new = os.path.join(self.folder, 'new')  # a workdir or output that does not exist

  def _copy(self, source: str, name: str) -> str:
    destination = os.path.join(self.folder, name)
    shutil.copytree(source, destination)
    return destination

  @functools.cached_property
  def run(self) -> str:
    """A copy of the trained run (checkpoints 1 and 2)."""
    return self._copy(self.world.run, 'run')

  @functools.cached_property
  def ft(self) -> str:
    """A copy of the fine-tuning run (from world.run, on world.task)."""
    return self._copy(self.world.ft, 'ft')

  @functools.cached_property
  def hf(self) -> str:
    """A copy of the run's Hugging Face export."""
    return self._copy(self.world.hf, 'hf')

  def path(self, name: str) -> str:
    """`name` in the case folder, not created."""
    return os.path.join(self.folder, name)

  def file(self, name: str, content: str | bytes = '') -> str:
    """`name` in the case folder, holding `content` (text as UTF-8)."""
    path = self.path(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(content.encode() if isinstance(content, str) else content)
    return path

  def folder_with(self, name: str, files: dict[str, str] | None = None) -> str:
    """A folder holding `files` (an empty folder without)."""
    path = self.path(name)
    os.makedirs(path)
    for file_name, content in (files or {}).items():
      self.file(os.path.join(name, file_name), content)
    return path

  def overwrite(self, folder: str, name: str, content: str) -> str:
    """`folder` with its file `name` replaced by `content` (a user's edit gone wrong)."""
    with open(os.path.join(folder, name), 'w', encoding='utf-8') as f:
      f.write(content)
    return folder

  def append(self, folder: str, name: str, content: str) -> str:
    """`folder` with `content` added at the end of its file `name`."""
    with open(os.path.join(folder, name), 'a', encoding='utf-8') as f:
      f.write(content)
    return folder

  def replace_with_file(self, folder: str, name: str) -> str:
    """`folder` with its subfolder `name` replaced by a file of that name."""
    shutil.rmtree(os.path.join(folder, name))
    return self.overwrite(folder, name, 'notes')

  def edit_json(self, folder: str, name: str, keys: tuple[str, ...], value) -> str:
    """`folder` with the value at `keys` in its JSON file `name` set to `value`."""
    with open(os.path.join(folder, name), encoding='utf-8') as f:
      saved = json.load(f)
    functools.reduce(lambda node, key: node[key], keys[:-1], saved)[keys[-1]] = value
    return self.overwrite(folder, name, json.dumps(saved))

  def config_file(self, name: str) -> str:
    return self.file(name, BAD_CONFIGS[name])

  def damaged_run(self) -> str:
    """The run's copy with its latest checkpoint (step 2) cut short."""
    truncate_arrays(os.path.join(self.run, 'checkpoints', '2', 'state'))
    return self.run

  def truncated_hf(self) -> str:
    """The export's copy with model.safetensors cut to half."""
    path = os.path.join(self.hf, 'model.safetensors')
    os.truncate(path, os.path.getsize(path) // 2)
    return self.hf

  def train_new(self, *flags: str) -> list[str]:
    """`t5lite train` of TINY_RUN on the corpus into a new workdir, `flags` last."""
    return ['train', f'--workdir={self.new}', *TINY_RUN,
            f'--config.data.source={self.world.text}', *flags]

  def with_config(self, config: str, *flags: str) -> list[str]:
    """`t5lite train` into a new workdir from the preset file `config`, shrunk."""
    return ['train', f'--workdir={self.new}', f'--config={config}', *TINY_SHAPE,
            f'--config.data.source={self.world.text}', *flags]

  def resume(self, *flags: str) -> list[str]:
    """`t5lite train` of the run's copy, with its saved config, on to step 4."""
    return ['train', f'--workdir={self.run}', '--config.train.steps=4', *flags]

  def data(self, *flags: str) -> list[str]:
    """`t5lite data` of TINY_RUN's data on the corpus."""
    return ['data', f'--config={CONFIGS}/t5_tiny.py', '--config.data.batch_size=8',
            '--config.data.inputs_length=32', '--config.data.targets_length=8',
            f'--config.data.source={self.world.text}', *flags]

  def infer(self, *flags: str) -> list[str]:
    """`t5lite infer` of the run's copy on one input, `flags` last."""
    return ['infer', f'--workdir={self.run}', '--input=the sea', *flags]

  def finetune(self, workdir: str, *flags: str) -> list[str]:
    return ['finetune', f'--workdir={workdir}', *TINY_FINETUNE, *flags]


class Case(NamedTuple):
  id: str
  argv: Callable[[Setup], list[str]]
  # What the line must name: a substring, or one of several (a tuple); or a function of the Setup
  # returning either (a path it made).
  culprit: str | tuple[str, ...] | Callable[[Setup], str | tuple[str, ...]]
  # The folder that must not change: 'run', 'ft', 'hf' (Setup's copies), 'case' (the case folder
  # only) or 'new' (Setup.new, which must not come to exist). The whole case folder is always
  # checked as well.
  watch: str


def mistakes() -> list[Case]:
  return [
      # train: settings of a new run ('new': no workdir may appear).
      Case('train-unknown-setting', lambda s: s.train_new('--config.train.stepz=5'),
           'train.stepz', 'new'),
      Case('train-unknown-section', lambda s: s.train_new('--config.optimizer.learning_rate=0.1'),
           'optimizer', 'new'),
      Case('train-steps-not-an-int', lambda s: s.train_new('--config.train.steps=1k'),
           'train.steps', 'new'),
      Case('train-batch-size-not-an-int', lambda s: s.train_new('--config.data.batch_size=8.5'),
           'data.batch_size', 'new'),
      Case('train-learning-rate-decimal-comma',
           lambda s: s.train_new('--config.optim.learning_rate=0,01'), 'optim.learning_rate',
           'new'),
      Case('train-override-without-value', lambda s: s.train_new('--config.train.steps'),
           'config.train.steps', 'new'),
      Case('train-stray-flag', lambda s: s.train_new('--steps=5'), '--steps', 'new'),
      Case('train-steps-zero', lambda s: s.train_new('--config.train.steps=0'), 'train.steps',
           'new'),
      Case('train-steps-negative', lambda s: s.train_new('--config.train.steps=-5'),
           'train.steps', 'new'),
      Case('train-log-every-zero', lambda s: s.train_new('--config.train.log_every=0'),
           'train.log_every', 'new'),
      Case('train-eval-every-negative', lambda s: s.train_new('--config.train.eval_every=-100'),
           'train.eval_every', 'new'),
      Case('train-eval-batches-zero',
           lambda s: s.train_new('--config.train.eval_every=1', '--config.train.eval_batches=0'),
           'train.eval_batches', 'new'),
      Case('train-checkpoint-every-zero',
           lambda s: s.train_new('--config.checkpoint.every_steps=0'), 'checkpoint.every_steps',
           'new'),
      Case('train-keep-zero', lambda s: s.train_new('--config.checkpoint.keep=0'),
           'checkpoint.keep', 'new'),
      Case('train-keep-negative', lambda s: s.train_new('--config.checkpoint.keep=-1'),
           'checkpoint.keep', 'new'),
      Case('train-keep-period-negative',
           lambda s: s.train_new('--config.checkpoint.keep_period=-10'),
           'checkpoint.keep_period', 'new'),
      Case('train-batch-size-zero', lambda s: s.train_new('--config.data.batch_size=0'),
           'data.batch_size', 'new'),
      Case('train-batch-size-not-divisible-by-devices',
           lambda s: s.train_new('--config.data.batch_size=12'), 'data.batch_size', 'new'),
      Case('train-microbatches-zero', lambda s: s.train_new('--config.train.microbatches=0'),
           'train.microbatches', 'new'),
      Case('train-mesh-larger-than-devices', lambda s: s.train_new('--config.mesh.data=16'),
           'mesh.data', 'new'),
      Case('train-learning-rate-negative',
           lambda s: s.train_new('--config.optim.learning_rate=-0.01'), 'optim.learning_rate',
           'new'),
      Case('train-validation-fraction-above-one',
           lambda s: s.train_new('--config.data.validation_fraction=1.5'),
           'data.validation_fraction', 'new'),
      Case('train-eval-on-without-validation-split',
           lambda s: s.train_new('--config.train.eval_every=1',
                                 '--config.data.validation_fraction=0'),
           'data.validation_fraction', 'new'),
      Case('train-activation-unknown', lambda s: s.train_new('--config.model.activation=swiglu'),
           'model.activation', 'new'),
      Case('train-objective-unknown', lambda s: s.train_new('--config.data.objective=gpt'),
           'data.objective', 'new'),
      Case('train-span-corruption-targets-too-short',
           lambda s: s.train_new('--config.data.targets_length=1'), 'data.targets_length', 'new'),
      Case('train-causal-lm-targets-length-zero',
           lambda s: ['train', f'--workdir={s.new}', *TINY_GPT,
                      f'--config.data.source={s.world.text}', '--config.data.targets_length=0'],
           'data.targets_length', 'new'),
      Case('train-inputs-length-zero', lambda s: s.train_new('--config.data.inputs_length=0'),
           'data.inputs_length', 'new'),
      Case('train-noise-density-above-one',
           lambda s: s.train_new('--config.data.noise_density=1.5'),
           'data.noise_density', 'new'),
      Case('train-mesh-tensor-zero', lambda s: s.train_new('--config.mesh.tensor=0'),
           'mesh.tensor', 'new'),
      Case('train-mesh-rule-names-no-axis',
           lambda s: s.train_new('--config.mesh.rules.mlp=model'), 'mesh.rules.mlp', 'new'),
      Case('train-mesh-dcn-axis-on-one-slice',
           lambda s: s.train_new('--config.mesh.dcn_data=2'), 'mesh.dcn_data', 'new'),
      Case('train-mesh-dcn-fsdp-zero', lambda s: s.train_new('--config.mesh.dcn_fsdp=0'),
           'mesh.dcn_fsdp', 'new'),
      Case('train-mesh-tensor-over-dcn', lambda s: s.train_new('--config.mesh.dcn_tensor=2'),
           'mesh.dcn_tensor', 'new'),
      # sparse experts (TINY_SHAPE has one layer a stack: sparse with sparse_step 1)
      Case('train-experts-not-divisible-by-the-expert-axis',
           lambda s: s.train_new('--config.model.num_experts=6', '--config.mesh.expert=4',
                                 '--config.mesh.data=2', '--config.model.encoder_sparse_step=1'),
           'model.num_experts=6 is not divisible by mesh.expert=4', 'new'),
      Case('train-expert-top-k-above-the-experts',
           lambda s: s.train_new('--config.model.num_experts=4', '--config.model.expert_top_k=5',
                                 '--config.model.encoder_sparse_step=1'),
           'model.expert_top_k=5', 'new'),
      Case('train-capacity-factor-zero',
           lambda s: s.train_new('--config.model.num_experts=4',
                                 '--config.model.train_capacity_factor=0',
                                 '--config.model.encoder_sparse_step=1'),
           'model.train_capacity_factor', 'new'),
      Case('train-expert-axis-without-experts', lambda s: s.train_new('--config.mesh.expert=2'),
           'mesh.expert=2', 'new'),
      Case('train-experts-without-a-sparse-layer',
           lambda s: s.train_new('--config.model.num_experts=4', '--config.mesh.expert=2'),
           'model.num_experts=4 but no layer is sparse', 'new'),
      Case('train-upcycle-a-model-of-another-shape',
           lambda s: s.train_new('--config.model.num_experts=4', '--config.model.d_ff=96',
                                 '--config.model.encoder_sparse_step=1',
                                 f'--config.train.upcycle_workdir={s.run}'),
           'train.upcycle_workdir', 'new'),
      Case('train-upcycle-without-experts',
           lambda s: s.train_new(f'--config.train.upcycle_workdir={s.run}'),
           'set model.num_experts', 'new'),
      Case('train-mesh-rule-over-a-dcn-axis',
           lambda s: s.train_new('--config.mesh.rules.heads=dcn_data'), 'mesh.rules.heads', 'new'),
      Case('train-with-a-fine-tuning-task',
           lambda s: s.train_new('--config.data.task=sentiment'), 'data.task', 'new'),
      Case('train-vocab-size-smaller-than-vocabulary',
           lambda s: s.train_new('--config.model.vocab_size=4096'), 'model.vocab_size', 'new'),
      Case('train-byte-vocabulary-past-the-model',
           lambda s: s.train_new('--config.data.vocabulary=bytes', '--config.model.vocab_size=256'),
           ('model.vocab_size=256', "data.vocabulary='bytes'"), 'new'),
      Case('train-byt5-with-a-sentencepiece-vocabulary',
           lambda s: s.with_config(f'{CONFIGS}/byt5_small.py', '--config.data.vocabulary=bundled'),
           'model.vocab_size=384', 'new'),
      Case('train-byte-spans-past-the-sentinels',
           lambda s: s.train_new('--config.data.vocabulary=bytes', '--config.model.vocab_size=384',
                                 '--config.data.inputs_length=1024',
                                 '--config.data.targets_length=400',
                                 '--config.data.mean_noise_span_length=1'),
           'data.mean_noise_span_length', 'new'),
      Case('train-num-processes-huge',  # JAX's C++ int
           lambda s: s.train_new('--coordinator_address=localhost:1', '--process_id=0',
                                 '--num_processes=3000000000'), '--num_processes', 'new'),
      # train: what the run reads.
      Case('train-source-missing',
           lambda s: s.train_new(f'--config.data.source={s.path("corpus.txt")}'),
           lambda s: s.path('corpus.txt'), 'new'),
      Case('train-source-glob-matches-nothing',
           lambda s: s.train_new(f'--config.data.source={s.path("shards")}/*.jsonl'),
           lambda s: f'{s.path("shards")}/*.jsonl', 'new'),
      Case('train-source-is-a-folder',
           lambda s: s.train_new(f'--config.data.source={s.folder_with("corpus.txt")}'),
           lambda s: s.path('corpus.txt'), 'new'),
      Case('train-source-not-txt-or-jsonl',
           lambda s: s.train_new('--config.data.source=' + s.file('corpus.csv', 'a,b\n1,2\n')),
           lambda s: s.path('corpus.csv'), 'new'),
      Case('train-source-empty-file',
           lambda s: s.train_new(f'--config.data.source={s.file("empty.txt")}'),
           lambda s: s.path('empty.txt'), 'new'),
      Case('train-source-jsonl-without-text-key',
           lambda s: s.train_new('--config.data.source=' + s.file(
               'docs.jsonl', '{"content": "the sea and the ship"}\n' * 50)),
           lambda s: (s.path('docs.jsonl'), 'data.text_key'), 'new'),
      Case('train-source-not-utf8',
           lambda s: s.train_new('--config.data.source=' + s.file(
               'latin1.txt', 'caf\xe9 cr\xe8me br\xfbl\xe9e\n\n'.encode('latin-1') * 40)),
           lambda s: s.path('latin1.txt'), 'new'),
      Case('train-vocabulary-missing',
           lambda s: s.train_new(f'--config.data.vocabulary={s.path("spm/vocab.model")}'),
           lambda s: s.path('spm/vocab.model'), 'new'),
      Case('train-vocabulary-not-sentencepiece',
           lambda s: s.train_new('--config.data.vocabulary=' + s.file(
               'vocab.model', 'the\nsea\nship\n')),
           lambda s: s.path('vocab.model'), 'new'),
      Case('train-vocabulary-cut-short',
           lambda s: s.train_new('--config.data.vocabulary=' + s.file(
               'vocab.model', vocabulary.load_vocabulary().model_proto[:50_000])),
           lambda s: f'data.vocabulary: {s.path("vocab.model")} is not a SentencePiece model '
                     '(cut short', 'new'),
      Case('train-teacher-workdir-missing',
           lambda s: s.train_new(f'--config.train.teacher_workdir={s.path("teacher")}'),
           lambda s: s.path('teacher'), 'new'),
      Case('train-distill-preset-teacher-missing',
           lambda s: s.train_new(f'--config={CONFIGS}/t5_tiny_distill.py:{s.path("teacher")}'),
           lambda s: s.path('teacher'), 'new'),
      Case('train-workdir-is-a-file',
           lambda s: ['train', f'--workdir={s.file("run.txt", "notes")}', *TINY_RUN,
                      f'--config.data.source={s.world.text}'],
           lambda s: s.path('run.txt'), 'case'),
      Case('train-workdir-is-a-hugging-face-export',
           lambda s: ['train', f'--workdir={s.hf}', *TINY_SHAPE,
                      f'--config.data.source={s.world.text}'],
           lambda s: s.hf, 'hf'),
      Case('train-workdir-inside-a-workdir',
           lambda s: ['train', f'--workdir={s.run}/checkpoints', *TINY_RUN,
                      f'--config.data.source={s.world.text}'],
           'is inside the workdir', 'run'),
      Case('train-new-workdir-without-config',
           lambda s: ['train', f'--workdir={s.new}', *TINY_SHAPE,
                      f'--config.data.source={s.world.text}'],
           lambda s: (s.new, '--config'), 'new'),
      # Config files that cannot give a config.
      Case('config-file-missing', lambda s: s.with_config(s.path('t5_tny.py')),
           lambda s: s.path('t5_tny.py'), 'new'),
      Case('config-file-syntax-error', lambda s: s.with_config(s.config_file('syntax_error.py')),
           lambda s: s.path('syntax_error.py'), 'new'),
      Case('config-file-raises', lambda s: s.with_config(s.config_file('raises.py')),
           lambda s: s.path('raises.py'), 'new'),
      Case('config-file-import-error', lambda s: s.with_config(s.config_file('import_error.py')),
           lambda s: s.path('import_error.py'), 'new'),
      Case('config-file-without-get-config',
           lambda s: s.with_config(s.config_file('no_get_config.py')),
           lambda s: s.path('no_get_config.py'), 'new'),
      Case('config-file-takes-no-arg-given-one',
           lambda s: s.with_config(s.config_file('takes_no_arg.py') + ':small'),
           lambda s: s.path('takes_no_arg.py'), 'new'),
      Case('config-file-needs-an-arg', lambda s: s.with_config(s.config_file('needs_arg.py')),
           lambda s: s.path('needs_arg.py'), 'new'),
      Case('config-file-returns-a-dict',
           lambda s: s.with_config(s.config_file('returns_dict.py')),
           lambda s: s.path('returns_dict.py'), 'new'),
      # train: resuming an existing run (its copy must not change, config.json included).
      Case('train-resume-unknown-setting',
           lambda s: s.resume('--config.checkpoint.keep_last=1'), 'checkpoint.keep_last', 'run'),
      Case('train-resume-keep-zero', lambda s: s.resume('--config.checkpoint.keep=0'),
           'checkpoint.keep', 'run'),
      Case('train-resume-keep-period-negative',
           lambda s: s.resume('--config.checkpoint.keep_period=-1'), 'checkpoint.keep_period',
           'run'),
      Case('train-resume-checkpoint-every-zero',
           lambda s: s.resume('--config.checkpoint.every_steps=0'), 'checkpoint.every_steps',
           'run'),
      Case('train-resume-batch-size-zero', lambda s: s.resume('--config.data.batch_size=0'),
           'data.batch_size', 'run'),
      Case('train-resume-misspelt-source',
           lambda s: s.resume(f'--config.data.source={s.path("txet.txt")}'),
           lambda s: s.path('txet.txt'), 'run'),
      Case('train-resume-another-model', lambda s: s.resume('--config.model.d_ff=256'), 'd_ff',
           'run'),
      Case('train-resume-damaged-checkpoint',
           lambda s: ['train', f'--workdir={s.damaged_run()}', '--config.train.steps=4'],
           lambda s: f'{s.run}/checkpoints/2', 'run'),
      Case('train-resume-config-json-not-json',
           lambda s: ['train', '--workdir=' + s.overwrite(s.run, 'config.json', '{"model": {'),
                      '--config.train.steps=4'],
           'config.json', 'run'),
      # a workdir's files, damaged (issue #29; tests/test_damaged_files.py fuzzes them)
      Case('train-resume-config-json-null',
           lambda s: ['train', '--workdir=' + s.edit_json(s.run, 'config.json', ('train', 'steps'),
                                                          None), '--config.train.steps=4'],
           lambda s: f'{s.run}/config.json', 'run'),
      Case('train-resume-metrics-row-without-step',
           lambda s: ['train', '--workdir=' + s.append(s.run, 'metrics.jsonl', '{"loss": 1.0}\n'),
                      '--config.train.steps=4'],
           lambda s: f'{s.run}/metrics.jsonl:', 'run'),
      Case('train-resume-checkpoints-a-file',
           lambda s: ['train', '--workdir=' + s.replace_with_file(s.run, 'checkpoints'),
                      '--config.train.steps=4'],
           lambda s: f'{s.run}/checkpoints', 'run'),
      Case('train-workdir-name-too-long',
           lambda s: ['train', f'--workdir={s.new}/{"w" * 256}', *TINY_RUN,
                      f'--config.data.source={s.world.text}'], '--workdir', 'new'),
      Case('import-hf-config-json-d-model-null',
           lambda s: ['import-hf', '--hf=' + s.edit_json(s.hf, 'config.json', ('d_model',), None),
                      f'--workdir={s.new}'],
           lambda s: f'{s.hf}/config.json', 'new'),
      # eval
      Case('eval-not-a-workdir', lambda s: ['eval', f'--workdir={s.folder_with("runs")}'],
           lambda s: s.path('runs'), 'case'),
      Case('eval-workdir-missing', lambda s: ['eval', f'--workdir={s.new}'],
           lambda s: s.new, 'new'),
      Case('eval-workdir-is-a-hugging-face-export', lambda s: ['eval', f'--workdir={s.hf}'],
           lambda s: s.hf, 'hf'),
      Case('eval-finetune-best-not-made-yet', lambda s: ['eval', f'--workdir={s.ft}/best'],
           lambda s: f'{s.ft}/best', 'ft'),
      Case('eval-num-batches-zero', lambda s: ['eval', f'--workdir={s.run}', '--num_batches=0'],
           'num_batches', 'run'),
      Case('eval-num-batches-negative',
           lambda s: ['eval', f'--workdir={s.run}', '--num_batches=-3'], 'num_batches', 'run'),
      Case('eval-num-batches-not-a-number',
           lambda s: ['eval', f'--workdir={s.run}', '--num_batches=all'], 'num_batches', 'run'),
      Case('eval-data-missing',
           lambda s: ['eval', f'--workdir={s.run}', f'--data={s.path("held_out.jsonl")}'],
           lambda s: s.path('held_out.jsonl'), 'run'),
      Case('eval-data-not-txt-or-jsonl',
           lambda s: ['eval', f'--workdir={s.run}', '--data=' + s.file('held_out.csv', 'a,b\n')],
           lambda s: s.path('held_out.csv'), 'run'),
      Case('eval-unknown-setting',
           lambda s: ['eval', f'--workdir={s.run}', '--config.train.eval_batchez=2'],
           'train.eval_batchez', 'run'),
      Case('eval-with-an-expert-axis-and-no-experts',
           lambda s: ['eval', f'--workdir={s.run}', '--config.mesh.expert=2'], 'mesh.expert=2',
           'run'),
      Case('eval-without-validation-split',
           lambda s: ['eval', f'--workdir={s.run}', '--config.data.validation_fraction=0'],
           'data.validation_fraction', 'run'),
      Case('eval-damaged-checkpoint', lambda s: ['eval', f'--workdir={s.damaged_run()}'],
           lambda s: f'{s.run}/checkpoints/2', 'run'),
      Case('eval-bad-config-file',
           lambda s: ['eval', f'--workdir={s.run}', f'--config={s.config_file("raises.py")}'],
           lambda s: s.path('raises.py'), 'run'),
      # data
      Case('data-without-config', lambda _: ['data', '--num_batches=1', '--show=1'], '--config',
           'case'),
      Case('data-num-batches-zero',
           lambda s: s.data('--num_batches=0', f'--out={s.path("batches.npz")}'), 'num_batches',
           'case'),
      Case('data-num-batches-negative',
           lambda s: s.data('--num_batches=-1', f'--out={s.path("batches.npz")}'), 'num_batches',
           'case'),
      Case('data-show-negative', lambda s: s.data('--show=-2'), '--show', 'case'),
      # nothing to do: it read no source, so a missing one passed (exit 0)
      Case('data-nothing-to-do', lambda s: s.data(), '--show=K, --out=FILE or --verify=STORE', 'case'),
      Case('data-show-zero-of-a-missing-source',
           lambda s: s.data('--show=0', f'--config.data.source={s.path("corpus.txt")}'),
           '--show=K, --out=FILE or --verify=STORE', 'case'),
      Case('data-out-is-a-folder',
           lambda s: s.data('--num_batches=1',
                            f'--out={s.folder_with("batches", {"notes.txt": "mine"})}'),
           lambda s: s.path('batches'), 'case'),
      Case('data-out-is-a-file-of-another-kind',
           lambda s: s.data('--num_batches=1', f'--out={s.file("notes.txt", "mine")}'),
           lambda s: s.path('notes.txt'), 'case'),
      Case('data-out-inside-a-workdir',
           lambda s: s.data('--num_batches=1', f'--out={s.run}/batches.npz'),
           lambda s: f'{s.run}/batches.npz', 'run'),
      Case('data-source-missing',
           lambda s: s.data('--show=1', f'--config.data.source={s.path("corpus.txt")}'),
           lambda s: s.path('corpus.txt'), 'case'),
      Case('data-bad-config-file',
           lambda s: ['data', f'--config={s.config_file("returns_dict.py")}', '--show=1'],
           lambda s: s.path('returns_dict.py'), 'case'),
      # export
      Case('export-out-is-the-workdir',
           lambda s: ['export', f'--workdir={s.run}', f'--out={s.run}'], lambda s: s.run, 'run'),
      Case('export-out-inside-the-workdir',
           lambda s: ['export', f'--workdir={s.run}', f'--out={s.run}/hf'],
           lambda s: f'{s.run}/hf', 'run'),
      Case('export-out-is-a-file',
           lambda s: ['export', f'--workdir={s.run}', f'--out={s.file("hf.txt", "mine")}'],
           lambda s: s.path('hf.txt'), 'case'),
      Case('export-out-is-a-foreign-folder',
           lambda s: ['export', f'--workdir={s.run}',
                      f'--out={s.folder_with("mine", {"thesis.tex": "chapter 1"})}'],
           lambda s: s.path('mine'), 'case'),
      Case('export-out-holds-the-workdir',
           lambda s: ['export', f'--workdir={s.run}', f'--out={s.folder}'],
           lambda s: s.folder, 'run'),
      Case('export-without-out', lambda s: ['export', f'--workdir={s.run}'], '--out', 'run'),
      Case('export-step-missing',
           lambda s: ['export', f'--workdir={s.run}', '--step=7', f'--out={s.new}'],
           ('--step=7', 'step 7'), 'new'),
      Case('export-not-a-workdir',
           lambda s: ['export', f'--workdir={s.folder_with("runs")}', f'--out={s.new}'],
           lambda s: s.path('runs'), 'new'),
      Case('export-damaged-checkpoint',
           lambda s: ['export', f'--workdir={s.damaged_run()}', f'--out={s.new}'],
           lambda s: f'{s.run}/checkpoints/2', 'new'),
      # a run trained with cuDNN attention on a GPU, exported here (the line names the fix)
      Case('export-cudnn-run-on-this-cpu',
           lambda s: ['export', '--workdir=' + s.edit_json(s.run, 'config.json',
                                                           ('model', 'attention'), 'cudnn'),
                      f'--out={s.new}'],
           '--config.model.attention=xla', 'new'),
      # infer
      Case('infer-max-decode-length-zero',
           lambda s: s.infer('--max_decode_length=0'), 'max_decode_length', 'run'),
      Case('infer-max-decode-length-negative',
           lambda s: s.infer('--max_decode_length=-4'), 'max_decode_length', 'run'),
      Case('infer-nothing-to-decode', lambda s: ['infer', f'--workdir={s.run}'], '--input', 'run'),
      Case('infer-input-empty', lambda s: ['infer', f'--workdir={s.run}', '--input='], '--input',
           'run'),
      Case('infer-input-file-missing',
           lambda s: ['infer', f'--workdir={s.run}', f'--input_file={s.path("prompts.txt")}'],
           lambda s: s.path('prompts.txt'), 'run'),
      Case('infer-input-file-without-key',
           lambda s: ['infer', f'--workdir={s.run}', '--input_file=' + s.file(
               'prompts.jsonl', '{"text": "the sea"}\n')],
           lambda s: s.path('prompts.jsonl'), 'run'),
      Case('infer-input-file-is-a-folder',
           lambda s: ['infer', f'--workdir={s.run}', f'--input_file={s.folder_with("prompts")}'],
           lambda s: s.path('prompts'), 'run'),
      Case('infer-step-negative',
           lambda s: s.infer('--step=-1'), ('--step=-1', 'step -1'), 'run'),
      Case('infer-not-a-workdir',
           lambda s: ['infer', f'--workdir={s.folder_with("runs")}', '--input=the sea'],
           lambda s: s.path('runs'), 'case'),
      Case('infer-damaged-checkpoint',
           lambda s: ['infer', f'--workdir={s.damaged_run()}', '--input=the sea'],
           lambda s: f'{s.run}/checkpoints/2', 'run'),
      Case('infer-step-missing',
           lambda s: s.infer('--step=9'), ('--step=9', 'step 9'), 'run'),
      Case('infer-out-is-the-workdir',
           lambda s: s.infer(f'--out={s.run}'), lambda s: s.run, 'run'),
      Case('infer-out-inside-the-workdir',
           lambda s: s.infer(f'--out={s.run}/decoded.jsonl'),
           lambda s: f'{s.run}/decoded.jsonl', 'run'),
      Case('infer-out-is-a-folder',
           lambda s: s.infer(f'--out={s.folder_with("decoded", {"notes.txt": "mine"})}'),
           lambda s: s.path('decoded'), 'case'),
      Case('infer-temperature-zero',
           lambda s: s.infer('--method=sample', '--temperature=0'), 'temperature', 'run'),
      Case('infer-beam-size-zero',
           lambda s: s.infer('--method=beam', '--beam_size=0'), 'beam_size', 'run'),
      # counts past what takes them: a jitted int32, JAX's int64 seed, an XLA shape that overflows
      Case('infer-max-decode-length-huge',
           lambda s: s.infer('--max_decode_length=3000000000'), '--max_decode_length', 'run'),
      Case('infer-beam-size-huge',
           lambda s: s.infer('--method=beam', '--beam_size=3000000000'), '--beam_size', 'run'),
      Case('infer-top-k-huge',
           lambda s: s.infer('--method=sample', '--top_k=3000000000'), '--top_k', 'run'),
      Case('infer-seed-huge',
           lambda s: s.infer('--method=sample', f'--seed={10**20}'), '--seed', 'run'),
      Case('infer-unknown-method',
           lambda s: s.infer('--method=topk'), '--method', 'run'),
      # import-hf
      Case('import-hf-truncated-safetensors',
           lambda s: ['import-hf', f'--hf={s.truncated_hf()}', f'--workdir={s.new}'],
           'model.safetensors', 'new'),
      Case('import-hf-folder-missing',
           lambda s: ['import-hf', f'--hf={s.path("t5-small")}', f'--workdir={s.new}'],
           lambda s: s.path('t5-small'), 'new'),
      Case('import-hf-given-a-t5lite-workdir',
           lambda s: ['import-hf', f'--hf={s.run}', f'--workdir={s.new}'],
           lambda s: s.run, 'new'),
      Case('import-hf-config-json-not-json',
           lambda s: ['import-hf', '--hf=' + s.overwrite(s.hf, 'config.json', '{"d_model": 64,'),
                      f'--workdir={s.new}'],
           'config.json', 'new'),
      Case('import-hf-into-a-trained-run',
           lambda s: ['import-hf', f'--hf={s.hf}', f'--workdir={s.run}'], lambda s: s.run, 'run'),
      Case('import-hf-switch-router-with-a-bias',
           lambda s: ['import-hf', '--hf=' + functools.reduce(
               lambda folder, item: s.edit_json(folder, 'config.json', (item[0],), item[1]),
               dict(model_type='switch_transformers', num_experts=4, router_bias=True).items(),
               s.hf), f'--workdir={s.new}'],
           'router_bias=True', 'new'),
      Case('import-hf-workdir-is-a-file',
           lambda s: ['import-hf', f'--hf={s.hf}', f'--workdir={s.file("run.txt", "notes")}'],
           lambda s: s.path('run.txt'), 'hf'),
      Case('import-hf-unknown-setting',
           lambda s: ['import-hf', f'--hf={s.hf}', f'--workdir={s.new}',
                      '--config.train.stepz=10'], 'train.stepz', 'new'),
      Case('import-hf-override-reshapes-the-model',
           lambda s: ['import-hf', f'--hf={s.hf}', f'--workdir={s.new}',
                      '--config.model.d_ff=96'], 'd_ff', 'new'),
      Case('import-hf-keep-zero',
           lambda s: ['import-hf', f'--hf={s.hf}', f'--workdir={s.new}',
                      '--config.checkpoint.keep=0'], 'checkpoint.keep', 'new'),
      # finetune
      Case('finetune-workdir-is-from',
           lambda s: s.finetune(s.run, f'--from={s.run}', f'--task={s.world.task}'),
           lambda s: s.run, 'run'),
      Case('finetune-workdir-inside-from',
           lambda s: s.finetune(f'{s.run}/ft', f'--from={s.run}', f'--task={s.world.task}'),
           lambda s: f'{s.run}/ft', 'run'),
      Case('finetune-without-task', lambda s: s.finetune(s.new, f'--from={s.run}'), '--task',
           'new'),
      Case('finetune-task-file-missing',
           lambda s: s.finetune(s.new, f'--from={s.run}', f'--task={s.path("task.tsv")}'),
           lambda s: s.path('task.tsv'), 'new'),
      Case('finetune-task-file-without-columns',
           lambda s: s.finetune(s.new, f'--from={s.run}', '--task=' + s.file(
               'task.tsv', 'text\tlabel\nthe sea\tyes\n')),
           lambda s: s.path('task.tsv'), 'new'),
      Case('finetune-task-file-not-tsv-or-jsonl',
           lambda s: s.finetune(s.new, f'--from={s.run}', '--task=' + s.file(
               'task.csv', 'input,target\nthe sea,yes\n')),
           lambda s: s.path('task.csv'), 'new'),
      Case('finetune-task-file-empty',
           lambda s: s.finetune(s.new, f'--from={s.run}', f'--task={s.file("task.tsv")}'),
           lambda s: s.path('task.tsv'), 'new'),
      Case('finetune-inputs-key-missing',
           lambda s: s.finetune(s.new, f'--from={s.run}', f'--task={s.world.task}',
                                '--inputs_key=question'), 'question', 'new'),
      Case('finetune-from-missing',
           lambda s: s.finetune(s.new, f'--from={s.path("pretrained")}',
                                f'--task={s.world.task}'),
           lambda s: s.path('pretrained'), 'new'),
      Case('finetune-from-not-a-workdir',
           lambda s: s.finetune(s.new, f'--from={s.folder_with("pretrained")}',
                                f'--task={s.world.task}'),
           lambda s: s.path('pretrained'), 'new'),
      Case('finetune-from-damaged-checkpoint',
           lambda s: s.finetune(s.new, f'--from={s.damaged_run()}', f'--task={s.world.task}'),
           lambda s: f'{s.run}/checkpoints/2', 'new'),
      Case('finetune-hf-truncated-safetensors',
           lambda s: s.finetune(s.new, f'--hf={s.truncated_hf()}', f'--task={s.world.task}'),
           'model.safetensors', 'new'),
      Case('finetune-from-and-hf',
           lambda s: s.finetune(s.new, f'--from={s.run}', f'--hf={s.hf}',
                                f'--task={s.world.task}'), ('--from', '--hf'), 'new'),
      Case('finetune-neither-from-nor-hf',
           lambda s: s.finetune(s.new, f'--task={s.world.task}'), ('--from', '--hf'), 'new'),
      Case('finetune-model-override',
           lambda s: s.finetune(s.new, f'--from={s.run}', f'--task={s.world.task}',
                                '--config.model.d_ff=256'), 'd_ff', 'new'),
      Case('finetune-steps-zero',
           lambda s: s.finetune(s.new, f'--from={s.run}', f'--task={s.world.task}',
                                '--config.train.steps=0'), 'train.steps', 'new'),
      Case('finetune-resume-another-task',
           lambda s: s.finetune(s.ft, f'--from={s.world.run}',
                                '--task=' + keyword_task(s.path('other_task.tsv'), 100)),
           lambda s: ('--task', s.path('other_task.tsv')), 'ft'),
      Case('finetune-resume-giving-only-another-task',
           lambda s: s.finetune(s.ft, '--task=' + keyword_task(s.path('other_task.tsv'), 100)),
           lambda s: ('--task', s.path('other_task.tsv')), 'ft'),
      Case('finetune-resume-another-from',
           lambda s: s.finetune(s.ft, f'--from={s.run}', f'--task={s.world.task}'),
           lambda s: ('--from', s.run), 'ft'),
      Case('finetune-random-init-without-from',
           lambda s: s.finetune(s.new, '--random_init', f'--task={s.world.task}'),
           ('--from', '--hf'), 'new'),
      # plan
      Case('plan-without-config', lambda _: ['plan', '--topology=cpu:8', '--analytic'],
           '--config', 'case'),
      Case('plan-unknown-topology',
           lambda _: ['plan', f'--config={CONFIGS}/t5_tiny.py', '--topology=v9-8', '--analytic'],
           'v9-8', 'case'),
      Case('plan-dcn-axes-that-leave-a-node-out',
           lambda _: ['plan', f'--config={CONFIGS}/t5_tiny.py', '--topology=3x8xH100',
                      '--config.mesh.dcn_fsdp=2', '--analytic'], 'mesh.dcn_data', 'case'),
      Case('plan-mfu-zero',
           lambda _: ['plan', f'--config={CONFIGS}/t5_tiny.py', '--topology=8xH100', '--mfu=0'],
           'mfu', 'case'),
      Case('plan-unknown-setting',
           lambda _: ['plan', f'--config={CONFIGS}/t5_tiny.py', '--topology=8xH100',
                      '--config.mesh.dat=2'], 'mesh.dat', 'case'),
      Case('plan-experts-not-divisible-by-the-expert-axis',
           lambda _: ['plan', f'--config={CONFIGS}/switch_tiny.py', '--topology=cpu:8',
                      '--config.model.num_experts=6', '--config.mesh.expert=4', '--analytic'],
           'model.num_experts=6 is not divisible by mesh.expert=4', 'case'),
      Case('plan-expert-top-k-above-the-experts',
           lambda _: ['plan', f'--config={CONFIGS}/switch_tiny.py', '--topology=cpu:8',
                      '--config.model.expert_top_k=9', '--analytic'], 'model.expert_top_k=9',
           'case'),
      Case('plan-eval-capacity-factor-negative',
           lambda _: ['plan', f'--config={CONFIGS}/switch_tiny.py', '--topology=cpu:8',
                      '--config.model.eval_capacity_factor=-1', '--analytic'],
           'model.eval_capacity_factor', 'case'),
      Case('plan-expert-axis-and-no-sparse-layer',
           lambda _: ['plan', f'--config={CONFIGS}/switch_tiny.py', '--topology=cpu:8',
                      '--config.model.encoder_sparse_step=0', '--config.model.decoder_sparse_step=0',
                      '--config.mesh.expert=2', '--analytic'], 'no layer is sparse', 'case'),
      Case('plan-bad-config-file',
           lambda s: ['plan', f'--config={s.config_file("syntax_error.py")}', '--topology=8xH100'],
           lambda s: s.path('syntax_error.py'), 'case'),
      # tokenizer
      Case('tokenizer-input-missing',
           lambda s: ['tokenizer', f'--input={s.path("corpus.txt")}', '--vocab_size=30',
                      f'--out={s.new}'], lambda s: s.path('corpus.txt'), 'new'),
      Case('tokenizer-input-empty',
           lambda s: ['tokenizer', f'--input={s.file("corpus.txt")}', '--vocab_size=30',
                      f'--out={s.new}'], lambda s: s.path('corpus.txt'), 'new'),
      Case('tokenizer-input-not-txt-or-jsonl',
           lambda s: ['tokenizer', '--input=' + s.file('corpus.csv', 'a,b\n1,2\n'),
                      '--vocab_size=30', f'--out={s.new}'], lambda s: s.path('corpus.csv'), 'new'),
      Case('tokenizer-vocab-size-zero',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--vocab_size=0', f'--out={s.new}'],
           'vocab_size', 'new'),
      Case('tokenizer-vocab-size-huge',  # SentencePiece's int
           lambda s: ['tokenizer', f'--input={s.world.text}', '--vocab_size=3000000000',
                      f'--out={s.new}'], '--vocab_size', 'new'),
      Case('tokenizer-vocab-size-too-large-for-the-input',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--vocab_size=50000',
                      f'--out={s.new}'], 'vocab_size', 'new'),
      Case('tokenizer-out-is-a-file',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--vocab_size=30',
                      f'--out={s.file("spm.txt", "mine")}'], lambda s: s.path('spm.txt'), 'case'),
      Case('tokenizer-out-is-a-workdir',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--vocab_size=30',
                      f'--out={s.run}'], lambda s: s.run, 'run'),
      Case('tokenizer-bytes-with-a-sentencepiece-setting',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--model_type=bytes',
                      '--vocab_size=300', f'--out={s.new}'], ('--vocab_size', 'bytes'), 'new'),
      Case('tokenizer-alpha-zero',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--alpha=0', '--vocab_size=30',
                      f'--out={s.new}'], '--alpha=0', 'new'),
      Case('tokenizer-alpha-above-one',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--alpha=1.5', '--vocab_size=30',
                      f'--out={s.new}'], '--alpha=1.5', 'new'),
      Case('tokenizer-character-coverage-zero',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--character_coverage=0',
                      '--vocab_size=30', f'--out={s.new}'], '--character_coverage', 'new'),
      Case('tokenizer-config-override',
           lambda s: ['tokenizer', f'--input={s.world.text}', '--vocab_size=30', f'--out={s.new}',
                      '--config.data.vocabulary=spm'], '--config.data.vocabulary', 'new'),
  ]


MISTAKES = mistakes()
BY_ID = {case.id: case for case in MISTAKES}
# The rows that also run as real processes: a train, a bad config file, a refused output, a
# command without its --config, a truncated download, a fine-tune into its own source.
IN_A_PROCESS = ('train-resume-keep-zero', 'config-file-syntax-error', 'export-out-is-the-workdir',
                'data-without-config', 'import-hf-truncated-safetensors',
                'finetune-workdir-is-from')


def in_this_process(argv: list[str], capfd) -> tuple[int, str]:
  """(exit status, stderr) of `cli.main(argv)`; an escaping exception is what Python would
  print, exit status 1."""
  capfd.readouterr()  # what setting up the case printed
  try:
    status = cli.main(argv)
  except SystemExit as exit_:  # argparse's errors
    status = exit_.code
  except Exception:  # pylint: disable=broad-except
    status = 1
    sys.stderr.write(traceback.format_exc())
  sys.stderr.flush()
  return status, capfd.readouterr().err


def process_env() -> dict:
  """The environment a user runs `t5lite` in: none of the suite's quieting of TensorFlow, one CPU
  device (CPU only, as the rest of the suite)."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('TF_CPP_MIN_LOG_LEVEL', 'T5LITE_DEBUG', 'XLA_FLAGS')}
  env['JAX_PLATFORMS'] = 'cpu'
  return env


def in_a_process(argv: list[str]) -> tuple[int, str]:
  """(exit status, stderr) of `python -m t5lite ARGV`, run as a user runs it."""
  done = subprocess.run([sys.executable, '-m', 't5lite', *argv], cwd=ROOT, env=process_env(),
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
  return done.returncode, done.stderr


def culprits_of(case: Case, setup: Setup) -> tuple[str, ...]:
  culprit = case.culprit(setup) if callable(case.culprit) else case.culprit
  return culprit if isinstance(culprit, tuple) else (culprit,)


def check_refused(case: Case, setup: Setup, run: Callable[[list[str]], tuple[int, str]]) -> None:
  """Runs the case's command with `run` and asserts the refusal: status 2, one stderr line that
  names the culprit, and the watched folder and the case folder as they were."""
  argv = case.argv(setup)
  culprits = culprits_of(case, setup)
  watched = None if case.watch in ('new', 'case') else getattr(setup, case.watch)
  watched_before = snapshot(watched) if watched else None
  before = snapshot(setup.folder)
  status, err = run(argv)
  lines = err.splitlines()
  assert (status, len(lines)) == (2, 1), (
      f't5lite {" ".join(argv)}\nexit status {status}, {len(lines)} stderr lines:\n{err[-4000:]}')
  assert any(culprit in lines[0] for culprit in culprits), (
      f'the line names none of {culprits}: {lines[0]}')
  if watched:
    after = snapshot(watched)
    assert after == watched_before, f'{watched} changed: {changes(watched_before, after)}'
  if case.watch == 'new':
    assert not os.path.exists(setup.new), f'{setup.new} was created'
  after = snapshot(setup.folder)
  assert after == before, f'{setup.folder} changed: {changes(before, after)}'


@pytest.mark.parametrize('case', MISTAKES, ids=[case.id for case in MISTAKES])
def test_a_mistake_is_refused_in_one_line_and_changes_nothing(world, tmp_path, capfd, case):
  check_refused(case, Setup(tmp_path, world), lambda argv: in_this_process(argv, capfd))


@pytest.mark.parametrize('case', [BY_ID[i] for i in IN_A_PROCESS], ids=IN_A_PROCESS)
def test_a_real_process_prints_one_line_and_exits_2(world, tmp_path, case):
  """As above, as a user runs it: nothing else on stderr (no oneDNN banner, no absl lines)."""
  check_refused(case, Setup(tmp_path, world), in_a_process)


def test_a_cudnn_run_exports_on_this_cpu_with_xla_attention(world, tmp_path):
  """What the refusal above says to do works: the same weights as the run's export."""
  setup = Setup(tmp_path, world)
  run = setup.edit_json(setup.run, 'config.json', ('model', 'attention'), 'cudnn')
  assert cli.main(['export', f'--workdir={run}', f'--out={setup.new}',
                   '--config.model.attention=xla']) == 0
  for name in ('model.safetensors', 'config.json'):
    with open(os.path.join(setup.new, name), 'rb') as ours, \
         open(os.path.join(world.hf, name), 'rb') as before:
      assert ours.read() == before.read(), name


def test_there_are_at_least_60_mistakes_over_every_command():
  commands = {case.id.split('-')[0] for case in MISTAKES}
  assert len(MISTAKES) >= 60 and len(BY_ID) == len(MISTAKES)
  assert {'train', 'config', 'eval', 'data', 'export', 'infer', 'import', 'finetune', 'plan',
          'tokenizer'} <= commands


BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


@pytest.mark.parametrize('steps', [1, 2], ids=['below', 'at'])
def test_resuming_at_or_below_the_saved_step_compiles_nothing(world, tmp_path, capfd,
                                                              monkeypatch, steps):
  """The run's latest checkpoint is step 2: train.steps=1 or 2 has nothing to do, and says so
  in one line before anything compiles (the train step of even this tiny model compiles for
  about 3 s; the checks may compile a few small eager ops at most). It is no mistake (a job run
  again after it finished): exit status 0, so launchers see a finished run, and nothing written."""
  setup = Setup(tmp_path, world)
  lowered, compile_seconds = [], []
  compile_lowered = jax.stages.Lowered.compile

  def counting_compile(self, *args, **kwargs):
    lowered.append(self)
    return compile_lowered(self, *args, **kwargs)

  def listener(event, duration, **_):
    if event == BACKEND_COMPILE:
      compile_seconds.append(duration)

  monkeypatch.setattr(jax.stages.Lowered, 'compile', counting_compile)
  jax.monitoring.register_event_duration_secs_listener(listener)
  start = time.monotonic()
  try:
    before = snapshot(setup.run)
    capfd.readouterr()
    status = cli.main(setup.resume(f'--config.train.steps={steps}'))
    out, err = capfd.readouterr()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  seconds = time.monotonic() - start
  assert status == 0 and not err, (status, err[-2000:])
  assert out.splitlines() == [f'{setup.run} is at step 2 already, config.train.steps={steps}: '
                              'nothing to train'], out
  assert snapshot(setup.run) == before
  assert not lowered, 'the train step was compiled'
  assert sum(compile_seconds) < 1.5, f'{len(compile_seconds)} compiles, {sum(compile_seconds)} s'
  assert seconds < 60


# Disk full during a save: a tmpfs of DISK_MIB holds the first checkpoints of the tiny run
# (about 6.6 MB each: the parameters and Adafactor's state, float32) and fills up in a later save.
DISK_MIB = 16


@pytest.fixture
def small_disk(tmp_path):
  """A DISK_MIB tmpfs mounted at tmp_path/disk, unmounted afterwards; skipped where this process
  may not mount one (it needs root or CAP_SYS_ADMIN)."""
  mount_point = tmp_path / 'disk'
  mount_point.mkdir()
  try:
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={DISK_MIB}m', 'tmpfs',
                              str(mount_point)], capture_output=True, text=True, check=False)
  except FileNotFoundError:
    pytest.skip('no mount command: cannot make a small file system to fill')
  if mounted.returncode != 0:
    pytest.skip(f'cannot mount a {DISK_MIB} MiB tmpfs to fill (needs root or CAP_SYS_ADMIN): '
                f'{mounted.stderr.strip()}')
  try:
    yield str(mount_point)
  finally:
    subprocess.run(['umount', '-l', str(mount_point)], check=True)


@pytest.mark.slow  # a run onto a full filesystem: 18-24 s on 2 cores
def test_a_full_disk_during_a_save_is_one_line_and_earlier_checkpoints_restore(
    tmp_path, small_disk):
  """`t5lite train` as a user runs it (asynchronous saves, the default) into a workdir on a small
  file system, a checkpoint every step, all kept: a save fills the disk. One line on stderr says
  so, exit status 2, and every checkpoint completed before it restores."""
  workdir = os.path.join(small_disk, 'run')
  text = random_corpus(tmp_path / 'text.txt')
  flags = [*TINY_RUN, f'--config.data.source={text}', '--config.train.steps=20',
           '--config.checkpoint.every_steps=1', '--config.checkpoint.keep=100',
           '--config.checkpoint.async_save=true']
  done = subprocess.run([sys.executable, '-m', 't5lite', 'train', f'--workdir={workdir}', *flags],
                        cwd=ROOT, env=process_env(), stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE, text=True, timeout=600)
  checkpoints = os.path.join(workdir, 'checkpoints')
  complete = sorted(int(name) for name in (
      os.listdir(checkpoints) if os.path.isdir(checkpoints) else ()) if name.isdigit())
  assert complete, f'no complete checkpoint; stderr:\n{done.stderr[-4000:]}'
  assert complete[-1] < 20, 'the disk never filled up: make DISK_MIB smaller'
  config = cli.load_run_config(types.SimpleNamespace(workdir=workdir), [])
  run = run_lib.make_run(config)
  for step in complete:
    restored, params = run.restore_params(workdir, step)
    assert restored == step
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(params)), step

  lines = done.stderr.splitlines()
  assert (done.returncode, len(lines)) == (2, 1), (
      f'exit status {done.returncode}, {len(lines)} stderr lines:\n{done.stderr[-4000:]}')
  assert any(words in lines[0].lower() for words in (
      'no space left', 'disk is full', 'disk full', 'file system is full')), lines[0]
