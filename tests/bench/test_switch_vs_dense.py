"""bench/switch_vs_dense.py at tiny scale: both presets shrunk alike, a few steps on one corpus."""

import contextlib
import io
import json
import pathlib
import sys

import pytest

from tests.bench.test_loss_curves import MAX_PNG_BYTES, png_size
from tests.test_cli_mistakes import TINY_SHAPE
from tests.texts import random_corpus

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / 'bench'))

import switch_vs_dense  # noqa: E402  pylint: disable=wrong-import-position


@pytest.mark.slow  # 187 s on 2 cores beside another benchmark
def test_both_presets_train_on_the_same_batches_and_are_compared(tmp_path):
  out = tmp_path / 'switch.png'
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    switch_vs_dense.main([
        '--steps=4', '--eval_every=2', '--eval_batches=1', f'--out={out}',
        *(flag for flag in TINY_SHAPE if 'train.steps' not in flag),
        '--config.model.encoder_sparse_step=1', '--config.model.decoder_sparse_step=1',
        f'--config.data.source={random_corpus(tmp_path / "text.txt")}'])
  lines = [json.loads(line) for line in printed.getvalue().splitlines()]
  rows, summary = lines[:-1], lines[-1]
  assert [row['step'] for row in rows] == [0, 2, 4]
  for name in switch_vs_dense.MODELS:
    losses = [row[f'{name}_eval_loss'] for row in rows]
    assert losses[-1] < losses[0]  # both learn
    assert summary[f'{name}_final_eval_loss'] == losses[-1]
  assert summary['eval_loss_gap'] == (summary['switch_tiny_final_eval_loss']
                                      - summary['t5_tiny_final_eval_loss'])
  assert summary['step_time_ratio'] == pytest.approx(
      summary['switch_tiny_step_s'] / summary['t5_tiny_step_s'], rel=0.01)  # rounded to 0.1 ms
  # 1 layer a stack, sparse: the routers' 2 * d_model * 8 FLOPs a token above t5_tiny's
  assert 1 < summary['flops_ratio'] < 1.01
  assert summary['switch_tiny_params'] > summary['t5_tiny_params']
  assert png_size(out) == (800, 500) and out.stat().st_size < MAX_PNG_BYTES
  # redrawn from the printed lines alone, as docs/images/switch_vs_dense.png is
  printed_file, redrawn = tmp_path / 'printed.jsonl', tmp_path / 'redrawn.png'
  printed_file.write_text(printed.getvalue())
  assert switch_vs_dense.read_rows(str(printed_file)) == rows
  switch_vs_dense.main([f'--plot_from={printed_file}', f'--out={redrawn}'])
  assert png_size(redrawn) == (800, 500)

