"""A run's loss curves, drawn from its workdir's metrics.jsonl to a small PNG (`make demo`'s).

The training loss (the mean over each log interval) and the held-out loss (`eval_loss`, at each
evaluation) against the step, for a reader who would rather look than read the JSON lines.
Prints one JSON line: where the picture went, its points and the last losses. Needs matplotlib,
of the test extra (`make test` and `make bench` install it).

  make demo && python bench/loss_curves.py      # runs/demo -> docs/images/demo_loss_curves.png
  python bench/loss_curves.py --workdir=runs/tiny --out=/tmp/tiny.png
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from t5lite.train import metrics as metrics_lib  # noqa: E402  pylint: disable=wrong-import-position

# The docs' pictures: 800 x 500 pixels, small enough to commit (tens of KB).
WIDTH, HEIGHT, DPI = 800, 500, 100
LOSS_LABEL = 'loss (nats per target token)'


def figure(rows: int = 1, **options):
  """(figure, axes) of `rows` plots stacked in one WIDTH x HEIGHT picture."""
  return plt.subplots(rows, 1, figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, **options)


def save_png(fig, path: str) -> None:
  """Writes `fig` as a PNG of exactly WIDTH x HEIGHT pixels (no tight bounding box)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=DPI, format='png')
  plt.close(fig)


def read_curves(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """{'loss': [(step, value), ...], 'eval_loss': [...]} of the workdir's metrics.jsonl, read and
  checked as a resumed run reads it; one line if there is nothing to draw."""
  curves = {'loss': [], 'eval_loss': []}
  for step, line in metrics_lib.read_history(workdir).rows:
    row = json.loads(line)
    for name, points in curves.items():
      if name in row:
        points.append((step, row[name]))
  if not curves['loss']:
    raise ValueError(f'{workdir} has no training losses in {metrics_lib.METRICS_FILE}; train '
                     'there first (make demo writes runs/demo)')
  return curves


def plot_run(curves: dict[str, list[tuple[int, float]]], title: str, out: str) -> None:
  fig, axes = figure()
  axes.plot(*zip(*curves['loss']), marker='.', label='training (mean over each log interval)')
  if curves['eval_loss']:
    axes.plot(*zip(*curves['eval_loss']), marker='o', label='held out (eval_loss)')
  axes.set(title=title, xlabel='step', ylabel=LOSS_LABEL)
  axes.grid(alpha=0.3)
  axes.legend()
  fig.tight_layout()
  save_png(fig, out)


def plot_pair(rows: list[dict], sides: tuple[tuple[str, str], tuple[str, str]], title: str,
              gap_label: str, out: str, zoom: bool = False) -> None:
  """Two held-out curves, `rows`' `{key}_eval_loss` for each (key, label) of `sides`, above, and
  the first minus the second below, against the step; `zoom`: the upper plot's range from the
  second row on (the first, at initialisation, far above)."""
  fig, (losses, gap) = figure(2, sharex=True, gridspec_kw={'height_ratios': (3, 1)})
  steps = [row['step'] for row in rows]
  curves = [[row[f'{key}_eval_loss'] for row in rows] for key, _ in sides]
  for (_, label), curve, style in zip(sides, curves, ('-', '--')):
    losses.plot(steps, curve, style, marker='o', markersize=3, label=label)
  if zoom and len(rows) > 1:
    low, high = min(min(c[1:]) for c in curves), max(max(c[1:]) for c in curves)
    losses.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
  losses.set(title=title, ylabel=f'held-out {LOSS_LABEL}')
  losses.legend()
  gap.plot(steps, [a - b for a, b in zip(*curves)], marker='o', markersize=3, color='black')
  gap.axhline(0, color='gray', linewidth=0.8)
  gap.set(xlabel='step', ylabel=gap_label)
  for axes in (losses, gap):
    axes.grid(alpha=0.3)
  fig.tight_layout()
  save_png(fig, out)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default=os.path.join(ROOT, 'runs', 'demo'))
  parser.add_argument('--out', default=os.path.join(ROOT, 'docs', 'images', 'demo_loss_curves.png'))
  args = parser.parse_args(argv)
  curves = read_curves(args.workdir)
  plot_run(curves, f'{os.path.basename(os.path.normpath(args.workdir))}: t5lite training run',
           args.out)
  print(json.dumps({'bench': 'loss_curves', 'workdir': args.workdir, 'png': args.out,
                    **{f'{name}_points': len(points) for name, points in curves.items()},
                    **{f'last_{name}': points[-1][1] for name, points in curves.items() if points},
                    }), flush=True)


if __name__ == '__main__':
  main()
