"""Loss spikes (t5lite/train/spikes.py): the moving statistics, each policy on a spike made on
purpose, exact resume around a rollback, and settings refused before anything is written.

The spike is real: the test's one seam replaces `batches.make_batches` with a wrapper whose
training batch number POISONED has every target token replaced by one rare id, which the model
predicts badly; each run sees it at the step that reads that batch."""

import json
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from launch.local import launch_local
from t5lite import cli
from t5lite import config as config_lib
from t5lite.inputs import batches as batches_lib
from t5lite.train import spikes
from tests.train.test_loop import ROOT, metrics, saved_params, train

POISONED = 6  # read by step 7
RARE_ID = 4000
SPIKES = ['--config.train.spikes.window=3']


class Poisoned:
  """The training batches, batch number POISONED's targets all RARE_ID; `read` lists the batch
  numbers handed out; `stop_at` raises KeyboardInterrupt (a kill, nothing saved) there."""

  def __init__(self, batches, read: list, stop_at: int | None):
    self._batches, self._read, self._stop_at = batches, read, stop_at

  def __iter__(self):
    return self

  def __next__(self):
    number = self._batches.state()['batch']
    if number == self._stop_at:
      raise KeyboardInterrupt
    batch = next(self._batches)
    self._read.append(number)
    if number == POISONED:
      weights = batch['decoder_loss_weights']
      batch = dict(batch, decoder_target_tokens=np.where(weights > 0, RARE_ID, 0).astype(np.int32))
    return batch

  def state(self):
    return self._batches.state()

  def close(self):
    self._batches.close()


@pytest.fixture
def poison(monkeypatch):
  """Makes the training batches `Poisoned`; returns the batch numbers read, and a setter of the
  batch to stop at."""
  real, read, stop_at = batches_lib.make_batches, [], [None]

  def make_batches(data, split='train', **kwargs):
    batches = real(data, split, **kwargs)
    return Poisoned(batches, read, stop_at[0]) if split == 'train' else batches
  monkeypatch.setattr(batches_lib, 'make_batches', make_batches)
  return read, stop_at


def config_of(**values) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(dict(
      policy='stop', window=3, threshold=4.0, ceiling=0.0, skip_limit=5, skip_window=1000),
      **values))


def test_the_statistics_are_the_plain_mean_and_variance_then_a_moving_one_and_a_spike_stays_out():
  losses = [5.0, 4.0, 6.0, 5.5, 50.0, 5.0]
  stats, found = spikes.init_stats(), []
  for step, loss in enumerate(losses, 1):
    stats, _, step_metrics = spikes.observe(stats, step, jnp.float32(loss), jnp.float32(1.0),
                                            config_of())
    found.append(float(step_metrics['spike']))
    if step == 3:  # the first `window` values: their mean and (population) variance
      np.testing.assert_allclose([stats.loss_mean, stats.loss_var], [5.0, 2 / 3], rtol=1e-6)
      assert float(step_metrics['loss_z']) == 0  # no decision before `window` steps
  assert found == [0, 0, 0, 0, 1, 0]
  # 5.5 and 5.0 entered with weight 1/window each (the mean after 5.5: 5 + 0.5/3); 50 never
  np.testing.assert_allclose(float(stats.loss_mean), (5.0 + 0.5 / 3) * 2 / 3 + 5.0 / 3, rtol=1e-6)
  assert int(stats.seen) == 5 and int(stats.action_step) == 5
  np.testing.assert_allclose(float(stats.action_loss), 50.0)


def test_every_statistic_is_its_own_array_as_a_donated_train_state_needs():
  # two leaves of one buffer, donated twice, crashed XLA:CPU (a fine-tuning run's from_params)
  leaves = jax.tree.leaves(spikes.init_stats())
  assert len({id(leaf) for leaf in leaves}) == len(leaves) == 14


def test_a_loss_past_the_ceiling_is_a_spike_from_the_second_step():
  """The first loss sets the ceiling (4x here); the spike stays out of the statistics, so that the
  ceiling and the mean stay where the healthy steps put them."""
  stats, found = spikes.init_stats(), []
  for step, loss in enumerate([9.0, 8.0, 36.5, 35.0, 7.0], 1):
    stats, _, _ = spikes.observe(stats, step, jnp.float32(loss), jnp.float32(1.0),
                                 config_of(window=100, ceiling=4.0))
    found.append(int(stats.action_step))
  assert found == [-1, -1, 3, 3, 3]  # 36.5 > 4 x 9; 35 is not
  assert int(stats.seen) == 4 and float(stats.loss_start) == 9.0
  stats, _, step_metrics = spikes.observe(spikes.init_stats(), 1, jnp.float32(9.0),
                                          jnp.float32(1.0), config_of(ceiling=0.0))
  stats, _, step_metrics = spikes.observe(stats, 2, jnp.float32(1e6), jnp.float32(1.0),
                                          config_of(window=100, ceiling=0.0))
  assert float(step_metrics['spike']) == 0  # ceiling 0: off, and no z-score yet


def test_z_scores_decide_once_ten_healthy_steps_are_in_the_statistics():
  """Three nearly equal losses make a tiny variance: the fourth, a little higher, lies thousands
  of deviations above them, and is healthy. With `window` 100 the z-scores decide from the
  11th step (FIRST_DECISION), with `window` 3 from the 4th."""
  losses = [9.0, 9.001, 9.002, 9.1] + [9.0] * 6 + [9.5]
  for window, expected in ((100, 11), (3, 4)):
    stats = spikes.init_stats()
    for step, loss in enumerate(losses, 1):
      stats, _, step_metrics = spikes.observe(stats, step, jnp.float32(loss), jnp.float32(1.0),
                                              config_of(window=window, ceiling=4.0))
    assert int(stats.action_step) == expected, window


def test_skip_withholds_updates_and_escalates_past_its_limit():
  stats, withheld = spikes.init_stats(), []
  for step, loss in enumerate([5.0, 4.0, 6.0, 60.0, 5.0, 70.0, 80.0], 1):
    stats, held, _ = spikes.observe(stats, step, jnp.float32(loss), jnp.float32(1.0),
                                    config_of(policy='skip', skip_limit=2))
    withheld.append(bool(held))
  assert withheld == [False, False, False, True, False, True, True]
  assert int(stats.skipped) == 2 and int(stats.action_step) == 7  # the third spike rolls back


def test_skipping_batches_jump_over_the_ranges_and_report_the_position():
  class Counting:
    def __init__(self, start):
      self.k = batches_lib.own_position(start, 0)['batch']

    def __next__(self):
      self.k += 1
      return self.k - 1

    def state(self):
      return {'batch': self.k}

    def close(self):
      pass

  batches = batches_lib.SkippingBatches(Counting, 0, [(2, 5), (5, 7), (9, 10)])
  assert [next(batches) for _ in range(5)] == [0, 1, 7, 8, 10]
  assert batches.state() == {'batch': 11}
  assert next(batches_lib.SkippingBatches(Counting, {'batch': 3}, [(2, 5)])) == 5


def the_rollback(workdir) -> tuple[int, int, list[int]]:
  """(spike step, checkpoint, [first, end) batches) of the one rollback `workdir` records."""
  with open(workdir / batches_lib.SKIPPED_FILE, encoding='utf-8') as f:
    (record,) = json.load(f)['rollbacks']
  return record['step'], record['checkpoint'], record['batches']


def spiking_run(workdir, policy: str, *flags) -> int:
  return train(workdir, f'--config.train.spikes.policy={policy}', *SPIKES, *flags)


@pytest.mark.slow  # a run of 7 steps, compiled: 25 s on 2 shared cores (4 s once compiled)
def test_stop_names_the_step_and_saves_nothing_after_it(tmp_path, capsys, poison):
  assert spiking_run(tmp_path, 'stop', '--config.train.steps=10',
                     '--config.checkpoint.every_steps=4') == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and 'loss spike at step 7: loss ' in error[0], error
  assert 'latest checkpoint: 4' in error[0]
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4']


@pytest.mark.slow  # two runs of 8 steps: 34 s on 2 shared cores (66-120 s beside other jobs)
def test_skip_leaves_the_params_as_before_the_step_and_a_healthy_run_unchanged(tmp_path, poison):
  flags = ['--config.train.steps=8', '--config.checkpoint.every_steps=1',
           '--config.checkpoint.keep=10']
  assert spiking_run(tmp_path / 'skip', 'skip', *flags) == 0
  rows = metrics(tmp_path / 'skip')
  assert [rows[step]['spike'] for step in range(1, 9)] == [0, 0, 0, 0, 0, 0, 1, 0]
  assert rows[7]['skipped_steps'] == rows[8]['skipped_steps'] == 1
  assert rows[7]['grad_norm_z'] > 8  # the threshold; 38 on 2026-11-28 (the loss's z: 0.03)
  before, after = saved_params(tmp_path / 'skip', 6), saved_params(tmp_path / 'skip', 7)
  for name in before:
    np.testing.assert_array_equal(before[name], after[name], err_msg=name)
  assert any(not np.array_equal(after[name], value)
             for name, value in saved_params(tmp_path / 'skip', 8).items())
  # the same run with spikes off: bit for bit the same losses up to the spike
  assert spiking_run(tmp_path / 'off', 'off', *flags) == 0
  off = metrics(tmp_path / 'off')
  assert [off[step]['loss'] for step in range(1, 8)] == [rows[step]['loss'] for step in range(1, 8)]
  assert 'spike' not in off[1] and 'skipped_steps' not in off[1]


@pytest.mark.slow  # a rollback, the same run killed and resumed: 37 s on 2 shared cores
def test_rollback_skips_the_batches_and_a_killed_run_resumes_them_exactly(tmp_path, poison,
                                                                          capsys):
  read, stop_at = poison
  flags = ['--config.train.steps=10', '--config.checkpoint.every_steps=4',
           '--config.train.spikes.rollback_skip_after=2']
  assert spiking_run(tmp_path / 'straight', 'rollback', *flags) == 0
  assert 'rollback: loss spike at step 7: loss ' in capsys.readouterr().out
  # back to checkpoint 4 (batches 0-3 read); batches 4 up to the spike's 6, and 2 more, dropped
  assert the_rollback(tmp_path / 'straight') == (7, 4, [4, 9])
  with open(tmp_path / 'straight' / 'checkpoints' / '10' / 'data' / 'metadata',
            encoding='utf-8') as f:
    assert json.load(f)['processes'][0]['batch'] == 15  # steps 5-10 read batches 9-14
  # read ahead before the rollback: 7; after it, from 9 on
  assert read[read.index(POISONED) + 1:][:7] == [7, 9, 10, 11, 12, 13, 14]
  straight = metrics(tmp_path / 'straight')
  # `t5lite data` sees the same history: the batches of steps 1-6 are 0-3, then 9 and 10
  assert cli.main(['data', f'--workdir={tmp_path / "straight"}', '--num_batches=6',
                   f'--out={tmp_path / "read.npz"}']) == 0
  batches_lib.write_batches(config_lib.from_workdir(str(tmp_path / 'straight')), 11,
                            str(tmp_path / 'all.npz'))  # none skipped
  with np.load(tmp_path / 'read.npz') as read_by_steps, np.load(tmp_path / 'all.npz') as every:
    for name in every:
      np.testing.assert_array_equal(read_by_steps[name], every[name][[0, 1, 2, 3, 9, 10]])

  del read[:]
  stop_at[0] = 11  # killed at step 6 of the run after its rollback, nothing saved since step 4
  assert spiking_run(tmp_path / 'resumed', 'rollback', *flags) == 130
  assert sorted(os.listdir(tmp_path / 'resumed' / 'checkpoints')) == ['4']
  stop_at[0] = None
  assert spiking_run(tmp_path / 'resumed', 'rollback', *flags) == 0
  resumed = metrics(tmp_path / 'resumed')
  assert [resumed[step]['loss'] for step in range(1, 11)] == [
      straight[step]['loss'] for step in range(1, 11)]
  for name, value in saved_params(tmp_path / 'straight', 10).items():
    np.testing.assert_array_equal(value, saved_params(tmp_path / 'resumed', 10)[name])


@pytest.mark.parametrize('flags, message', [
    (['--config.train.spikes.window=-1'], 'config.train.spikes.window=-1 must be at least 1'),
    (['--config.train.spikes.threshold=0'], 'config.train.spikes.threshold=0.0 must be positive'),
    (['--config.train.spikes.policy=retry'], "policy='retry' is not one of off, stop, skip"),
    (['--config.train.spikes.ceiling=1'], 'config.train.spikes.ceiling=1.0 must be above 1'),
    (['--config.train.spikes.ceiling=-2'], 'config.train.spikes.ceiling=-2.0 must be above 1'),
    (['--config.train.spikes.max_rollbacks=0'],
     'config.train.spikes.max_rollbacks=0 must be at least 1'),
])
def test_bad_spike_settings_are_one_line_and_write_nothing(tmp_path, capsys, flags, message):
  workdir = tmp_path / 'run'
  assert train(workdir, '--config.train.steps=10', *flags) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0], error
  assert not workdir.exists()


@pytest.mark.slow  # a rollback to the start and a run skipping the same batches: 40 s
def test_a_rollback_with_no_checkpoint_before_the_spike_goes_back_to_the_start(tmp_path, capsys,
                                                                            poison):
  """Back to the random init, the same bits again: the run goes on exactly as a run that skipped
  the same batches from its start."""
  flags = ['--config.train.steps=10', '--config.checkpoint.every_steps=8',
           '--config.train.spikes.rollback_skip_after=2']
  assert spiking_run(tmp_path / 'rolled', 'rollback', *flags) == 0
  assert 'back to step 0, batches 0 to 8 skipped' in capsys.readouterr().out
  assert the_rollback(tmp_path / 'rolled') == (7, 0, [0, 9])
  (tmp_path / 'skipping').mkdir()
  (tmp_path / 'skipping' / batches_lib.SKIPPED_FILE).write_text(
      json.dumps({'rollbacks': [{'batches': [0, 9]}]}), encoding='utf-8')
  assert spiking_run(tmp_path / 'skipping', 'rollback', *flags) == 0
  rolled, skipping = metrics(tmp_path / 'rolled'), metrics(tmp_path / 'skipping')
  assert [rolled[step]['loss'] for step in range(1, 11)] == [
      skipping[step]['loss'] for step in range(1, 11)]
  np.testing.assert_equal(saved_params(tmp_path / 'rolled', 10),
                          saved_params(tmp_path / 'skipping', 10))


@pytest.mark.parametrize('text, message', [
    ('{"rollbacks": [{"batches": [5]}]}', 'rollbacks[0]: batches must be [first, end]'),
    ('{"rollbacks": 3}', 'rollbacks'),
    ('[1, 2', 'skipped_batches.json'),
])
def test_a_damaged_record_of_skipped_batches_is_one_line_and_changes_nothing(tmp_path, capsys,
                                                                            text, message):
  (tmp_path / batches_lib.SKIPPED_FILE).write_text(text, encoding='utf-8')
  assert train(tmp_path, '--config.train.steps=10') == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0] and batches_lib.SKIPPED_FILE in error[0], error
  assert os.listdir(tmp_path) == [batches_lib.SKIPPED_FILE]
  assert (tmp_path / batches_lib.SKIPPED_FILE).read_text(encoding='utf-8') == text


# A learning rate that climbs to 1 in 20 steps (AdamW, linear warm-up) on a 1+1-layer t5_tiny of
# width 64 and synthetic batches: from step 4 the gradient norm lies 7 to 64 deviations above its
# moving mean (window 3) on most steps, some of them near the threshold of 6.
DIVERGING = ['--config=' + os.path.join(ROOT, 'configs', 't5_tiny.py'),
             '--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
             '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
             '--config.model.num_decoder_layers=1', '--config.data.batch_size=8',
             '--config.data.inputs_length=32', '--config.data.targets_length=8',
             '--config.data.source=synthetic', '--config.train.steps=24',
             '--config.train.log_every=1', '--config.train.eval_every=0',
             '--config.checkpoint.every_steps=1000', '--config.optim.name=adamw',
             '--config.optim.schedule=cosine', '--config.optim.learning_rate=1',
             '--config.optim.warmup_steps=20', '--config.train.spikes.policy=skip',
             '--config.train.spikes.window=3', '--config.train.spikes.threshold=6',
             '--config.train.spikes.skip_limit=100']


@pytest.mark.slow  # two runs of 24 steps, in 1 and 2 processes: 45 s on 2 cores
def test_two_processes_skip_the_same_steps_as_one(tmp_path):
  """The decision is taken on the global loss and gradient norm: one process of 4 devices and
  two of 2 skip the same 12 steps, with the same losses, bit for bit."""
  env = dict(JAX_COMPILATION_CACHE_DIR=str(tmp_path / 'cache'),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  runs = {}
  for processes, devices in ((1, 4), (2, 2)):
    workdir = tmp_path / f'{processes}x{devices}'
    assert launch_local([f'--workdir={workdir}', *DIVERGING], processes, devices, env=env,
                        timeout=300) == 0
    runs[processes] = [(row['step'], row['loss'], row['spike'], row['skipped_steps'])
                       for row in metrics(workdir).values()]
  assert runs[1] == runs[2]
  assert [step for step, _, spike, _ in runs[1] if spike] == [4, 5, 6, 7, 8, 10, 11, 12, 13, 14,
                                                             15, 20]
  assert runs[1][-1][3] == 12


# The run of issue #58 made small: AdamW at a learning rate of 3 reached in 8 warm-up steps, on
# the 1+1-layer model of width 64 and synthetic batches, every spike setting the default.
DIVERGING_AT_THE_START = [*DIVERGING[:11], '--config.train.steps=40', '--config.train.log_every=1',
                          '--config.train.eval_every=0', '--config.checkpoint.every_steps=1000',
                          '--config.optim.name=adamw', '--config.optim.schedule=cosine',
                          '--config.optim.learning_rate=3', '--config.optim.warmup_steps=8']


@pytest.mark.slow  # the run under stop, skip and rollback (6 runs of up to 40 steps): 50 s
def test_a_run_diverging_from_its_first_steps_is_caught_under_every_policy(tmp_path, capsys):
  """With the defaults, every policy sees the divergence at its start (the ceiling) and no
  diverged model is saved: `stop` ends there; `skip` skips, then rolls back; `rollback` goes back
  to the start 3 times (max_rollbacks), then stops. Each says so in one line, exit status 2."""
  for policy in ('stop', 'skip', 'rollback'):
    workdir = tmp_path / policy
    status = cli.main(['train', f'--workdir={workdir}', *DIVERGING_AT_THE_START,
                       f'--config.train.spikes.policy={policy}'])
    out, err = capsys.readouterr()
    assert status == 2 and len(err.strip().splitlines()) == 1, (policy, err)
    spike = re.search(r'loss spike at step (\d+): loss [0-9.]+ \(([0-9.]+)x the first', out + err)
    # the first spike each names: under skip, the sixth, which rolls back (skip_limit 5)
    assert spike and int(spike[1]) <= (12 if policy == 'skip' else 6), (policy, out, err)
    assert float(spike[2]) > 4, (policy, out, err)
    assert not os.listdir(workdir / 'checkpoints'), policy
    rollbacks = out.count('rollback: loss spike at step')
    assert rollbacks == {'stop': 0, 'skip': 3, 'rollback': 3}[policy], (policy, out)
    if policy == 'stop':
      assert 'nothing was saved after it (latest checkpoint: None)' in err
    else:
      assert '3 rollbacks already (train.spikes.max_rollbacks)' in err
      with open(workdir / batches_lib.SKIPPED_FILE, encoding='utf-8') as f:
        assert [r['checkpoint'] for r in json.load(f)['rollbacks']] == [0, 0, 0]
    if policy == 'skip':
      assert max(row.get('skipped_steps', 0) for row in metrics(workdir).values()) == 5


@pytest.mark.slow  # per case, two runs of 4 steps and a resumed one: 30 s on 2 shared cores
@pytest.mark.parametrize('left_out', ['spikes', 'loss_start'])
def test_a_checkpoint_saved_before_spike_statistics_resumes_with_fresh_ones(tmp_path, left_out):
  """A train state saved without `spikes` (by t5lite before 2026-11-28), or without its
  `loss_start` (before 2026-12-04), restores with the statistics it lacks made afresh (the first
  loss taken as the moving mean) and every other leaf as it was saved: the resumed run's losses
  are bit for bit those of the run that saved it."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  first, old = tmp_path / 'first', tmp_path / 'old'
  flags = ['--config.train.steps=4', '--config.checkpoint.every_steps=2']
  assert train(first, *flags) == 0
  assert train(old, '--config.train.steps=2', '--config.checkpoint.every_steps=2') == 0
  state_dir = old / 'checkpoints' / '2' / 'state'
  checkpointer = ocp.StandardCheckpointer()
  saved = checkpointer.restore(state_dir)
  if left_out == 'spikes':
    del saved['spikes']
  else:
    del saved['spikes']['loss_start']
  old_state = tmp_path / 'old_state'
  checkpointer.save(old_state, saved)
  checkpointer.wait_until_finished()
  os.rename(state_dir, tmp_path / 'with_spikes')
  os.rename(old_state, state_dir)
  restored = checkpointer.restore(state_dir)
  assert left_out not in {**restored, **restored.get('spikes', {})}
  assert train(old, *flags) == 0
  assert [metrics(old)[step]['loss'] for step in (3, 4)] == [
      metrics(first)[step]['loss'] for step in (3, 4)]
  np.testing.assert_equal(saved_params(old, 4), saved_params(first, 4))
