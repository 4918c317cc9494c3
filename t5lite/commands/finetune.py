"""Fine-tuning on a text-to-text task, from a pretrained workdir or a Hugging Face T5 folder.

  t5lite finetune --workdir=runs/ft --from=runs/demo --task=sentiment
  t5lite finetune --workdir=runs/ft_random --from=runs/demo --random_init --task=sentiment

The run is `loop.train` composed with three pieces: the task's packed batches (`data/tasks.py`)
with exact match in every evaluation, the pretrained parameters under a fresh optimizer state
at step 0, and `<workdir>/best`, a workdir of its own that keeps the checkpoint of the highest
held-out exact match (ties: lower loss) for `t5lite eval` and `t5lite export`; the latest
checkpoints stay in `<workdir>/checkpoints` for resuming. The model is the pretrained one: a
structural `--config.model.*` override is refused. T5's fine-tuning settings replace the
pretraining schedule (Raffel et al. 2020): Adafactor at a constant learning rate of
1e-3 and dropout 0.1. `--random_init` trains the same model from a random initialisation, the
baseline that shows what pretraining brought.
"""

import dataclasses

import jax
import ml_collections

from t5lite import config as config_lib
from t5lite import paths
from t5lite.export import hf
from t5lite.export import tokenizer
from t5lite.inputs import tasks
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import loop
from t5lite.train import run as run_lib

BEST = 'best'


def finetune(workdir: str, *, pretrained: str | None = None, hf_dir: str | None = None,
             random_init: bool = False, task: str | None = None, inputs_key: str = 'input',
             targets_key: str = 'target', overrides: list[str] = ()) -> dict:
  """Fine-tunes `pretrained` (a workdir) or `hf_dir` on `task` to `train.steps`; returns the last
  logged metrics and the best step. Without them, resumes the workdir's run with its config.

  A fine-tuning workdir records where it started (`finetune.source`, `finetune.random_init`) and
  its task; the same command resumes it, another source or task is refused, so that its
  checkpoints and `best/` only ever hold one fine-tuning."""
  saved = saved_finetune(workdir)
  if pretrained is None and hf_dir is None:
    if saved is None:
      raise ValueError(f'--workdir {workdir} holds no fine-tuning run to resume; start one with '
                       '--from=PRETRAINED_WORKDIR or --hf=HF_FOLDER and --task')
    if task is not None and canonical_task(task) != saved.data.task:
      raise ValueError(f'--workdir {workdir} fine-tunes on {saved.data.task}, not --task={task}; '
                       'resume it with its own task or use a new --workdir')
    config = saved
    config_lib.override(config, list(overrides))
    config_lib.check_workdir_vocabulary(config, workdir)
    return run(workdir, config, None)
  if not task:
    raise ValueError(f'give --task ({tasks.SENTIMENT} or a .tsv/.jsonl file of input and '
                     'target texts)')
  source = pretrained if hf_dir is None else hf_dir
  check_apart(workdir, source, '--from' if hf_dir is None else '--hf')
  base, init_params = pretrained_start(pretrained, hf_dir)
  config = finetune_config(base, task, inputs_key, targets_key, list(overrides))
  if pretrained is not None:
    config_lib.check_workdir_vocabulary(config, pretrained, '--from')
  config.finetune = ml_collections.ConfigDict(
      {'source': canonical(source), 'hf': hf_dir is not None, 'random_init': random_init})
  if saved is not None:
    check_same_finetune(workdir, saved, config)
    config_lib.check_workdir_vocabulary(config, workdir)
  return run(workdir, config, None if random_init else init_params)


def saved_finetune(workdir: str) -> ml_collections.ConfigDict | None:
  """The config a fine-tuning run saved in `workdir`; None for a new workdir. A workdir of
  another kind of run is refused here."""
  if not (paths.path(workdir) / 'config.json').is_file():
    return None
  config = config_lib.from_workdir(workdir)
  if not config.data.task:
    raise ValueError(f'--workdir {workdir} holds a pretraining run, not a fine-tuning one; '
                     'fine-tune into a new workdir')
  return config


def check_apart(workdir: str, source: str, flag: str) -> None:
  """The fine-tuning workdir must not be, be inside, or hold the run it starts from."""
  if paths.within(workdir, source) or paths.within(source, workdir):
    raise ValueError(f'--workdir {workdir} and {flag} {source} overlap; fine-tune into a '
                     'workdir of its own')


def check_same_finetune(workdir: str, saved: ml_collections.ConfigDict,
                        config: ml_collections.ConfigDict) -> None:
  """Refuses to continue a fine-tuning workdir from another start or on another task."""
  started = saved.get('finetune', ml_collections.ConfigDict()).to_dict()
  wanted = config.finetune.to_dict()
  diffs = [f'{name} {started[name]!r} vs {wanted[name]!r}' for name in wanted
           if name in started and started[name] != wanted[name]]
  diffs += [f'data.{name} {saved.data[name]!r} vs {config.data[name]!r}'
            for name in ('task', 'inputs_key', 'targets_key')
            if saved.data.get(name) != config.data[name]]
  if diffs:
    raise ValueError(f'--workdir {workdir} holds another fine-tuning ({", ".join(diffs)}); '
                     'resume it with its own flags or use a new --workdir')


def canonical_task(task: str) -> str:
  return task if task == tasks.SENTIMENT else canonical(task)


def canonical(path: str) -> str:
  """One name per place, to compare where a run started from."""
  return str(paths.path(path))


def finetune_config(base: ml_collections.ConfigDict, task: str, inputs_key: str,
                    targets_key: str, overrides: list[str]) -> ml_collections.ConfigDict:
  """The pretrained run's config with T5's fine-tuning settings, the task and `overrides`."""
  config = ml_collections.ConfigDict(base.to_dict())
  config.model.dropout = 0.1
  config.optim.update(name='adafactor', schedule='constant', learning_rate=1e-3)
  config.data.update(validation_fraction=0.1)  # held out of a task file, by input hash
  config.data.update(task=canonical_task(task), inputs_key=inputs_key, targets_key=targets_key)
  config.train.update(steps=1000, eval_every=100)
  config.checkpoint.update(every_steps=100)
  config_lib.override(config, overrides)
  diffs = checkpoint_lib.structural_diffs(base.model.to_dict(), config.model.to_dict())
  if diffs:
    raise ValueError(f'fine-tuning keeps the pretrained model, but the overrides change it '
                     f'({", ".join(diffs)}); drop those --config.model settings')
  config_lib.model_config(config)  # one line for a bad model setting, before anything runs
  return config


def pretrained_start(pretrained: str | None, hf_dir: str | None):
  """(the pretrained run's config, a function returning its parameters) of --from or --hf."""
  if (pretrained is None) == (hf_dir is None):
    raise ValueError('give one of --from=PRETRAINED_WORKDIR or --hf=HF_FOLDER')
  if hf_dir is not None:
    model_cfg, params = hf.import_hf(hf_dir)
    config = config_lib.base_config()
    config.model.update(dataclasses.asdict(model_cfg))
    if tokenizer.import_tokenizer(hf_dir) is not None:  # checked: a T5 vocabulary, or none
      vocab = paths.path(hf_dir) / tokenizer.SPIECE_FILE
      if not vocab.is_file():
        raise ValueError(f'--hf {hf_dir} has its vocabulary as {tokenizer.TOKENIZER_JSON_FILE} '
                         f'alone; t5lite import-hf it into a workdir, then finetune --from that')
      config.data.vocabulary = str(vocab)
    return config, lambda: params
  config = config_lib.from_workdir(pretrained)
  return config, lambda: run_lib.make_run(config).restore_params(pretrained)[1]


def task_inputs(config: ml_collections.ConfigDict) -> loop.Inputs:
  """The task's training batches and all its held-out ones, with exact match."""
  data, index, count = config.data, jax.process_index(), jax.process_count()
  held_out = tasks.validation_batches(tasks.load_split(data, 'validation'), data.batch_size,
                                      index, count)
  return loop.Inputs(
      train=lambda start: tasks.TaskPipeline(tasks.load_split(data, 'train'), data.batch_size,
                                             index, count, start),
      held_out=lambda: (iter(held_out), len(held_out)),
      exact_match=True)


def run(workdir: str, config: ml_collections.ConfigDict, init_params) -> dict:
  """`loop.train` on the task of `config`, keeping the best checkpoint in `<workdir>/best`."""
  inputs = task_inputs(config)  # a bad task file fails here, before the workdir is touched
  best = KeepBest(str(paths.path(workdir) / BEST), config)
  last = loop.train(config, workdir, inputs=inputs, init_params=init_params, keep_best=best,
                    command='t5lite finetune')
  return dict(last, best_step=best.best_step)


class KeepBest:
  """`<workdir>/best`, a workdir holding the one checkpoint of highest held-out exact match
  (ties: lower loss). Opened at the first evaluation: a run refused before it changes nothing."""

  def __init__(self, directory: str, config: ml_collections.ConfigDict):
    if paths.path(directory).exists() and not paths.path(directory).is_dir():
      raise ValueError(f'{directory} is not a folder; a fine-tuning run keeps its best '
                       'checkpoint there')
    self.directory, self.config, self.checkpointer = directory, config, None
    self.best_step = None  # known once closed, if this run evaluated

  def __call__(self, step: int, state, metrics: dict) -> None:
    if self.checkpointer is None:
      loop.record_config(self.directory, self.config)
      keep_one = dict(self.config.checkpoint.to_dict(), keep=1, keep_period=0)
      self.checkpointer = checkpoint_lib.Checkpointer(
          self.directory, ml_collections.ConfigDict(keep_one), best_fn=best_score)
    scores = {k: metrics[k] for k in ('eval_exact_match', 'eval_loss')}
    self.checkpointer.save(step, state, {}, self.config.to_dict(), metrics=scores)

  def close(self) -> None:
    """Waits for the last save and notes the best step."""
    if self.checkpointer is None:
      return
    try:
      self.checkpointer.wait()
      self.best_step = self.checkpointer.manager.best_step()
    finally:
      self.checkpointer.close()
      self.checkpointer = None


def best_score(metrics: dict) -> tuple[float, float]:
  return metrics['eval_exact_match'], -metrics['eval_loss']
