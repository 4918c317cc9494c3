"""Does a Switch Transformer learn more per FLOP? switch_tiny against t5_tiny, side by side.

switch_tiny is t5_tiny with every other MLP made 8 experts, each token routed to one
(configs/switch_tiny.py): the same compute per token, the routers aside (+0.1%). Both train in
one process, steps alternating, from the same seed on the same batches of the bundled corpus
(span corruption, each preset's own recipe: Adafactor at 0.01, batch 32); at step 0 and every
`--eval_every` steps both are evaluated on the same held-out batches (their token cross
entropy, `eval_loss`, summed over the target tokens as `t5lite train` evaluates). The step
time of each is the median of its training steps (compilation aside), measured in turn, so that
load from other processes hits both alike.

Prints a JSON line per evaluation, then a summary (final held-out losses and their difference,
median step seconds and their ratio, the machine), and draws both held-out curves and their
difference to a PNG.

  python bench/switch_vs_dense.py       # 300 steps -> docs/images/switch_vs_dense.png
  python bench/switch_vs_dense.py --steps=20 --eval_every=10 --out=/tmp/switch.png
  python bench/switch_vs_dense.py --plot_from=printed.jsonl   # redraw a run's lines, no training
"""

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import time

# First: train_step sets the environment that jax and torch read when they start.
import train_step  # pylint: disable=wrong-import-order
import loss_curves  # pylint: disable=wrong-import-order
import learning_curve  # pylint: disable=wrong-import-order

import jax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from t5lite import config as config_lib  # noqa: E402
from t5lite.inputs import batches as batches_lib  # noqa: E402
from t5lite.train import flops as flops_lib  # noqa: E402
from t5lite.train import mesh as mesh_lib  # noqa: E402
from t5lite.train import run as run_lib  # noqa: E402

MODELS = ('t5_tiny', 'switch_tiny')


def make_runs(steps: int, eval_batches: int, overrides: list[str]) -> dict[str, run_lib.Run]:
  """Each preset's run on one device, with `steps` and the command line's overrides."""
  runs = {}
  for name in MODELS:
    config = config_lib.load(name)
    config_lib.override(config, [f'--config.train.steps={steps}',
                                 f'--config.train.eval_batches={eval_batches}', *overrides])
    runs[name] = run_lib.make_run(config, mesh_lib.make_mesh(
        {'data': 1, 'fsdp': 1, 'tensor': 1}, jax.devices()[:1]))
  data = [run.config.data.to_dict() for run in runs.values()]
  if data[0] != data[1]:
    raise ValueError('the presets read different data; compare them on the same batches')
  return runs


def compare(runs: dict[str, run_lib.Run], eval_every: int, report) -> dict[str, list[float]]:
  """Trains both in turn on the same batches; `report(row)` at step 0 and each evaluation.
  Returns each model's step seconds (its first step, which compiles, left out)."""
  config = runs[MODELS[0]].config
  one_process = dict(process_index=0, process_count=1)
  with contextlib.closing(batches_lib.make_batches(config.data, 'validation', **one_process)
                          ) as validation:
    held_out = list(itertools.islice(validation, config.train.eval_batches))
  seconds = {name: [] for name in MODELS}
  sides = {}
  with contextlib.closing(batches_lib.make_batches(config.data, 'train', **one_process)
                          ) as train_batches:
    for name, run in runs.items():
      with run.sharding():
        sides[name] = learning_curve.t5lite_side(run, run.spec.init())
    losses = {}
    for step in range(config.train.steps + 1):
      if step % eval_every == 0 or step == config.train.steps:
        row = {'step': step, **losses}
        for name, (_, held_out_loss) in sides.items():
          with runs[name].sharding():
            row[f'{name}_eval_loss'] = held_out_loss(held_out)
        report(row)
      if step == config.train.steps:
        break
      batch = next(train_batches)
      for name, (train, _) in sides.items():
        start = time.perf_counter()
        with runs[name].sharding():
          losses[f'{name}_train_loss'] = train(batch)
        seconds[name].append(time.perf_counter() - start)
  return {name: times[1:] for name, times in seconds.items()}


def summary(rows: list[dict], runs: dict[str, run_lib.Run], seconds: dict) -> dict:
  dense, sparse = MODELS
  data = runs[dense].config.data
  step_s = {name: statistics.median(times) for name, times in seconds.items()}
  flops = {name: flops_lib.flops_per_example(run.model_cfg, data.inputs_length,
                                             data.targets_length) for name, run in runs.items()}
  final = rows[-1]
  return {
      'steps': runs[dense].config.train.steps, 'batch_size': data.batch_size,
      'inputs_length': data.inputs_length, 'targets_length': data.targets_length,
      'eval_batches': runs[dense].config.train.eval_batches,
      **{f'{name}_final_eval_loss': final[f'{name}_eval_loss'] for name in MODELS},
      'eval_loss_gap': final[f'{sparse}_eval_loss'] - final[f'{dense}_eval_loss'],
      **{f'{name}_step_s': round(s, 4) for name, s in step_s.items()},
      'step_time_ratio': step_s[sparse] / step_s[dense],
      'flops_ratio': flops[sparse] / flops[dense],
      **{f'{name}_params': sum(x.size for x in jax.tree.leaves(run.spec.abstract.params))
         for name, run in runs.items()},
  }


def plot(rows: list[dict], out: str) -> None:
  """Both held-out curves (from the second evaluation on) above, Switch minus dense below."""
  loss_curves.plot_pair(
      rows, (('switch_tiny', 'switch_tiny (8 experts, top-1, same FLOPs per token)'),
             ('t5_tiny', 't5_tiny (dense)')),
      'Held-out loss, same batches and seed', 'switch - dense (nats)', out, zoom=True)


def read_rows(path: str) -> list[dict]:
  """The evaluation rows among the JSON lines a run of this script printed."""
  with open(path, encoding='utf-8') as f:
    lines = [json.loads(line) for line in f if line.strip().startswith('{')]
  return [line for line in lines if 'step' in line and 'png' not in line]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      epilog='Any setting of both configs can be overridden as --config.a.b=value.')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--eval_every', type=int, default=25)
  parser.add_argument('--eval_batches', type=int, default=10)
  parser.add_argument('--out', default=os.path.join(ROOT, 'docs', 'images',
                                                    'switch_vs_dense.png'))
  parser.add_argument('--plot_from', help="a run's printed JSON lines: draw them, train nothing")
  args, overrides = parser.parse_known_args(argv)
  if args.plot_from:
    plot(read_rows(args.plot_from), args.out)
    return
  runs = make_runs(args.steps, args.eval_batches, overrides)
  rows, start = [], time.perf_counter()

  def report(row: dict) -> None:
    rows.append(row)
    print(json.dumps({'bench': 'switch_vs_dense', **row}), flush=True)

  seconds = compare(runs, args.eval_every, report)
  plot(rows, args.out)
  print(json.dumps({'bench': 'switch_vs_dense', 'png': args.out,
                    **summary(rows, runs, seconds), 'wall_s': round(time.perf_counter() - start, 1),
                    **train_step.machine_info()}), flush=True)


if __name__ == '__main__':
  main()
