"""Outputs never overwrite what they should not: t5lite/outputs.py's rules, and `export`,
`infer --out`, `data --out` and `tokenizer` refusing in one line before any work, with the file
system byte for byte as it was."""

import json
import os
import pathlib
import re

import numpy as np
import pytest

from t5lite import cli
from t5lite import outputs
from t5lite.data import sources
from t5lite.data import vocabulary
from t5lite.inputs import pipeline
from t5lite.train import run as run_lib
from tests.train.test_loop import ROOT, train
from tests.fs import snapshot

EXPORT = ('config.json', 'model.safetensors')
# What `t5lite export` writes: the model, then the tokenizer.
EXPORTED = EXPORT + ('spiece.model', 'tokenizer.json', 'tokenizer_config.json',
                     'special_tokens_map.json')


def is_infer_output(path: str) -> bool:
  return outputs.is_jsonl_of(path, ('input', 'output'))


def check(kind: str, path, **kwargs) -> None:
  """check_folder as export's folder, or check_file as infer's JSONL."""
  if kind == 'folder':
    outputs.check_folder(str(path), EXPORT, **kwargs)
  else:
    outputs.check_file(str(path), is_infer_output, **kwargs)




def fake_workdir(path: pathlib.Path) -> pathlib.Path:
  """What `train` leaves, and t5lite/outputs.py knows a workdir by: config.json, checkpoints/."""
  (path / 'checkpoints').mkdir(parents=True)
  (path / 'config.json').write_text('{}')
  return path


@pytest.mark.parametrize('kind', ['folder', 'file'])
@pytest.mark.parametrize('out, message', [
    ('run', 'is --workdir='), ('run/hf', 'is inside --workdir='),
    ('link/hf', 'is inside --workdir='), ('.', 'holds --workdir='),
])
def test_the_workdir_what_is_in_it_and_above_it_are_refused_even_with_overwrite(
    tmp_path, kind, out, message):
  (tmp_path / 'run').mkdir()
  (tmp_path / 'link').symlink_to(tmp_path / 'run')
  before = snapshot(tmp_path)
  for overwrite in (False, True):
    with pytest.raises(ValueError, match=re.escape(
        f'--out={tmp_path / out} {message}{tmp_path / "run"}; write it outside the workdir')):
      check(kind, tmp_path / out, workdir=str(tmp_path / 'run'), overwrite=overwrite)
  assert snapshot(tmp_path) == before


@pytest.mark.parametrize('kind', ['folder', 'file'])
def test_any_workdir_and_what_is_in_it_are_refused_without_workdir(tmp_path, kind):
  run = fake_workdir(tmp_path / 'run')
  with pytest.raises(ValueError, match=re.escape(
      f'--out={run} is the workdir {run}; write it outside any workdir')):
    check(kind, run, overwrite=True)
  with pytest.raises(ValueError, match=re.escape(
      f'--out={run}/sub/out is inside the workdir {run}; write it outside any workdir')):
    check(kind, run / 'sub' / 'out', overwrite=True)
  os.remove(run / 'config.json')  # a folder with checkpoints/ only is no workdir
  check(kind, run / 'sub' / 'out')


@pytest.mark.parametrize('kind, out, message', [
    ('folder', 'notes.txt', 'is a file, not a folder; give a folder'),
    ('file', 'folder', 'is a folder, not a file; give a file'),
    ('file', 'new/', 'is a folder, not a file; give a file'),
    ('file', 'notes.txt/out.jsonl', 'notes.txt is a file, not a folder'),
    ('folder', 'blocked', 'holds config.json, which is not a file; give another folder'),
    ('file', 'fifo', 'is not a regular file; give a file'),
])
def test_the_wrong_kind_of_path_is_refused_even_with_overwrite(tmp_path, kind, out, message):
  (tmp_path / 'notes.txt').write_text('mine')
  (tmp_path / 'folder').mkdir()
  (tmp_path / 'blocked' / 'config.json').mkdir(parents=True)
  os.mkfifo(tmp_path / 'fifo')
  path = os.path.join(tmp_path, out)
  with pytest.raises(ValueError, match=rf'^{re.escape(f"--out={path}")}(:| ).*{message}$'):
    check(kind, path, overwrite=True)


def test_an_earlier_output_is_replaced_and_anything_else_needs_overwrite(tmp_path):
  folder = tmp_path / 'hf'
  folder.mkdir()
  check('folder', folder)  # empty
  for name in EXPORT:
    (folder / name).write_text('earlier')
  check('folder', folder)  # an earlier export
  (folder / 'tokenizer.json').write_text('theirs')
  with pytest.raises(ValueError, match=re.escape(
      f'--out={folder} holds tokenizer.json, which this command does not write; give a new or '
      'empty folder, or --overwrite to replace config.json and model.safetensors in it')):
    check('folder', folder)
  check('folder', folder, overwrite=True)
  with outputs.writing(str(folder), folder=True) as temp:
    for name in EXPORT:
      pathlib.Path(temp, name).write_text('new')
  assert {p.name: p.read_text() for p in folder.iterdir()} == {
      'config.json': 'new', 'model.safetensors': 'new', 'tokenizer.json': 'theirs'}
  assert os.listdir(tmp_path) == ['hf']

  earlier, other, empty = tmp_path / 'out.jsonl', tmp_path / 'other.jsonl', tmp_path / 'empty'
  earlier.write_text('{"input": "a", "output": "b"}\n{"input": "c", "output": ""}\n')
  other.write_text('{"input": "a", "target": "b"}\n')
  empty.write_text('')
  check('file', earlier)
  check('file', empty)  # nothing to lose
  with pytest.raises(ValueError, match=re.escape(
      f'--out={other} is a file this command did not write; give a new path, or --overwrite to '
      'replace it')):
    check('file', other)
  check('file', other, overwrite=True)


def test_earlier_outputs_are_recognised_by_their_content(tmp_path):
  def npz(name, **arrays):
    with open(tmp_path / name, 'wb') as f:
      np.savez(f, **arrays)
    return outputs.is_npz_of(str(tmp_path / name), ('encoder_', 'decoder_'))

  assert npz('batches', encoder_input_tokens=np.zeros(2), decoder_loss_weights=np.zeros(2))
  assert not npz('weights.npz', encoder_input_tokens=np.zeros(2), kernel=np.zeros(2))
  assert not npz('nothing.npz')
  rows = {'ok': '{"input": "a", "output": "b"}\n', 'extra': '{"input": 1, "output": 2, "x": 3}',
          'list': '["input", "output"]', 'text': 'input output\n'}
  for name, text in rows.items():
    (tmp_path / name).write_text(text)
  assert [is_infer_output(str(tmp_path / name)) for name in rows] == [True, False, False, False]
  (tmp_path / 'binary').write_bytes(b'\xff\xfe\x00')
  assert not is_infer_output(str(tmp_path / 'binary'))
  assert not outputs.is_npz_of(str(tmp_path / 'binary'), ('encoder_',))


@pytest.mark.parametrize('folder', [True, False])
def test_a_crash_mid_write_leaves_the_earlier_output_and_no_temporary(tmp_path, folder):
  out = tmp_path / ('hf' if folder else 'out.jsonl')
  if folder:
    out.mkdir()
    for name in EXPORT:
      (out / name).write_text('earlier')
  else:
    out.write_text('earlier')
  before = snapshot(tmp_path)
  for path in (out, tmp_path / 'new' / 'parents' / out.name):
    with pytest.raises(RuntimeError, match='crash'):
      with outputs.writing(str(path), folder=folder) as temp:
        with open(os.path.join(temp, EXPORT[0]) if folder else temp, 'w') as f:
          f.write('half')
        raise RuntimeError('crash')
    assert snapshot(tmp_path) == before, path


@pytest.mark.parametrize('folder', [True, False])
def test_writing_renames_a_hidden_sibling_into_place(tmp_path, folder):
  out = tmp_path / 'new' / 'out'
  (tmp_path / 'made_by_open').write_text('')
  (tmp_path / 'made_by_mkdir').mkdir()
  for text in ('first', 'second'):
    with outputs.writing(str(out), folder=folder) as temp:
      assert os.path.dirname(temp) == str(out.parent) and os.path.basename(temp).startswith('.out.')
      with open(os.path.join(temp, 'vocab.model') if folder else temp, 'w') as f:
        f.write(text)
      assert not out.exists() or (out / 'vocab.model' if folder else out).read_text() != text
    assert os.listdir(out.parent) == ['out']
    assert (out / 'vocab.model' if folder else out).read_text() == text
  # the permissions of a file made with open() and a folder made with mkdir(), not private ones
  assert (os.stat(out / 'vocab.model' if folder else out).st_mode
          == os.stat(tmp_path / 'made_by_open').st_mode)
  assert not folder or os.stat(out).st_mode == os.stat(tmp_path / 'made_by_mkdir').st_mode


def test_writing_removes_what_a_killed_write_left_and_fits_any_name(tmp_path):
  """A kill leaves the hidden temporary; the next write of that output removes it, not another
  output's. An output named with 255 bytes still has a temporary the file system can hold."""
  with outputs.writing(str(tmp_path / 'hf'), folder=True) as temp:
    temporary = os.path.basename(temp)
  (tmp_path / temporary).mkdir()  # what a kill during that write would have left
  (tmp_path / '.hf2.12345678.dead.tmp').mkdir()  # another output's
  name = 'o' * 255
  for out in ('hf', name):
    with outputs.writing(str(tmp_path / out), folder=True) as temp:
      with open(os.path.join(temp, 'config.json'), 'w') as f:
        f.write('{}')
  assert sorted(os.listdir(tmp_path)) == ['.hf2.12345678.dead.tmp', 'hf', name]


# End to end: `t5lite COMMAND` in-process on a workdir trained once for the module.


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp('outputs') / 'run'
  assert train(path, '--config.train.steps=2', '--config.checkpoint.every_steps=2') == 0
  return path


@pytest.fixture
def no_work(monkeypatch):
  """The expensive steps, which a refused command must not reach."""
  def expensive(*args, **kwargs):
    raise AssertionError('expensive work began before the output was checked')
  monkeypatch.setattr(run_lib, 'make_run', expensive)
  monkeypatch.setattr(pipeline, 'make_pipeline', expensive)
  monkeypatch.setattr(sources, 'read_documents', expensive)


DATA = [f'--config={ROOT}/configs/t5_tiny.py', '--config.data.inputs_length=32',
        '--config.data.targets_length=8', '--config.data.batch_size=8']


ELSEWHERE = 'give a new or empty folder, or --overwrite to replace'


@pytest.mark.parametrize('argv, error', [
    pytest.param(['export', '--out={run}/hf'], '--out={run}/hf is inside --workdir={run}; write '
                 'it outside the workdir', id='export-in-workdir'),
    pytest.param(['export', '--out={run}'], '--out={run} is --workdir={run}; write it outside the '
                 'workdir', id='export-workdir'),
    pytest.param(['export', '--out={tmp}/notes.txt'], '--out={tmp}/notes.txt is a file, not a '
                 'folder; give a folder', id='export-file'),
    pytest.param(['export', '--out={tmp}/theirs'], '--out={tmp}/theirs holds README.md, which '
                 f'this command does not write; {ELSEWHERE} config.json, model.safetensors, '
                 'spiece.model, tokenizer.json, tokenizer_config.json and '
                 'special_tokens_map.json in it', id='export-foreign-folder'),
    pytest.param(['infer', '--input=a', '--out={run}/out.jsonl'], '--out={run}/out.jsonl is '
                 'inside --workdir={run}; write it outside the workdir', id='infer-in-workdir'),
    pytest.param(['infer', '--input=a', '--out={tmp}/notes.txt'], '--out={tmp}/notes.txt is a '
                 'file this command did not write; give a new path, or --overwrite to replace it',
                 id='infer-foreign-file'),
    pytest.param(['data', *DATA, '--out={tmp}/theirs'], '--out={tmp}/theirs is a folder, not a '
                 'file; give a file', id='data-folder'),
    pytest.param(['data', *DATA, '--out={run}/checkpoints/b.npz'], '--out={run}/checkpoints/b.npz '
                 'is inside the workdir {run}; write it outside any workdir', id='data-in-workdir'),
    pytest.param(['data', *DATA, '--num_batches=0', '--out={tmp}/b.npz'],
                 '--num_batches=0 must be at least 1', id='data-no-batches'),
    pytest.param(['tokenizer', '--input=bundled', '--out={tmp}/theirs'], '--out={tmp}/theirs holds '
                 f'README.md, which this command does not write; {ELSEWHERE} vocab.model in it',
                 id='tokenizer-foreign-folder'),
    pytest.param(['tokenizer', '--input=bundled', '--out={run}/spm'], '--out={run}/spm is inside '
                 'the workdir {run}; write it outside any workdir', id='tokenizer-in-workdir'),
])
def test_a_refused_command_says_why_in_one_line_and_changes_nothing(
    workdir, tmp_path, capsys, no_work, argv, error):
  (tmp_path / 'notes.txt').write_text('mine')
  (tmp_path / 'theirs').mkdir()
  (tmp_path / 'theirs' / 'README.md').write_text('theirs')
  argv = [arg.format(run=workdir, tmp=tmp_path) for arg in argv]
  if argv[0] in ('export', 'infer'):
    argv.insert(1, f'--workdir={workdir}')
  before = snapshot(tmp_path), snapshot(workdir)
  assert cli.main(argv) == 2
  assert capsys.readouterr().err.splitlines() == [
      f't5lite {argv[0]}: error: ' + error.format(run=workdir, tmp=tmp_path)]
  assert (snapshot(tmp_path), snapshot(workdir)) == before


def test_export_replaces_an_earlier_export_and_overwrite_keeps_other_files(workdir, tmp_path):
  out = tmp_path / 'hf'
  export = ['export', f'--workdir={workdir}', f'--out={out}']
  assert cli.main(export) == 0
  first = snapshot(out)
  assert sorted(first) == sorted(EXPORTED)
  assert cli.main(export) == 0  # an earlier export: replaced, the same bytes
  assert snapshot(out) == first and os.listdir(tmp_path) == ['hf']
  (out / 'generation_config.json').write_text('theirs')
  assert cli.main(export) == 2
  assert cli.main([*export, '--overwrite']) == 0
  theirs = snapshot(tmp_path)['hf/generation_config.json']
  assert snapshot(out) == {**first, 'generation_config.json': theirs}
  assert (out / 'generation_config.json').read_text() == 'theirs'


def test_infer_and_data_write_exactly_where_they_say(workdir, tmp_path, capsys):
  rows, batches = tmp_path / 'out.jsonl', tmp_path / 'batches'
  for _ in range(2):  # the second time over their earlier outputs
    assert cli.main(['infer', f'--workdir={workdir}', '--input=Call me <extra_id_0>.',
                     '--max_decode_length=4', f'--out={rows}']) == 0
    assert cli.main(['data', *DATA, '--num_batches=1', f'--out={batches}']) == 0
  assert f'wrote 1 batches to {batches}' in capsys.readouterr().out
  assert sorted(os.listdir(tmp_path)) == ['batches', 'out.jsonl']  # not batches.npz
  assert [json.loads(line)['input'] for line in rows.read_text().splitlines()] == [
      'Call me <extra_id_0>.']
  assert np.load(batches)['encoder_input_tokens'].shape == (1, 8, 32)


def test_tokenizer_replaces_its_earlier_vocabulary(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n\n'.join(f'Document {i} speaks of ships, whales and {i * 7} sailors.'
                                for i in range(300)))
  tokenizer = ['tokenizer', f'--input={corpus}', '--vocab_size=60', f'--out={tmp_path / "spm"}']
  assert cli.main(tokenizer) == 0
  (tmp_path / 'spm' / 'vocab.model').write_bytes(b'an earlier vocab.model')
  assert cli.main(tokenizer) == 0
  assert os.listdir(tmp_path / 'spm') == ['vocab.model']
  assert vocabulary.load_vocabulary(str(tmp_path / 'spm' / 'vocab.model')).num_pieces == 60
  assert sorted(os.listdir(tmp_path)) == ['corpus.txt', 'spm']
