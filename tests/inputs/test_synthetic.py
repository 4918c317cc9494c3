"""data.source='synthetic': random tokens in the objective's features, a function of (seed,
split, batch); and `t5lite train`, `eval`, `plan` and `data` on them with TensorFlow blocked."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from t5lite import config as config_lib
from t5lite.data import vocabulary
from t5lite.inputs import batches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, 'configs', 't5_tiny.py')


def synthetic_data(**change):
  data = config_lib.load(TINY).data
  data.update({'source': batches.SYNTHETIC, 'batch_size': 4, 'inputs_length': 32,
               'targets_length': 8, **change})
  return data


def take(data, count, split='train', **kwargs):
  kwargs = {'process_index': 0, 'process_count': 1, **kwargs}
  stream = batches.make_batches(data, split, **kwargs)
  return [next(stream) for _ in range(count)], stream.state()


def test_rows_are_random_tokens_in_the_encoder_decoder_features():
  (batch,), state = take(synthetic_data(), 1)
  assert state == {'batch': 1}
  assert {k: v.shape for k, v in batch.items()} == {
      'encoder_input_tokens': (4, 32), 'encoder_segment_ids': (4, 32),
      'encoder_positions': (4, 32), 'decoder_input_tokens': (4, 8),
      'decoder_segment_ids': (4, 8), 'decoder_positions': (4, 8),
      'decoder_target_tokens': (4, 8), 'decoder_loss_weights': (4, 8)}
  assert all(v.dtype == np.int32 for v in batch.values())
  vocab_size = vocabulary.load_vocabulary('bundled').vocab_size
  for name in ('encoder_input_tokens', 'decoder_target_tokens'):
    assert batch[name].min() >= 3 and batch[name].max() < vocab_size
    assert len(np.unique(batch[name])) > 0.9 * batch[name].size  # random, not a constant
  np.testing.assert_array_equal(batch['decoder_input_tokens'][:, 0], 0)
  np.testing.assert_array_equal(batch['decoder_input_tokens'][:, 1:],
                                batch['decoder_target_tokens'][:, :-1])
  np.testing.assert_array_equal(batch['encoder_positions'], np.tile(np.arange(32), (4, 1)))
  assert (batch['encoder_segment_ids'] == 1).all() and (batch['decoder_loss_weights'] == 1).all()


def test_next_sentence_rows_split_in_half_and_flip_a_coin():
  (batch,), _ = take(synthetic_data(objective='mlm_nsp', targets_length=0, batch_size=64), 1)
  np.testing.assert_array_equal(batch['encoder_token_types'][0], [0] * 16 + [1] * 16)
  assert batch['next_sentence_labels'].shape == (64,)
  assert 16 < batch['next_sentence_labels'].sum() < 48


def test_batch_k_is_the_same_resumed_and_on_any_process_count():
  data = synthetic_data()
  straight, _ = take(data, 3)
  resumed, _ = take(data, 1, start={'batch': 2})
  halves = [take(data, 3, process_index=p, process_count=2)[0] for p in (0, 1)]
  for name in straight[2]:
    np.testing.assert_array_equal(resumed[0][name], straight[2][name])
    for k in range(3):
      np.testing.assert_array_equal(
          np.concatenate([halves[0][k][name], halves[1][k][name]]), straight[k][name])
  assert not np.array_equal(straight[0]['encoder_input_tokens'],
                            straight[1]['encoder_input_tokens'])


def test_splits_and_seeds_differ():
  def tokens(data, split='train'):
    return take(data, 1, split)[0][0]['encoder_input_tokens']
  first = tokens(synthetic_data())
  np.testing.assert_array_equal(tokens(synthetic_data()), first)
  assert not np.array_equal(tokens(synthetic_data(), 'validation'), first)
  assert not np.array_equal(tokens(synthetic_data(seed=1)), first)


def test_lengths_are_checked_as_for_text():
  with pytest.raises(ValueError, match='targets_length=2 is too short'):
    take(synthetic_data(targets_length=2), 1)


BLOCKED = """
import json, sys
sys.modules['tensorflow'] = None  # `import tensorflow` raises ImportError from here on
from t5lite import cli
workdir, tiny = sys.argv[1:]
flags = ['--config=' + tiny, '--config.data.source=synthetic', '--config.data.batch_size=8',
         '--config.data.inputs_length=32', '--config.data.targets_length=8',
         '--config.model.num_encoder_layers=1', '--config.model.num_decoder_layers=1']
statuses = [
    cli.main(['train', '--workdir=' + workdir, *flags, '--config.train.steps=3',
              '--config.train.log_every=1', '--config.train.eval_every=3',
              '--config.train.eval_batches=2']),
    cli.main(['eval', '--workdir=' + workdir]),
    cli.main(['plan', '--config=configs/t5_1_1_base.py', '--topology=cpu:1', '--analytic']),
    cli.main(['data', *flags, '--show=1']),
]
loaded = sorted(m for m, module in sys.modules.items() if m.startswith('tensorflow') and module)
print(json.dumps({'statuses': statuses, 'tensorflow_modules': loaded}))
"""


@pytest.mark.slow  # four commands in processes of their own: about 35 s on 2 cores
def test_train_eval_plan_and_data_run_with_tensorflow_blocked(tmp_path):
  workdir = tmp_path / 'run'
  one_device = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  out = subprocess.run([sys.executable, '-c', BLOCKED, str(workdir), TINY], cwd=ROOT,
                       env=one_device, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert json.loads(lines[-1]) == {'statuses': [0, 0, 0, 0], 'tensorflow_modules': []}, (
      out.stderr[-2000:])
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  losses = {row['step']: row['loss'] for row in rows if 'loss' in row}
  assert sorted(losses) == [1, 2, 3]
  assert all(9.0 < loss < 10.5 for loss in losses.values())  # about ln(32128) = 10.38 at init
  evaluation = json.loads(next(line for line in lines if line.startswith('{"step"')))
  assert evaluation['step'] == 3
  assert evaluation['eval_loss'] == pytest.approx(rows[-1]['eval_loss'], rel=1e-6)
  assert 'example 0 (32 input tokens, 8 target tokens)' in out.stdout
  # TensorBoard reads the events written without TensorFlow: the same losses, step by step
  events = event_accumulator.EventAccumulator(str(workdir / 'tensorboard'))
  events.Reload()
  assert {e.step: e.value for e in events.Scalars('loss')} == pytest.approx(losses, rel=1e-6)
