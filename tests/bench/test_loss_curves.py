"""The pictures' scripts at tiny scale: a run's metrics.jsonl drawn by bench/loss_curves.py, and
bench/learning_curve.py training t5lite and transformers' T5 from the same weights on the same
batches, whose held-out losses must start equal and stay together while they fall."""

import contextlib
import io
import json
import pathlib
import sys

import matplotlib.image
import numpy as np
import pytest

from t5lite.train import metrics as metrics_lib
from tests.test_cli_mistakes import TINY_RUN
from tests.texts import random_corpus

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / 'bench'))

import learning_curve  # noqa: E402  pylint: disable=wrong-import-position
import loss_curves  # noqa: E402  pylint: disable=wrong-import-position

# The pictures the docs show, as the scripts' defaults write them.
DOCS_PICTURES = ('demo_loss_curves.png', 'learning_curve_t5_tiny.png', 'switch_vs_dense.png')
MAX_PNG_BYTES = 100_000


def png_size(path) -> tuple[int, int]:
  """(width, height) of a PNG that decodes whole; fails on anything else."""
  assert pathlib.Path(path).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  pixels = matplotlib.image.imread(path)  # every pixel: a truncated file fails here
  return pixels.shape[1], pixels.shape[0]


def test_loss_curves_draw_a_runs_metrics(tmp_path, capsys):
  """Rows as a run writes them (its own writer): compile time at step 0, a training loss per log
  interval, eval rows every second one."""
  workdir, out = str(tmp_path), tmp_path / 'curves.png'
  writer = metrics_lib.MetricWriter(workdir, 0, metrics_lib.read_history(workdir))
  writer.write(0, {'compile_seconds': 12.5})
  for step in (50, 100, 150, 200):
    writer.write(step, {'loss': 9 - step / 50, 'accuracy': step / 1000, **(
        {'eval_loss': 8.5 - step / 50, 'eval_accuracy': 0.2} if step % 100 == 0 else {})})
  writer.close()
  loss_curves.main([f'--workdir={workdir}', f'--out={out}'])
  printed = json.loads(capsys.readouterr().out)

  assert loss_curves.read_curves(workdir) == {'loss': [(50, 8), (100, 7), (150, 6), (200, 5)],
                                              'eval_loss': [(100, 6.5), (200, 4.5)]}
  assert printed == {'bench': 'loss_curves', 'workdir': workdir, 'png': str(out),
                     'loss_points': 4, 'eval_loss_points': 2, 'last_loss': 5.0,
                     'last_eval_loss': 4.5}
  assert png_size(out) == (loss_curves.WIDTH, loss_curves.HEIGHT) == (800, 500)
  assert out.stat().st_size < MAX_PNG_BYTES


def test_loss_curves_refuse_a_workdir_without_training(tmp_path):
  with pytest.raises(ValueError, match='has no training losses in metrics.jsonl'):
    loss_curves.main([f'--workdir={tmp_path}', f'--out={tmp_path / "curves.png"}'])
  assert not (tmp_path / 'curves.png').exists()


@pytest.fixture(scope='module')
def comparison(tmp_path_factory):
  """(eval rows, summary, PNG path) of 6 steps of both sides, evaluated every 3."""
  folder = tmp_path_factory.mktemp('learning_curve')
  out = folder / 'curve.png'
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    learning_curve.main([*TINY_RUN, '--config.train.steps=6', '--config.train.eval_every=3',
                         '--config.train.eval_batches=1', '--config.optim.warmup_steps=1',
                         '--config.optim.learning_rate=3e-3',  # the tiny model drops 2 nats
                         f'--config.data.source={random_corpus(folder / "text.txt")}',
                         f'--out={out}'])
  lines = [json.loads(line) for line in printed.getvalue().splitlines()]
  assert all(line['bench'] == 'learning_curve' for line in lines)
  return [line for line in lines if 'step' in line], lines[-1], out


@pytest.mark.slow
def test_both_sides_start_equal_and_learn_alike(comparison):
  rows, summary, out = comparison
  assert [row['step'] for row in rows] == [0, 3, 6]
  t5lite = np.array([row['t5lite_eval_loss'] for row in rows])
  hf_torch = np.array([row['hf_torch_eval_loss'] for row in rows])
  # Same weights, same held-out batches: measured 1e-7 apart at step 0 and 1.4e-6 at step 6
  # (float32); from transformers' own initialisation the loss starts at 44.5 on this batch.
  assert abs(t5lite[0] - hf_torch[0]) / hf_torch[0] < 1e-5
  np.testing.assert_allclose(t5lite, hf_torch, rtol=1e-4)
  for losses in (t5lite, hf_torch):  # from ln(8192) = 9.0 or so, down by more than a nat
    # (measured 9.68, 8.17, 7.53)
    assert 8.5 < losses[0] < 10.5 and np.all(np.diff(losses) < 0) and losses[-1] < losses[0] - 1
  for row in rows[1:]:  # the training step's losses agree too
    assert row['t5lite_train_loss'] == pytest.approx(row['hf_torch_train_loss'], rel=1e-4)
  assert summary['t5lite_final_eval_loss'] == t5lite[-1]
  assert summary['hf_torch_final_eval_loss'] == hf_torch[-1]
  assert summary['max_eval_gap'] == pytest.approx(np.max(np.abs(t5lite - hf_torch)))
  assert summary['steps'] == 6 and summary['optim_name'] == 'adamw'
  assert png_size(out) == (800, 500) and out.stat().st_size < MAX_PNG_BYTES


@pytest.mark.parametrize('override, message', [
    ('--config.optim.name=adafactor', "config.optim.name='adafactor': the PyTorch side"),
    ('--config.train.z_loss=1e-4', 'config.train.z_loss=0.0001: the PyTorch side'),
    ('--config.train.eval_every=0', 'eval_every must be at least 1'),
])
def test_learning_curve_refuses_what_pytorch_would_not_match(override, message):
  with pytest.raises(ValueError, match=message):
    learning_curve.load_config(TINY_RUN[0].partition('=')[2], [override])


def test_learning_curve_refuses_packed_rows():
  ones = np.ones((2, 8), np.int32)
  learning_curve.one_example_per_row({'encoder_segment_ids': ones, 'decoder_segment_ids': ones})
  with pytest.raises(ValueError, match='pack several examples per row'):
    learning_curve.one_example_per_row({'encoder_segment_ids': 2 * ones,
                                        'decoder_segment_ids': ones})


@pytest.mark.parametrize('name', DOCS_PICTURES)
def test_the_docs_pictures_are_small_pngs(name):
  path = ROOT / 'docs' / 'images' / name
  assert png_size(path) == (800, 500) and path.stat().st_size < MAX_PNG_BYTES
