"""The family's presets through the `t5lite` command on CPU: each trains (20 steps of a tiny
model: the loss falls) and `t5lite data --show` renders its objective."""

import json
import os

import numpy as np
import pytest

from t5lite import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Any preset shrunk to seconds per run: width 64, the bundled vocabulary, batch 8, and the
# preset's AdamW at a constant 3e-3 (no warmup) so that 20 steps show learning.
TINY = ['--config.model.vocab_size=8192', '--config.model.d_model=64', '--config.model.d_ff=128',
        '--config.model.num_heads=2', '--config.model.d_kv=32', '--config.model.max_length=64',
        '--config.data.batch_size=8', '--config.train.steps=20', '--config.train.log_every=1',
        '--config.train.eval_every=0', '--config.checkpoint.async_save=false',
        '--config.optim.schedule=constant', '--config.optim.learning_rate=3e-3']
ONE_ENCODER_LAYER = ['--config.model.num_encoder_layers=1']
ONE_DECODER_LAYER = ['--config.model.num_decoder_layers=1']
# name -> (preset, flags): one layer per stack, short rows.
RUNS = {
    # next-sentence prediction: 32 pairs a step, so that its noise does not hide the MLM's fall
    'bert': ('bert_base', ONE_ENCODER_LAYER + ['--config.data.inputs_length=32',
                                               '--config.data.batch_size=32']),
    'roberta': ('roberta_base', ONE_ENCODER_LAYER + ['--config.data.inputs_length=32']),
    'gpt': ('gpt2_small', ONE_DECODER_LAYER + ['--config.data.targets_length=32']),
    'gpt_prefix_lm': ('gpt2_small', ONE_DECODER_LAYER + [
        '--config.data.objective=prefix_lm', '--config.data.inputs_length=16',
        '--config.data.targets_length=16']),
    'transformer': ('transformer_base', ONE_ENCODER_LAYER + ONE_DECODER_LAYER + [
        '--config.data.inputs_length=32', '--config.data.targets_length=8']),
    'bart': ('bart_base', ONE_ENCODER_LAYER + ONE_DECODER_LAYER + [
        '--config.data.inputs_length=32', '--config.data.targets_length=32']),
}


def flags(name: str) -> list[str]:
  preset, extra = RUNS[name]
  return [f'--config={os.path.join(ROOT, "configs", preset + ".py")}', *TINY, *extra]


def losses(workdir) -> list[float]:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  return [row['loss'] for row in sorted(rows, key=lambda r: r['step']) if 'loss' in row]


@pytest.mark.slow  # 7-31 s a family on 2 cores, most over 15
@pytest.mark.parametrize('name', sorted(RUNS))
def test_twenty_steps_lower_the_loss(tmp_path, name):
  assert cli.main(['train', f'--workdir={tmp_path}', *flags(name)]) == 0
  loss = losses(tmp_path)
  print(f'{name}: loss {loss[0]:.3f} -> {loss[-1]:.3f}')
  assert len(loss) == 20 and np.isfinite(loss).all()
  assert np.mean(loss[-3:]) < np.mean(loss[:3]) - 0.5, loss


@pytest.mark.parametrize('name', sorted(RUNS))
def test_data_show_renders_each_objective(capsys, name):
  assert cli.main(['data', *flags(name), '--show=2']) == 0
  shown = capsys.readouterr().out
  assert shown.count('example ') == 2 and shown.count('targets: ') == 2
  masked = name in ('bert', 'roberta', 'transformer', 'bart')  # a mask or sentinel in the inputs
  assert ('<extra_id_0>' in shown.split('targets:')[0]) == masked
  if name == 'gpt_prefix_lm':
    assert 'inputs:  \n' not in shown  # a prefix is shown as the inputs


@pytest.mark.parametrize('change, message', [
    (['--config.data.objective=mlm'],
     "model.next_sentence=True trains with data.objective='mlm_nsp'"),
    (['--config.model.arch=decoder', '--config.model.num_decoder_layers=1'],
     'model.next_sentence is BERT'),
])
def test_next_sentence_without_its_objective_fails_in_one_line(tmp_path, capsys, change, message):
  assert cli.main(['train', f'--workdir={tmp_path}', *flags('bert'), *change]) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0], error
