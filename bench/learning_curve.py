"""Held-out loss of t5lite and of Hugging Face's PyTorch T5 trained alike: does t5lite learn like
the reference?

Both models have the preset's shape and start from the same weights: t5lite's initialisation,
exported to a Hugging Face folder (`t5lite.export`) and loaded by `transformers`. They train on
the same batches of t5lite's input pipeline (`make_batches`: span corruption of the bundled
corpus, one example per row) with the same recipe, `RECIPE`: AdamW (0.9, 0.999, eps 1e-8,
weight decay 0.01) at a peak rate of 1e-3 after 30 warmup steps and cosine to 0, t5lite's
schedule read step by step on both sides, clipping at global norm 1.0, no z-loss, no dropout,
float32. One step of each in turn; at step 0 and every
`train.eval_every` steps both are evaluated on the same `train.eval_batches` held-out batches,
the loss summed over their target tokens as `t5lite train` evaluates.

Prints a JSON line per evaluation (both sides' held-out losses, and the training losses of the
step just taken), then a summary with the machine, and draws the held-out curves and their
difference to a PNG (800 x 500). The defaults, 300 steps of t5_tiny at batch 16, took 30
minutes on 2 cores shared at a load average of 5-7 (docs/notes/train-step-cpu.md, 2026-11-26):

  python bench/learning_curve.py      # -> docs/images/learning_curve_t5_tiny.png
  python bench/learning_curve.py --config.train.steps=1000 --out=/tmp/curve.png
"""

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time

# First: train_step sets the environment that jax and torch read when they start.
import train_step  # pylint: disable=wrong-import-order
import loss_curves  # pylint: disable=wrong-import-order

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from t5lite import config as config_lib  # noqa: E402
from t5lite.export import hf as hf_lib  # noqa: E402
from t5lite.inputs import batches as batches_lib  # noqa: E402
from t5lite.train import loop  # noqa: E402
from t5lite.train import mesh as mesh_lib  # noqa: E402
from t5lite.train import run as run_lib  # noqa: E402

# What both sides can do exactly, as --config overrides; the command line's come after.
RECIPE = ['--config.data.batch_size=16', '--config.train.steps=300',
          '--config.train.eval_every=20', '--config.train.eval_batches=4',
          '--config.train.z_loss=0', '--config.optim.name=adamw', '--config.optim.schedule=cosine',
          '--config.optim.learning_rate=1e-3', '--config.optim.warmup_steps=30',
          '--config.optim.weight_decay=0.01']
# Settings the PyTorch side reproduces only at these values.
COMPARABLE = {'optim.name': 'adamw', 'train.z_loss': 0, 'train.label_smoothing': 0,
              'train.loss_normalizer': 'real_tokens', 'data.objective': 'span_corruption',
              'model.dropout': 0, 'model.dtype': 'float32'}
SIDES = ('t5lite', 'hf_torch')


def load_config(preset: str, overrides: list[str]):
  """The preset with RECIPE and then `overrides` applied; one line for what PyTorch cannot match."""
  config = config_lib.load(preset)
  config_lib.override(config, RECIPE + overrides)
  if config.train.eval_every < 1:
    raise ValueError('config.train.eval_every must be at least 1: it spaces the points')
  for name, value in COMPARABLE.items():
    section, key = name.split('.')
    if config[section][key] != value:
      raise ValueError(f'config.{name}={config[section][key]!r}: the PyTorch side is trained '
                       f'alike only at {value!r}')
  return config


def one_example_per_row(batch: dict) -> dict:
  """The batch, refused if rows are packed: Hugging Face's T5 cannot keep their examples apart."""
  if batch['encoder_segment_ids'].max() > 1 or batch['decoder_segment_ids'].max() > 1:
    raise ValueError('the batches pack several examples per row (a tfds: source); the '
                     'comparison needs an in-memory data.source (bundled, .txt, .jsonl)')
  return batch


def t5lite_side(run: run_lib.Run, state):
  """(step(batch) -> training loss, held_out_loss(batches)): `run`'s jitted steps on `state`."""
  loss = run.loss()
  train, evaluate = run.jit_train_step(loss), run.jit_eval_step(loss)
  holder = {'state': state}

  def step(batch: dict) -> float:
    holder['state'], metrics = train(holder['state'], loop.global_batch(batch, run.batch_sharding),
                                     None)
    return float(metrics['loss'])

  def held_out_loss(batches: list[dict]) -> float:
    return loop.evaluate(evaluate, loss, holder['state'].params, iter(batches), len(batches),
                         run.batch_sharding)['eval_loss']

  return step, held_out_loss


def torch_side(run: run_lib.Run, params, device: str):
  """The same two functions for `transformers`' T5 loaded from `params` exported, trained with
  torch's AdamW (`optim.make_optimizer`'s adamw: decoupled decay scaled by the learning rate) at
  each step's rate from t5lite's own schedule."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  hf_lib.hf_model(run.model_cfg)  # one line for a model that does not export
  # transformers 5.23 warns that it will not tie lm_head to the embeddings, as the export says
  transformers.logging.set_verbosity_error()
  with tempfile.TemporaryDirectory(prefix='t5lite_learning_curve_') as folder:
    hf_lib.export_hf(params, run.model_cfg, folder)
    model = transformers.T5ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation='eager').to(device)
  optim_cfg = run.config.optim
  optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=float(optim_cfg.weight_decay))
  clip, steps_taken = float(optim_cfg.clip_grad_norm), itertools.count()

  def step(batch: dict) -> float:
    for group in optimizer.param_groups:
      group['lr'] = float(run.schedule(next(steps_taken)))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = model(**train_step.torch_inputs(batch, device)).loss
    loss.backward()
    if clip > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item()

  def held_out_loss(batches: list[dict]) -> float:
    """Summed over every target token of `batches`, then divided, as t5lite's evaluation."""
    model.eval()
    total = tokens = 0.0
    with torch.no_grad():
      for batch in batches:
        inputs = train_step.torch_inputs(batch, device)
        count = int((inputs['labels'] != -100).sum())
        total += model(**inputs).loss.item() * count  # HF's loss is the mean per token
        tokens += count
    return total / tokens

  return step, held_out_loss


def learning_curves(config, report) -> dict[str, float]:
  """Trains both sides in turn, one device each, calling `report({'step', 't5lite_eval_loss',
  'hf_torch_eval_loss', ...})` at step 0 and each evaluation; returns each side's seconds of
  training steps."""
  run = run_lib.make_run(config, mesh_lib.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1},
                                                     jax.devices()[:1]))
  one_process = dict(process_index=0, process_count=1)
  with contextlib.closing(batches_lib.make_batches(config.data, 'validation', **one_process)
                          ) as validation:
    held_out = [one_example_per_row(b)
                for b in itertools.islice(validation, config.train.eval_batches)]
  seconds = dict.fromkeys(SIDES, 0.0)
  with run.sharding(), contextlib.closing(
      batches_lib.make_batches(config.data, 'train', **one_process)) as train_batches:
    state = run.spec.init()
    sides = {'t5lite': t5lite_side(run, state),  # exported before its first step donates state
             'hf_torch': torch_side(run, state.params, train_step.torch_device() or 'cpu')}
    losses = {}
    for step in range(config.train.steps + 1):
      if step % config.train.eval_every == 0 or step == config.train.steps:
        report({'step': step, **{f'{side}_eval_loss': held_out_loss(held_out)
                                 for side, (_, held_out_loss) in sides.items()}, **losses})
      if step == config.train.steps:
        break
      batch = one_example_per_row(next(train_batches))
      for side, (train, _) in sides.items():
        start = time.perf_counter()
        losses[f'{side}_train_loss'] = train(batch)
        seconds[side] += time.perf_counter() - start
  return seconds


def summary(rows: list[dict], config, seconds: dict[str, float]) -> dict:
  """The run's settings, first and final held-out losses and their largest gap."""
  gaps = [row['t5lite_eval_loss'] - row['hf_torch_eval_loss'] for row in rows]
  widest = int(np.argmax(np.abs(gaps)))
  first, last = rows[0], rows[-1]
  return {
      'steps': config.train.steps, 'batch_size': config.data.batch_size,
      'inputs_length': config.data.inputs_length, 'targets_length': config.data.targets_length,
      'eval_every': config.train.eval_every, 'eval_batches': config.train.eval_batches,
      **{f'optim_{k}': config.optim[k] for k in ('name', 'schedule', 'learning_rate',
                                                  'warmup_steps', 'weight_decay',
                                                  'clip_grad_norm')},
      **{f'{side}_{when}_eval_loss': row[f'{side}_eval_loss']
         for side in SIDES for when, row in (('initial', first), ('final', last))},
      'max_eval_gap': abs(gaps[widest]), 'max_eval_gap_step': rows[widest]['step'],
      'max_eval_gap_relative': abs(gaps[widest]) / rows[widest]['hf_torch_eval_loss'],
      **{f'{side}_train_s': round(s, 1) for side, s in seconds.items()},
  }


def plot(rows: list[dict], title: str, out: str) -> None:
  """Held-out losses of both sides above, their difference below, against the step."""
  loss_curves.plot_pair(rows, (('t5lite', 't5lite (JAX)'),
                               ('hf_torch', 'transformers T5 (PyTorch), same start')),
                        title, 't5lite - HF (nats)', out)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0], epilog='Any setting of the config can be overridden '
      'as --config.a.b=value, after RECIPE (e.g. --config.train.steps=1000).')
  parser.add_argument('--config', default=os.path.join(ROOT, 'configs', 't5_tiny.py'),
                      help='the preset (a T5)')
  parser.add_argument('--out', help='the PNG; default: docs/images/learning_curve_PRESET.png')
  args, overrides = parser.parse_known_args(argv)
  config = load_config(args.config, overrides)
  preset = os.path.splitext(os.path.basename(args.config))[0]
  out = args.out or os.path.join(ROOT, 'docs', 'images', f'learning_curve_{preset}.png')
  rows, start = [], time.perf_counter()

  def report(row: dict) -> None:
    rows.append(row)
    print(json.dumps({'bench': 'learning_curve', 'model': preset, **row}), flush=True)

  seconds = learning_curves(config, report)
  plot(rows, f'{preset}: t5lite against transformers, same start, batches and AdamW', out)
  print(json.dumps({'bench': 'learning_curve', 'model': preset, 'png': out,
                    **summary(rows, config, seconds),
                    'wall_s': round(time.perf_counter() - start, 1),
                    **train_step.machine_info()}), flush=True)


if __name__ == '__main__':
  main()
