"""A token store is as safe as a workdir (issue #43): no refused, interrupted or concurrent
`prepare` harms a complete part, every manifest field is checked when read, and a damaged byte
is refused when read, never trained on."""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from etils import epath

from t5lite import cli
from t5lite.data import store
from tests.data.test_store import (ROOT, big_corpus, ctrl_c_default, documents, prepare,
                                   tokenizing)
from tests.fs import changes, snapshot
from tests.train.test_loop import train

PART = 'part-00000-of-00001'


def jsonl(folder, name: str, count: int, seed: int) -> str:
  path = folder / name
  path.write_text(''.join(json.dumps({'text': t}) + '\n' for t in documents(count, seed)))
  return str(path)


def launch_prepare(source: str, out, *flags: str, code: str = '') -> subprocess.Popen:
  """`t5lite prepare` in a process of its own, after `code` (a fault to inject) if given."""
  command = ['-m', 't5lite'] if not code else [
      '-c', f'{code}\nimport sys\nfrom t5lite import cli\nsys.exit(cli.main(sys.argv[1:]))']
  return subprocess.Popen([sys.executable, *command, 'prepare', f'--source={source}',
                           f'--out={out}', *flags], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_default)


def same_files(a, b) -> bool:
  return snapshot(a) == snapshot(b)


@pytest.fixture(scope='module')
def small(tmp_path_factory):
  """(a .jsonl source, a clean store of it) for tests that damage or overwrite copies."""
  folder = tmp_path_factory.mktemp('small')
  source = jsonl(folder, 'a.jsonl', 120, seed=11)
  assert cli.main(['prepare', f'--source={source}', f'--out={folder / "store"}']) == 0
  return source, folder / 'store'


def copy_of(store_folder, tmp_path):
  target = tmp_path / 'store'
  target.mkdir()
  for name in os.listdir(store_folder):
    (target / name).write_bytes((store_folder / name).read_bytes())
  return target


# A refused or concurrent prepare never harms a complete part.


def test_a_refused_overwrite_leaves_the_complete_part_as_it_was(small, tmp_path, capsys):
  """The errors met while streaming, after the first checks: a .gz cut short, no line with the
  text key, no text at all, a validation fraction that leaves no train tokens."""
  source, clean = small
  out = copy_of(clean, tmp_path)
  raw = ''.join(json.dumps({'text': t}) + '\n' for t in documents(300, seed=12)).encode()
  (tmp_path / 'cut.jsonl.gz').write_bytes(gzip.compress(raw)[:3000])
  (tmp_path / 'body.jsonl').write_text(json.dumps({'body': 'no text'}) + '\n')
  (tmp_path / 'empty.jsonl').write_text(json.dumps({'text': '  '}) + '\n')
  cases = [([f'--source={tmp_path / "cut.jsonl.gz"}'], 'is not a complete .gz file'),
           ([f'--source={tmp_path / "body.jsonl"}'], "none of its 1 lines is a JSON object"),
           ([f'--source={tmp_path / "empty.jsonl"}'], 'holds no text in part 0 of 1'),
           ([f'--source={source}', '--validation_fraction=0.9999999'],
            'held out all 120 documents of part 0 of 1, which would have no train tokens')]
  before = snapshot(tmp_path)
  for flags, message in cases:
    status, out_text, err = prepare(capsys, *flags, f'--out={out}', '--overwrite')
    assert (status, out_text) == (2, ''), err
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert snapshot(tmp_path) == before, changes(before, snapshot(tmp_path))
  assert store.Store(str(out)).verify() == sum(store.Store(str(clean)).manifests[0]['tokens']
                                               .values())


def test_an_overwrite_replaces_the_part_whole(small, tmp_path, capsys):
  source, clean = small
  out = copy_of(clean, tmp_path)
  other = jsonl(tmp_path, 'b.jsonl', 40, seed=13)
  assert prepare(capsys, f'--source={other}', f'--out={out}', '--overwrite')[0] == 0
  assert prepare(capsys, f'--source={other}', f'--out={tmp_path / "fresh"}')[0] == 0
  assert same_files(out, tmp_path / 'fresh')
  assert not same_files(out, clean)


def test_a_second_prepare_of_a_part_in_progress_is_refused_in_one_line(tmp_path, capsys):
  source = big_corpus(tmp_path / 'text')
  out = tmp_path / 'store'
  first = tokenizing(source, out)
  before = snapshot(out)
  status, printed, err = prepare(capsys, f'--source={source}', f'--out={out}', '--overwrite')
  assert (status, printed) == (2, '')
  assert re.fullmatch(
      f't5lite prepare: error: part 0 of 1 of {out} is in use by t5lite prepare on host .*, pid '
      f'{first.pid}, since .* UTC; wait for it or stop it\n', err), err
  assert set(snapshot(out)) == set(before)  # its files, still being written; nothing of ours
  assert first.wait(timeout=300) == 0, first.communicate()
  assert prepare(capsys, f'--source={source}', f'--out={tmp_path / "clean"}')[0] == 0
  assert same_files(out, tmp_path / 'clean')


@pytest.mark.slow  # three prepares at once, and the same one part after another: 25 s
def test_neighbouring_parts_prepared_at_once_are_the_store_prepared_part_by_part(tmp_path,
                                                                                 capsys):
  source = big_corpus(tmp_path / 'text', files=6)
  out = tmp_path / 'store'
  running = [launch_prepare(source, out, '--num_shards=3', f'--shard_index={i}', '--workers=1')
             for i in range(3)]
  for process in running:
    assert process.wait(timeout=300) == 0, process.communicate()
  for index in range(3):
    assert prepare(capsys, f'--source={source}', f'--out={tmp_path / "apart"}',
                   '--num_shards=3', f'--shard_index={index}')[0] == 0
  assert same_files(out, tmp_path / 'apart')


# Killed at each step of publishing: the reader sees the old part, no part or the new one.

KILL_AT_RENAME = """
import os, signal
from etils.epath import gpath
renames, replace = [0], gpath._GPath.replace
def replace_or_die(self, target):
  if renames[0] == {n}:
    os.kill(os.getpid(), signal.{signal})
  renames[0] += 1
  return replace(self, target)
gpath._GPath.replace = replace_or_die
"""


def read_whole(out) -> int | None:
  """The tokens of the store at `out`, each block verified; None where a reader sees no store
  (it refuses it in one line)."""
  if not os.path.isdir(out):  # not made yet, or removed again by the run that made it
    return None
  try:
    return store.Store(str(out)).verify()
  except ValueError as error:
    assert re.search('holds no token store|lacks part', str(error)), error
    return None


@pytest.mark.slow  # five prepare processes: 28 s (SIGKILL, and a rerun of each), 37 s (SIGINT)
@pytest.mark.parametrize('kill', ['SIGKILL', 'SIGINT'])
def test_prepare_stopped_at_each_rename_of_publishing_never_leaves_half_a_part(
    small, tmp_path, capsys, kill):
  """A part is published in five renames (its four files, then the manifest). SIGKILL before
  any of them leaves the old part (--overwrite), no part, or the new one whole; a rerun then
  prepares exactly what a clean run does. SIGINT is held back until the part is whole."""
  source, clean = small
  new = jsonl(tmp_path, 'b.jsonl', 40, seed=14)
  assert prepare(capsys, f'--source={new}', f'--out={tmp_path / "fresh"}')[0] == 0
  old_tokens, new_tokens = read_whole(clean), read_whole(tmp_path / 'fresh')
  for rename in range(5):
    out = tmp_path / f'{kill}-{rename}'
    copy_of(clean, tmp_path).rename(out)
    process = launch_prepare(new, out, '--overwrite',
                             code=KILL_AT_RENAME.format(n=rename, signal=kill))
    _, err = process.communicate(timeout=120)
    if kill == 'SIGKILL':
      assert process.returncode == -signal.SIGKILL, err
      assert read_whole(out) in (old_tokens, None), rename  # the old part, or none
    else:
      assert process.returncode == 130 and err == 't5lite prepare: error: interrupted (Ctrl-C)\n'
      assert same_files(out, tmp_path / 'fresh'), rename  # whole, and nothing left beside it
      continue
    status, _, err = prepare(capsys, f'--source={new}', f'--out={out}', '--overwrite')
    assert status == 0 and 'taking over the lock' in err, err
    assert same_files(out, tmp_path / 'fresh') and read_whole(out) == new_tokens


def test_ctrl_c_in_the_middle_of_publishing_is_acted_on_once_the_part_is_whole(
    small, tmp_path, capsys, monkeypatch):
  source, clean = small
  replace = epath.gpath._GPath.replace

  def interrupted(self, target):
    os.kill(os.getpid(), signal.SIGINT)
    return replace(self, target)

  monkeypatch.setattr(epath.gpath._GPath, 'replace', interrupted)
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
  try:
    status, printed, err = prepare(capsys, f'--source={source}', f'--out={tmp_path / "s"}')
  finally:
    signal.signal(signal.SIGINT, previous)
  assert (status, printed, err) == (130, '', 't5lite prepare: error: interrupted (Ctrl-C)\n')
  assert same_files(tmp_path / 's', clean)


def test_out_above_a_workdir_is_refused_with_overwrite_too(tmp_path, capsys):
  workdir = tmp_path / 'runs' / 'exp' / 'w'
  (workdir / 'checkpoints').mkdir(parents=True)
  (workdir / 'config.json').write_text('{}')
  before = snapshot(tmp_path)
  for flags in ([], ['--overwrite']):
    status, _, err = prepare(capsys, '--source=bundled', f'--out={tmp_path / "runs"}', *flags)
    assert status == 2 and err == (f't5lite prepare: error: --out={tmp_path / "runs"} holds the '
                                   f'workdir {workdir}; write it outside any workdir\n')
  assert snapshot(tmp_path) == before


# Damage is caught when read, not trained on.

DAMAGED_MANIFESTS = [
    (('dtype',), '<f2', "dtype is \"<f2\", not '\\|u1' or '<u2' or '<u4'"),
    (('dtype',), '>u2', "dtype is \">u2\", not '\\|u1' or '<u2' or '<u4'"),
    (('dtype',), '<x2', "dtype is \"<x2\", not '\\|u1' or '<u2' or '<u4'"),
    (('dtype',), '<u4', "dtype is '<u4', not '<u2' as a vocabulary of 8,100 ids needs"),
    (('vocabulary',), {}, "has no 'vocabulary.name'"),
    (('vocabulary', 'sha256'), 7, 'vocabulary.sha256 is an integer, not a string'),
    (('vocabulary', 'sha256'), 'abc', 'vocabulary.sha256 is "abc", not a SHA-256'),
    (('vocabulary', 'size'), 0, 'vocabulary.size is 0, not a size'),
    (('tokens', 'train'), -1, 'tokens.train is -1, not a count'),
    (('tokens', 'train'), 1e3, 'tokens.train is a number, not an integer'),
    (('tokens',), '5', 'tokens is a string, not an object'),  # issue #58's case
    (('tokens', 'train'), '5', 'tokens.train is a string, not an integer'),
    (('tokens', 'validation'), 10, 'validation holds [0-9,]+ bytes, its manifest says 20'),
    (('documents',), [], 'documents is an array, not an object'),
    (('skipped',), {'lines_without_text': -2}, 'skipped is .*, not counts by reason'),
    (('validation_fraction',), 1.5, 'validation_fraction is 1.5, not in \\[0, 1\\)'),
    (('inputs',), [3], 'inputs\\[0\\] is an integer, not a string'),
    (('part',), 'part-00001-of-00002',
     "part is \"part-00001-of-00002\", not 'part-00000-of-00001'"),
    (('checksums', 'block_bytes'), 1 << 20, 'checksums.block_bytes is 1048576, not 4096'),
    (('checksums',), None, 'checksums is null, not an object'),
    (('format',), 't5lite token store 1', "is of 't5lite token store 1', before block checksums"),
    (('format',), 2, 'format is an integer, not a string'),
]


@pytest.mark.parametrize('place, value, message', DAMAGED_MANIFESTS,
                         ids=['.'.join(p) + f'={v!r}' for p, v, _ in DAMAGED_MANIFESTS])
def test_every_manifest_field_is_checked_when_read(small, tmp_path, capsys, place, value,
                                                   message):
  _, clean = small
  out = copy_of(clean, tmp_path)
  manifest = json.loads((out / f'{PART}.json').read_text())
  node = manifest
  for key in place[:-1]:
    node = node[key]
  node[place[-1]] = value
  (out / f'{PART}.json').write_text(json.dumps(manifest))
  before = snapshot(tmp_path)
  status = cli.main(['data', f'--config={ROOT}/configs/t5_tiny.py', '--show=1',
                     f'--config.data.source={out}'])
  err = capsys.readouterr().err
  assert status == 2 and len(err.splitlines()) == 1, err
  assert f'{out}/{PART}' in err and re.search(message, err), err
  assert snapshot(tmp_path) == before


def flip(file, at: int) -> None:
  with open(file, 'r+b') as f:
    f.seek(at)
    byte = f.read(1)[0]
    f.seek(at)
    f.write(bytes([byte ^ 0x10]))


def test_a_changed_byte_is_refused_when_read_naming_the_part_and_offset(small, tmp_path):
  _, clean = small
  out = copy_of(clean, tmp_path)
  size = (out / f'{PART}.train').stat().st_size
  last_window = size // 2 - 6
  for at in (0, 4095, 4096, size - 1):
    flip(out / f'{PART}.train', at)
    tokens = store.Store(str(out)).tokens('train')
    block = at // store.BLOCK_BYTES * store.BLOCK_BYTES
    end = min(block + store.BLOCK_BYTES, size)
    refused = (f'{out}/{PART}.train: the bytes {block:,} to {end:,} do not match their checksum'
               f' in {PART}.train.crc32c: the store is damaged; prepare part 0 of 1 again')
    with pytest.raises(ValueError, match=re.escape(refused)):
      tokens.window(min(max(at // 2 - 3, 0), last_window), 6)  # a window over the changed byte
    with pytest.raises(ValueError, match=re.escape(refused)):
      store.Store(str(out)).verify()
    other = 8192 if at < 8192 else 0  # a window of other blocks reads as ever
    np.testing.assert_array_equal(tokens.window(other // 2, 100),
                                  store.Store(str(clean)).tokens('train').window(other // 2, 100))
    flip(out / f'{PART}.train', at)  # undone: whole again
    store.Store(str(out)).verify()
  flip(out / f'{PART}.train.crc32c', 5)  # a checksum changed: its block is refused
  with pytest.raises(ValueError, match='the bytes 4,096 to 8,192 do not match their checksum'):
    store.Store(str(out)).verify()


def test_a_fifo_or_folder_in_place_of_a_part_file_is_refused_not_waited_on(tmp_path, capsys):
  source = jsonl(tmp_path, 'a.jsonl', 30, seed=15)
  out = tmp_path / 's'
  assert prepare(capsys, f'--source={source}', f'--out={out}', '--validation_fraction=0')[0] == 0
  assert (out / f'{PART}.validation').stat().st_size == 0
  previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail('blocked on the FIFO'))
  signal.alarm(60)
  try:
    for name, make, message in (
        (f'{PART}.validation', os.mkfifo, 'is not a regular file \\(a FIFO, socket or device\\)'),
        (f'{PART}.validation.crc32c', os.mkfifo, 'is not a regular file \\(a FIFO.*\\)'),
        (f'{PART}.train', os.mkdir, 'is a folder, not a file'),
        (f'{PART}.train', lambda p: os.symlink(p, p), 'cannot be read \\(Too many levels of '
                                                      'symbolic links\\)'),
        (f'{PART}.train.crc32c', lambda p: None, 'no such file')):
      kept = (out / name).read_bytes()
      os.remove(out / name)
      make(out / name)
      with pytest.raises(ValueError, match=f'{re.escape(str(out / name))}:? {message}: the store '
                                           'is damaged; prepare part 0 of 1 again'):
        store.Store(str(out))
      if os.path.isdir(out / name) and not os.path.islink(out / name):
        os.rmdir(out / name)
      elif os.path.lexists(out / name):
        os.remove(out / name)
      (out / name).write_bytes(kept)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
  store.Store(str(out)).verify()


def test_a_part_missing_says_how_to_prepare_it(small, tmp_path, capsys):
  source, _ = small
  out = tmp_path / 's'
  for index in (0, 1):
    assert prepare(capsys, f'--source={source},{jsonl(tmp_path, "b.jsonl", 10, 16)}',
                   f'--out={out}', '--num_shards=2', f'--shard_index={index}')[0] == 0
  for name in os.listdir(out):
    if name.startswith('part-00001'):
      os.remove(out / name)
  with pytest.raises(ValueError, match=f'^data.source: {out} lacks part\\(s\\) 1 of 2: prepare '
                                       'each with --num_shards=2 --shard_index=N'):
    store.Store(str(out))


@pytest.mark.slow  # a run of one step, then two resumed runs refused: 45-60 s on 2 cores
def test_a_resumed_run_that_meets_a_damaged_store_stops_in_one_line_and_writes_nothing(
    small, tmp_path, capsys):
  """A manifest's dtype changed by one byte, then a train file's blocks each with a byte changed:
  the run resumed from its step-1 checkpoint refuses the store before it writes anything."""
  _, clean = small
  out = copy_of(clean, tmp_path)
  workdir = tmp_path / 'run'
  assert train(workdir, f'--config.data.source={out}', '--config.train.steps=1') == 0
  capsys.readouterr()
  manifest = (out / f'{PART}.json').read_text()
  (out / f'{PART}.json').write_text(manifest.replace('"<u2"', '"<f2"'))
  train_file = out / f'{PART}.train'
  size = train_file.stat().st_size
  for damage in ('dtype', 'blocks'):
    if damage == 'blocks':
      (out / f'{PART}.json').write_text(manifest)
      for at in range(100, size, store.BLOCK_BYTES):
        flip(train_file, at)
    before = snapshot(workdir)
    store.open_store.cache_clear()  # read again, as a new process would
    status = train(workdir, f'--config.data.source={out}', '--config.train.steps=2')
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1, err
    assert re.search(f'{out}/{PART}.json: dtype is "<f2"' if damage == 'dtype' else
                     f'{out}/{PART}.train: the bytes [0-9,]+ to [0-9,]+ do not match their '
                     f'checksum in {PART}.train.crc32c: the store is damaged', err), err
    assert snapshot(workdir) == before, changes(before, snapshot(workdir))


def test_a_manifest_at_odds_with_the_store_or_the_vocabulary_is_refused(small, tmp_path, capsys):
  _, clean = small
  out = copy_of(clean, tmp_path)
  manifest = json.loads((out / f'{PART}.json').read_text())
  (out / 'part-00003-of-00001.json').write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match='holds part-00003-of-00001.json, but a store of 1 parts '
                                       'has no part 3: the store is damaged'):
    store.Store(str(out))
  os.remove(out / 'part-00003-of-00001.json')
  manifest['vocabulary']['size'] = 8000
  (out / f'{PART}.json').write_text(json.dumps(manifest))
  status = cli.main(['data', f'--config={ROOT}/configs/t5_tiny.py', '--show=1',
                     f'--config.data.source={out}'])
  err = capsys.readouterr().err
  assert status == 2 and err == (f't5lite data: error: data.source: {out}: its manifests say its '
                                 "vocabulary has 8,000 ids, data.vocabulary='bundled' (the same "
                                 'model) has 8,100: the store is damaged; prepare it again\n')


def test_data_verify_reads_the_whole_store(small, tmp_path, capsys):
  _, clean = small
  tokens = sum(store.Store(str(clean)).manifests[0]['tokens'].values())
  assert cli.main(['data', f'--verify={clean}']) == 0
  assert capsys.readouterr().out == (f'{clean}: 1 part(s), {tokens:,} tokens, every block as its '
                                     'checksum says and every id within the vocabulary\n')
  for flags, message in (([f'--verify={clean}', '--show=1'], '--verify=STORE takes no other flag'),
                         ([f'--verify={clean}/{PART}.json'], 'is no folder; give a token store')):
    assert cli.main(['data', *flags]) == 2
    assert message in capsys.readouterr().err
  out = copy_of(clean, tmp_path)
  with open(out / f'{PART}.train', 'r+b') as f:  # an id past the vocabulary, checksummed anew
    f.write(np.array([9000], '<u2').tobytes())
    f.seek(0)
    block = f.read(store.BLOCK_BYTES)
  with open(out / f'{PART}.train.crc32c', 'r+b') as f:
    f.write(store.BlockChecksums().update(block))
  assert cli.main(['data', f'--verify={out}']) == 2
  assert capsys.readouterr().err == (
      f't5lite data: error: {out}/{PART}.train: token 0 is id 9000, past the vocabulary\'s 8,100 '
      f'ids: the store is damaged; prepare part 0 of 1 again (--overwrite --shard_index=0 '
      f'--num_shards=1), and check the rest with `t5lite data --verify={out}`\n')


@pytest.mark.slow  # seven prepare processes of some seconds each: about 70 s on 2 cores
def test_prepare_killed_or_interrupted_at_random_moments_never_shows_half_a_part(tmp_path,
                                                                                 capsys):
  """Runs of one part with --overwrite, each stopped by SIGKILL or SIGINT at a random moment of
  its run: after each, a reader sees no part (none was published yet) or the whole one; the run
  after them all prepares exactly what a clean run does."""
  source = big_corpus(tmp_path / 'text', files=8)
  clean = tmp_path / 'clean'
  start = time.monotonic()
  assert launch_prepare(source, clean, '--workers=1').wait(timeout=300) == 0
  seconds = time.monotonic() - start
  whole = read_whole(clean)
  out = tmp_path / 'store'
  rng = np.random.default_rng(0)
  for kill in (signal.SIGKILL, signal.SIGINT) * 3:
    process = launch_prepare(source, out, '--workers=1', '--overwrite')
    time.sleep(rng.uniform(0.2, 1.0) * seconds)
    process.send_signal(kill)
    _, err = process.communicate(timeout=120)
    # -SIGINT: Python's exit cut by the Ctrl-C, which a shell shows as 130 too
    assert process.returncode in (0, -signal.SIGKILL, 130, -signal.SIGINT), err
    assert 'Traceback' not in err, err
    assert read_whole(out) in (None, whole)
  assert launch_prepare(source, out, '--workers=1', '--overwrite').wait(timeout=300) == 0
  assert same_files(out, clean)


def test_a_damaged_block_read_by_the_pipeline_is_one_line_from_a_fresh_process(small, tmp_path):
  """TensorFlow's C++ logs the traceback of each failed call of the pipeline's Python (one per
  window read in parallel) unless told otherwise before JAX or TensorFlow loads: the command does
  so (the tests' own environment, tests/conftest.py, would hide it)."""
  _, clean = small
  out = copy_of(clean, tmp_path)
  for at in range(100, (out / f'{PART}.train').stat().st_size, store.BLOCK_BYTES):
    flip(out / f'{PART}.train', at)
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  done = subprocess.run([sys.executable, '-m', 't5lite', 'data', '--show=1',
                         f'--config={ROOT}/configs/t5_tiny.py', f'--config.data.source={out}'],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr[-3000:]
  assert 'do not match their checksum' in done.stderr
