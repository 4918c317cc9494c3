"""`t5lite train` end to end on the bundled corpus: exact resume, NaN stop, SIGTERM, bad input,
a mixture's metrics per component."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t5lite import cli
from t5lite.train import loop
from t5lite.train import preemption

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# t5_tiny shrunk to seconds per run: 1+1 layers of width 64, 32 input / 8 target tokens.
SMALL = ['--config=' + os.path.join(ROOT, 'configs', 't5_tiny.py'),
         '--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
         '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
         '--config.model.num_decoder_layers=1', '--config.data.batch_size=8',
         '--config.data.inputs_length=32', '--config.data.targets_length=8',
         '--config.train.log_every=1', '--config.train.eval_every=0',
         '--config.checkpoint.async_save=false']  # mesh.data=-1: all 8 fake devices


def train(workdir, *flags) -> int:
  return cli.main(['train', f'--workdir={workdir}', *SMALL, *flags])


def one_device_env() -> dict:
  """The environment of a `t5lite` subprocess on 1 fake CPU device. Everything it compiles goes
  into the session's persistent cache (tests/conftest.py), however quick: the 1-device processes
  of every test file then compile the same steps once."""
  return dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=1',
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')


def metrics(workdir) -> dict[int, dict]:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return {row['step']: row for row in map(json.loads, f) if 'loss' in row}


def saved_params(workdir, step) -> dict[str, np.ndarray]:
  from t5lite.train import checkpoint as checkpoint_lib
  from t5lite import config as config_lib
  import orbax.checkpoint as ocp
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  tree = ocp.StandardCheckpointer().restore(path)
  del checkpoint_lib, config_lib
  flat = {}
  def walk(node, prefix):
    for key, value in node.items():
      (walk(value, f'{prefix}/{key}') if isinstance(value, dict) else
       flat.__setitem__(f'{prefix}/{key}', np.asarray(value)))
  walk(tree['params'], '')
  return flat


@pytest.mark.slow  # a run, the same run stopped and resumed: 21-25 s on 2 cores
def test_resumed_run_is_bitwise_identical_to_an_uninterrupted_one(tmp_path):
  straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
  assert train(straight, '--config.train.steps=6', '--config.checkpoint.every_steps=3') == 0
  assert train(resumed, '--config.train.steps=3', '--config.checkpoint.every_steps=3') == 0
  assert train(resumed, '--config.train.steps=6', '--config.checkpoint.every_steps=3') == 0
  a, b = metrics(straight), metrics(resumed)
  assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
  for step in a:
    assert a[step]['loss'] == b[step]['loss'], step
  params_a, params_b = saved_params(straight, 6), saved_params(resumed, 6)
  assert params_a.keys() == params_b.keys()
  for name in params_a:
    np.testing.assert_array_equal(params_a[name], params_b[name], err_msg=name)


def test_nan_loss_stops_before_saving(tmp_path, capsys):
  # An infinite z-loss coefficient makes the very first loss infinite.
  assert train(tmp_path, '--config.train.steps=4', '--config.train.z_loss=inf') == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and 'loss became NaN or Inf at step 1 (loss inf' in error[0], error
  assert not os.listdir(tmp_path / 'checkpoints')


@pytest.mark.parametrize('flags, message', [
    (['--config.mesh.data=3'], 'does not fit 8 devices'),
    (['--config.data.batch_size=6'],
     'data.batch_size=6 is not divisible by mesh.data*mesh.fsdp*mesh.expert=8'),
    (['--config.model.activation=swish'], "model.activation='swish' is not one of"),
    (['--config.optim.name=sgd'], 'sgd'),
    (['--config.train.microbatches=2'], 'train.microbatches=2 must divide data.batch_size=8'),
    (['--config.model.num_heads=3', '--config.mesh.tensor=2'],
     'model.num_heads=3 is not divisible by mesh.tensor=2'),
    (['--bogus=1'], 'unrecognized argument --bogus=1'),
])
def test_bad_settings_fail_in_one_line_before_compiling(tmp_path, capsys, flags, message):
  assert train(tmp_path, *flags) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0], error


class CountingPipeline:
  """Batches {'x': [[k]]} for k = 0, 1, ... up to `count`, with the pipeline's state()."""

  def __init__(self, count: int):
    self.count, self.k = count, 0

  def __next__(self):
    if self.k == self.count:
      raise StopIteration
    self.k += 1
    return {'x': np.full((1, 1), self.k - 1, np.int32)}

  def state(self):
    return {'batch': self.k}


def test_device_batches_run_ahead_but_report_the_position_of_the_last_handed_out():
  mesh = jax.make_mesh((1,), ('data',), devices=jax.devices()[:1])
  pipeline = CountingPipeline(5)
  batches = loop.DeviceBatches(pipeline, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec('data')), ahead=2)
  assert batches.state() == {'batch': 0}
  first = next(batches)
  assert int(first['x'][0, 0]) == 0 and isinstance(first['x'], jax.Array)
  assert pipeline.k == 2 and batches.state() == {'batch': 1}  # one waits on the device
  assert [int(b['x'][0, 0]) for b in batches] == [1, 2, 3, 4]
  assert batches.state() == {'batch': 5}



def test_logged_rows_hold_the_allocators_peak_where_the_backend_keeps_one(monkeypatch):
  """GPUs and TPUs report `peak_bytes_in_use`, and rows hold it in GiB; XLA:CPU reports no
  statistics, and rows say nothing of memory."""
  class Device:
    def __init__(self, stats):
      self.stats = stats

    def memory_stats(self):
      return self.stats

  assert loop.device_memory() == {}  # the CPU devices of this suite
  monkeypatch.setattr(jax, 'local_devices', lambda: [Device({'peak_bytes_in_use': 3 * 2**29})])
  assert loop.device_memory() == {'peak_memory_gib': 1.5}


def test_a_components_metrics_are_named_and_averaged_over_the_steps_where_it_had_tokens():
  def step(loss, losses, accuracies, tokens):
    return {'loss': loss, 'components': {'loss': np.array(losses), 'accuracy': np.array(accuracies),
                                         'target_tokens': np.array(tokens)}}

  steps = [step(2.0, [1.0, 3.0], [0.5, 0.25], [4.0, 4.0]),
           step(4.0, [4.0, 0.0], [0.25, 0.0], [8.0, 0.0])]  # no row of web in the second
  assert loop.mean_metrics(steps, ('books', 'web')) == {
      'loss': 3.0, 'loss/books': 2.5, 'accuracy/books': 0.375, 'target_tokens/books': 6.0,
      'loss/web': 3.0, 'accuracy/web': 0.25, 'target_tokens/web': 2.0}
  assert loop.named_metrics(steps[1], ('books', 'web')) == {
      'loss': 4.0, 'loss/books': 4.0, 'accuracy/books': 0.25, 'target_tokens/books': 8.0,
      'target_tokens/web': 0.0}


@pytest.mark.slow  # 30-40 s on 2 busy cores: pipelines of two components, three compiles
def test_a_mixture_run_logs_loss_and_accuracy_per_component(tmp_path):
  """The bundled corpus and a file repeating one phrase, mixed 1:1, in 2 microbatches: every
  train and eval row holds loss/NAME, accuracy/NAME and target_tokens/NAME of both, and their
  average weighted by target tokens is the row's loss."""
  echo = tmp_path / 'echo.txt'  # numbered, so that documents fall in both splits
  echo.write_text('\n\n'.join(f'{n} ' + 'the whale and the ship. ' * 8 for n in range(200)))
  workdir = tmp_path / 'run'
  assert train(workdir, '--config.train.steps=2', '--config.train.microbatches=2',
               '--config.data.batch_size=16',
               '--config.train.eval_every=2', '--config.train.eval_batches=2',
               '--config.data.mixture.corpus.source=bundled',
               '--config.data.mixture.corpus.weight=1', f'--config.data.mixture.echo.source={echo}',
               '--config.data.mixture.echo.weight=1',
               '--config.data.mixture.echo.validation_fraction=0.2') == 0
  rows = metrics(workdir)
  assert sorted(rows) == [1, 2] and 'eval_loss' in rows[2]
  for row, prefix in [(rows[1], ''), (rows[2], ''), (rows[2], 'eval_')]:
    per_component = {name: np.array([row[f'{prefix}{name}/{component}']
                                     for component in ('corpus', 'echo')])
                     for name in ('loss', 'accuracy', 'target_tokens')}
    assert np.all(per_component['target_tokens'] > 0), row
    assert np.all(np.isfinite(per_component['loss']) & (per_component['loss'] > 0)), row
    assert np.all((0 <= per_component['accuracy']) & (per_component['accuracy'] <= 1)), row
    assert_components_make_up(per_component, row[f'{prefix}target_tokens'],
                              {name: row[f'{prefix}{name}'] for name in ('loss', 'accuracy')},
                              rtol=1e-4)


def assert_components_make_up(per_component: dict, target_tokens, totals: dict,
                              rtol: float = 1e-5) -> None:
  """A mixture's metrics per component ({'loss': [G], 'accuracy': [G], 'target_tokens': [G]}) are
  those of parts of the batch: their target tokens add up to `target_tokens`, each of `totals`
  ({'loss': the batch's, ..}) is their average weighted by target tokens, and they differ."""
  tokens = per_component['target_tokens']
  np.testing.assert_allclose(np.sum(tokens), target_tokens)
  for name, total in totals.items():
    np.testing.assert_allclose(np.sum(per_component[name] * tokens) / target_tokens, total,
                               rtol=rtol, err_msg=name)
  assert len(set(np.asarray(per_component['loss']).tolist())) == len(tokens)
