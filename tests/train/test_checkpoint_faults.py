"""Checkpoints under faults: SIGKILL at random points (one inside a save), restore onto another
mesh and device count, a damaged checkpoint, an unwritable workdir, the Hugging Face round trip.

The killed runs are subprocesses on 1 fake device with asynchronous saves (what a user gets);
they share the session's persistent compilation cache, so a restart skips most of the compile.
The mesh and workdir tests run in this process on the 8 fake devices of tests/conftest.py. Every
run here reads synthetic batches: what is checked is the checkpoints, not the text pipeline (a
resumed text pipeline is tests/train/test_loop.py's and tests/data/test_store.py's), and a
process that reads no text never imports TensorFlow.
"""

import json
import os
import pwd
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

import jax
import ml_collections
import numpy as np
import pytest
import transformers
from flax import nnx

from t5lite import cli
from t5lite.data import vocabulary
from t5lite.models import EncoderDecoder
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import run as run_lib
from test_loop import ROOT, SMALL, metrics, one_device_env, saved_params, train
from tests.fs import acting_as, snapshot

TMP_SUFFIX = '.orbax-checkpoint-tmp'  # orbax writes step N here and renames it to N when complete
SYNTHETIC = '--config.data.source=synthetic'
STEPS, EVERY = 12, 2
KILLED_RUN = [*SMALL, SYNTHETIC, f'--config.train.steps={STEPS}',
              f'--config.checkpoint.every_steps={EVERY}', '--config.checkpoint.async_save=true']
STEP_LINE = re.compile(r'step (\d+)/')
MESH_222 = ['--config.mesh.data=2', '--config.mesh.fsdp=2', '--config.mesh.tensor=2']
MESH_421 = ['--config.mesh.data=4', '--config.mesh.fsdp=2', '--config.mesh.tensor=1']


def complete_steps(workdir) -> list[int]:
  return sorted(int(name) for name in os.listdir(os.path.join(workdir, 'checkpoints'))
                if name.isdigit())


def launch(workdir, kill=None) -> dict:
  """Runs `t5lite train` on 1 device to the end, or SIGKILLs it at `kill`: ('step', k) right
  after it prints step k (or a later one), ('save', s) while the save of step s (or a later
  one) is writing the train state's arrays. Returns what happened."""
  process = subprocess.Popen(
      [sys.executable, '-m', 't5lite', 'train', f'--workdir={workdir}', *KILLED_RUN], cwd=ROOT,
      env=one_device_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  printed, output = [], []

  def read():
    for line in process.stdout:
      output.append(line)
      if match := STEP_LINE.match(line):
        printed.append(int(match.group(1)))

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  in_save = None
  while kill and process.poll() is None:
    if kill[0] == 'step' and printed and printed[-1] >= kill[1]:
      break
    if kill[0] == 'save' and (in_save := writing_state(workdir, kill[1])) is not None:
      break
    time.sleep(0.001)
  killed = kill is not None and process.poll() is None
  if killed:
    process.send_signal(signal.SIGKILL)
  returncode = process.wait(timeout=300)
  reader.join()
  assert returncode == (-signal.SIGKILL if killed else 0), ''.join(output[-20:])
  return dict(first=printed[0] if printed else None, last=printed[-1] if printed else None,
              killed=killed, in_save=in_save, output=''.join(output))


def writing_state(workdir, from_step: int) -> int | None:
  """The step (from `from_step` on) whose save has begun writing the state's arrays, if any."""
  checkpoints = os.path.join(workdir, 'checkpoints')
  for name in os.listdir(checkpoints) if os.path.isdir(checkpoints) else ():
    if name.endswith(TMP_SUFFIX) and int(name[:-len(TMP_SUFFIX)]) >= from_step:
      temporary = os.path.join(checkpoints, name)
      if any(files for root, _, files in os.walk(temporary)
             if os.path.relpath(root, temporary).startswith('state')):
        return int(name[:-len(TMP_SUFFIX)])
  return None


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """The same run as the killed ones, never stopped."""
  workdir = tmp_path_factory.mktemp('uninterrupted')
  assert launch(workdir)['last'] == STEPS
  return workdir


def kill_and_resume(workdir, kill) -> dict:
  """One killed launch, checked: a kill inside a save leaves that step incomplete (only its
  temporary directory), and what a restart resumes from is the latest complete step."""
  before = complete_steps(workdir) if os.path.isdir(os.path.join(workdir, 'checkpoints')) else []
  result = launch(workdir, kill)
  assert result['killed'], f'the run ended before {kill}'
  listing = os.listdir(os.path.join(workdir, 'checkpoints'))
  if result['in_save'] is not None:
    assert f'{result["in_save"]}{TMP_SUFFIX}' in listing and str(result['in_save']) not in listing
  checkpointer = checkpoint_lib.Checkpointer(
      workdir, ml_collections.ConfigDict(dict(keep=1, keep_period=0, async_save=False)),
      read_only=True)
  latest = checkpointer.latest_step()
  checkpointer.close()
  complete = complete_steps(workdir)
  assert latest == (complete[-1] if complete else None)
  assert (latest or 0) >= max(before, default=0)
  if result['in_save'] is not None:
    assert (latest or 0) < result['in_save']
  result['resume_from'] = latest or 0
  print(f'killed at {kill}: last printed step {result["last"]}, '
        f'in save of {result["in_save"]}, latest complete checkpoint {latest}')
  return result


def assert_one_row_per_step_and_no_leftovers(workdir) -> None:
  """Rows of steps a killed run did past its checkpoint were dropped on resume, and the
  temporary directory of a save it was killed in is gone."""
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    assert [row['step'] for row in map(json.loads, f) if 'loss' in row] == list(
        range(1, STEPS + 1))
  assert not [name for name in os.listdir(os.path.join(workdir, 'checkpoints'))
              if name.endswith(TMP_SUFFIX)]


@pytest.mark.slow
def test_sigkill_at_random_points_gives_the_uninterrupted_result(tmp_path, uninterrupted):
  seed = 20261122  # change to explore other points; the test prints the ones it used
  rng = random.Random(seed)
  points = sorted(rng.sample(range(2, STEPS), 3))
  in_save = rng.randrange(len(points))
  plan = [('save', p + p % EVERY) if i == in_save else ('step', p) for i, p in enumerate(points)]
  print(f'seed {seed}: kill points {plan}')
  resume_from = 0
  for kill in plan:
    result = kill_and_resume(tmp_path, kill)
    assert result['first'] == resume_from + 1
    resume_from = result['resume_from']
    if kill[0] == 'save':  # Orbax starts a save only once the one before it is complete
      assert result['in_save'] >= kill[1] and resume_from == result['in_save'] - EVERY
  final = launch(tmp_path)
  assert final['first'] == resume_from + 1 and final['last'] == STEPS
  # The killed run's lock was left behind; the restart took it over and removed it at the end.
  assert re.search(rf'^taking over the lock of {tmp_path} left by pid \d+ on host .* '
                   r'\(no longer running\)$', final['output'], re.M), final['output']
  assert not (tmp_path / 't5lite.lock').exists()
  assert_one_row_per_step_and_no_leftovers(tmp_path)
  ours, theirs = metrics(tmp_path), metrics(uninterrupted)
  assert [ours[s]['loss'] for s in ours] == [theirs[s]['loss'] for s in ours]
  params, expected = saved_params(tmp_path, STEPS), saved_params(uninterrupted, STEPS)
  assert params.keys() == expected.keys()
  for name in params:
    np.testing.assert_array_equal(params[name], expected[name], err_msg=name)


def one_line_error(capsys) -> str:
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]




def copy_until(workdir, step: int, destination) -> str:
  """A copy of `workdir` whose latest checkpoint is `step`."""
  shutil.copytree(workdir, destination)
  for later in complete_steps(destination):
    if later > step:
      shutil.rmtree(os.path.join(destination, 'checkpoints', str(later)))
  return str(destination)


def flat_params(params) -> dict[str, np.ndarray]:
  """Run.restore_params' nnx.State as test_loop.saved_params names it."""
  leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))[0]
  return {'/' + '/'.join(str(key.key) for key in path) + '/value': np.asarray(leaf)
          for path, leaf in leaves}


@pytest.fixture(scope='module')
def trained_222(tmp_path_factory):
  """3 steps on the 8 devices as data=2, fsdp=2, tensor=2; checkpoints at steps 2 and 3."""
  workdir = tmp_path_factory.mktemp('mesh_222')
  assert train(workdir, SYNTHETIC, *MESH_222, '--config.train.steps=3',
               '--config.checkpoint.every_steps=2') == 0
  return str(workdir)


RESTORE_ON_ONE_DEVICE = '''
import sys, types
import jax, numpy as np
from t5lite import cli
from t5lite.train import run as run_lib
workdir, out, *mesh = sys.argv[1:]
config = cli.load_run_config(types.SimpleNamespace(workdir=workdir), mesh)
_, params = run_lib.make_run(config).restore_params(workdir, step=2)
assert jax.device_count() == 1
np.savez(out, *jax.device_get(jax.tree.leaves(params)))
sys.exit(cli.main(['train', f'--workdir={workdir}', *mesh, '--config.train.steps=3']))
'''


def test_restore_onto_other_meshes_is_exact_and_training_goes_on(trained_222, tmp_path):
  """Saved on 8 devices as 2x2x2; restored on them as 4x2x1, and in a process of 1 device that
  then trains on from step 2."""
  config = cli.load_run_config(types.SimpleNamespace(workdir=trained_222), MESH_421)
  run = run_lib.make_run(config)
  _, params = run.restore_params(trained_222, step=2)
  mesh = run.mesh
  assert dict(mesh.shape) == {'data': 4, 'fsdp': 2, 'expert': 1, 'tensor': 1}
  assert all(leaf.sharding.mesh.shape == mesh.shape for leaf in jax.tree.leaves(params))
  restored, saved = flat_params(params), saved_params(trained_222, 2)
  assert restored.keys() == saved.keys()
  for name in saved:
    np.testing.assert_array_equal(restored[name], saved[name], err_msg=name)

  workdir, out = copy_until(trained_222, 2, tmp_path / 'run'), tmp_path / 'params.npz'
  subprocess.run([sys.executable, '-c', RESTORE_ON_ONE_DEVICE, workdir, str(out),
                  '--config.mesh.data=1', '--config.mesh.fsdp=1', '--config.mesh.tensor=1'],
                 cwd=ROOT, env=one_device_env(), check=True)
  with np.load(out) as one_device:
    assert len(one_device.files) == len(jax.tree.leaves(params))
    for i, leaf in enumerate(jax.tree.leaves(params)):
      np.testing.assert_array_equal(one_device[f'arr_{i}'], np.asarray(leaf))
  ours, theirs = metrics(workdir), metrics(trained_222)
  assert [ours[s]['loss'] for s in (1, 2)] == [theirs[s]['loss'] for s in (1, 2)]  # rows kept
  # Another mesh may sum in another order: step 3 is asserted to float32 rounding, not bitwise.
  print(f'step 3 loss: 2x2x2 {theirs[3]["loss"]!r}, resumed on 1 device {ours[3]["loss"]!r}')
  np.testing.assert_allclose(ours[3]['loss'], theirs[3]['loss'], rtol=1e-5)


def test_a_damaged_checkpoint_is_named_in_one_line_and_left_alone(trained_222, tmp_path, capsys):
  workdir = copy_until(trained_222, 3, tmp_path / 'run')
  state = os.path.join(workdir, 'checkpoints', '3', 'state')
  # Every array data file cut to 16 bytes: which file, and which part of it, holds the
  # parameters (which eval and export read) is up to orbax's concurrent writes.
  data_files = [os.path.join(root, name) for root, _, names in os.walk(state) for name in names
                if os.path.basename(root) == 'd']
  assert data_files
  for path in data_files:
    os.truncate(path, 16)
  before = snapshot(workdir)
  for command in (['train', '--config.train.steps=4'], ['eval'],
                  ['export', f'--out={tmp_path / "hf"}']):
    assert cli.main([command[0], f'--workdir={workdir}', *command[1:]]) == 2, command
    error = one_line_error(capsys)
    assert f'checkpoint {workdir}/checkpoints/3 cannot be read' in error, error
    assert f'move it out of {workdir}/checkpoints to use the one before it' in error, error
  assert snapshot(workdir) == before
  assert not os.path.exists(tmp_path / 'hf')


def test_resuming_another_model_shape_changes_nothing(trained_222, tmp_path, capsys):
  """Refused though steps are left to train, before anything is written."""
  workdir = copy_until(trained_222, 3, tmp_path / 'run')
  before = snapshot(workdir)
  assert train(workdir, '--config.model.d_ff=256', '--config.train.steps=4') == 2
  assert 'holds a checkpoint of another model (d_ff 128 vs 256)' in one_line_error(capsys)
  assert snapshot(workdir) == before  # config.json included: it keeps the checkpoints' model


def test_resuming_another_optimizer_state_layout_changes_nothing(trained_222, tmp_path, capsys):
  """An Adafactor state resumed as AdamW's (as a state saved by an older t5lite, before Adafactor
  factored attention kernels): one line before orbax reads anything; its parameters still serve."""
  workdir = copy_until(trained_222, 3, tmp_path / 'run')
  before = snapshot(workdir)
  assert train(workdir, '--config.optim.name=adamw', '--config.train.steps=4') == 2
  error = one_line_error(capsys)
  assert f'checkpoint {workdir}/checkpoints/3 holds a train state of another layout' in error
  assert snapshot(workdir) == before
  assert cli.main(['eval', f'--workdir={workdir}', '--num_batches=1',
                   '--config.optim.name=adamw']) == 0




def test_parameters_of_another_layout_are_refused_in_one_line(trained_222, tmp_path, capsys,
                                                             monkeypatch):
  """Parameters laid out otherwise than today's model of the same config (as ELECTRA's generator
  before 2026-11-24; here a decoder without its final norm): eval and export name the first that
  differs, before orbax reads anything; nothing changes."""
  workdir = copy_until(trained_222, 3, tmp_path / 'run')
  before = snapshot(workdir)
  build = EncoderDecoder.__init__

  def without_final_norm(self, cfg, *, rngs):
    build(self, cfg, rngs=rngs)
    self.decoder.final_norm = None

  monkeypatch.setattr(EncoderDecoder, '__init__', without_final_norm)
  for command in (['eval', '--num_batches=1'], ['export', f'--out={tmp_path / "hf"}']):
    assert cli.main([command[0], f'--workdir={workdir}', *command[1:]]) == 2, command
    assert one_line_error(capsys) == (
        f't5lite {command[0]}: error: checkpoint {workdir}/checkpoints/3 holds parameters of '
        "another layout than this model's (decoder/final_norm/scale: saved (64,), the model's "
        'none); an older t5lite wrote it: read it with that version')
  assert snapshot(workdir) == before and not os.path.exists(tmp_path / 'hf')


def test_an_unwritable_workdir_is_refused_in_one_line(trained_222, capsys):
  """The user's own workdir made read-only (chmod 0o500) and a new one under a read-only parent.
  As root, the same as the user `nobody`: the workdir is given to it, the way a user owns theirs
  (its files stay writable: only the workdir itself is not). Runs as trained_222 (its compiled
  step is reused): the refusal comes only after the step is compiled."""
  user = pwd.getpwnam('nobody') if os.geteuid() == 0 else None
  base = tempfile.mkdtemp()  # not under tmp_path, which `nobody` cannot enter
  try:
    os.chmod(base, 0o755)
    workdir = copy_until(trained_222, 3, os.path.join(base, 'run'))
    for root, _, files in os.walk(workdir) if user else ():
      for path in [root] + [os.path.join(root, name) for name in files]:
        os.chown(path, user.pw_uid, user.pw_gid)
    read_only_parent = os.path.join(base, 'read_only')
    os.mkdir(read_only_parent, 0o555)
    os.chmod(workdir, 0o500)
    before = snapshot(workdir)
    for target in (workdir, os.path.join(read_only_parent, 'run')):
      with acting_as(user):
        code = train(target, SYNTHETIC, *MESH_222, '--config.train.steps=4')
      assert code == 2
      assert f'cannot write to workdir {target}: Permission denied' in one_line_error(capsys)
    assert snapshot(workdir) == before and not os.listdir(read_only_parent)
  finally:
    if os.path.isdir(os.path.join(base, 'run')):
      os.chmod(os.path.join(base, 'run'), 0o755)
    shutil.rmtree(base)


def test_export_then_import_hf_starts_a_run_with_the_same_weights(trained_222, tmp_path, capsys):
  """Round trip through the CLI. That transformers gives our logits from the exported folder is
  tests/export/test_hf.py::test_export_matches_transformers."""
  hf_dir, workdir = tmp_path / 'hf', tmp_path / 'imported'
  # trained_222's run settings but its model's (t5_tiny's warmup, the same mesh): the imported
  # run then loads the step trained_222 compiled from the persistent cache.
  run_flags = [SYNTHETIC, *MESH_222, '--config.optim.warmup_steps=500',
               *(f for f in SMALL if not f.startswith(('--config=', '--config.model.')))]
  assert cli.main(['export', f'--workdir={trained_222}', f'--out={hf_dir}']) == 0
  bundled = vocabulary.load_vocabulary('bundled')
  tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
  text = 'The cat <extra_id_0> on the mat, 1851.'
  assert tokenizer(text).input_ids == bundled.encode(text) + [vocabulary.EOS_ID]
  assert cli.main(['import-hf', f'--hf={hf_dir}', f'--workdir={workdir}', *run_flags]) == 0
  # The folder's vocabulary is the run's: copied into the workdir, named in its config.
  assert (workdir / 'spiece.model').read_bytes() == bundled.model_proto
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['data']['vocabulary'] == str(workdir / 'spiece.model')
  imported, exported = saved_params(workdir, 0), saved_params(trained_222, 3)
  assert imported.keys() == exported.keys()
  for name in exported:
    np.testing.assert_array_equal(imported[name], exported[name], err_msg=name)

  assert cli.main(['train', f'--workdir={workdir}', '--config.train.steps=2']) == 0
  losses = metrics(workdir)
  assert sorted(losses) == [1, 2]
  # Batch 0 again, now with 3 steps of training behind the weights: a lower loss than at first.
  assert losses[1]['loss'] < metrics(trained_222)[1]['loss']

  # A folder without a vocabulary: the bundled one, and a warning that says so.
  bare_dir = tmp_path / 'bare'
  shutil.copytree(hf_dir, bare_dir, ignore=shutil.ignore_patterns('*token*', 'spiece.model'))
  capsys.readouterr()
  assert cli.main(['import-hf', f'--hf={bare_dir}', f'--workdir={tmp_path / "bare_run"}',
                   *run_flags]) == 0
  assert capsys.readouterr().err == (f'warning: {bare_dir} has no spiece.model or tokenizer.json;'
                                     " the run reads data.vocabulary='bundled'\n")
  assert json.loads((tmp_path / 'bare_run' / 'config.json').read_text())['data'][
      'vocabulary'] == 'bundled'

  before = snapshot(workdir)
  assert cli.main(['import-hf', f'--hf={hf_dir}', f'--workdir={workdir}', *run_flags]) == 2
  assert f'--workdir {workdir} is not empty' in one_line_error(capsys)
  assert snapshot(workdir) == before
