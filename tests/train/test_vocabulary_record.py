"""A vocabulary is known by its content, not its path (issue #54).

A workdir records the SHA-256 of the vocabulary it was made with (`vocabulary.json`), as a token
store's manifest does. The world: a tiny run and a store made with vocabulary A at
`spm/vocab.model`; then A is replaced there by B, another model of the same size, as a user who
retrains a vocabulary under the same path does. Every command that reads the run or the store
with it refuses in one line naming both digests and writes nothing; a workdir made before the
record (no vocabulary.json) is not checked and trains on, as it did."""

import json
import os
import shutil

import pytest

from t5lite import cli
from t5lite.data import spm_training, vocabulary
from tests.fs import changes, snapshot
from tests.test_cli_mistakes import TINY_FINETUNE, TINY_RUN, in_this_process
from tests.texts import keyword_task, random_corpus

PIECES = 36  # both vocabularies: 136 ids with the sentinels (the corpus has 13 words)


@pytest.fixture(scope='module')
def world(tmp_path_factory):
  """(folder, digest of A, digest of B): the run, the store and the task made with A, and B in
  `b/vocab.model`."""
  base = tmp_path_factory.mktemp('vocabulary_world')
  corpus = random_corpus(base / 'corpus.txt')
  other = base / 'other.txt'
  other.write_text(' '.join(word[::-1] for word in (base / 'corpus.txt').read_text().split(' ')),
                   encoding='utf-8')  # the words backwards: the same letters, other pieces
  spm_training.train_tokenizer([corpus], PIECES, str(base / 'spm'))
  spm_training.train_tokenizer([str(other)], PIECES, str(base / 'b'))
  a, b = (vocabulary.SentencePieceVocabulary((base / name / 'vocab.model').read_bytes()).digest
          for name in ('spm', 'b'))
  assert a != b
  keyword_task(base / 'task.tsv', 40)
  spm = str(base / 'spm' / 'vocab.model')
  assert cli.main(['prepare', f'--source={corpus}', f'--out={base / "store"}',
                   f'--vocabulary={spm}']) == 0
  assert cli.main(['train', f'--workdir={base / "run"}', *TINY_RUN, f'--config.data.source={corpus}',
                   f'--config.data.vocabulary={spm}']) == 0
  with open(base / 'run' / vocabulary.RECORD_FILE, encoding='utf-8') as f:
    assert json.load(f) == {'name': spm, 'sha256': a, 'size': PIECES + 100}
  return base, a, b


def case_of(world, tmp_path) -> str:
  """A copy of the world whose run names the copy's spm/vocab.model, which is B now."""
  base, _, _ = world
  case = tmp_path / 'case'
  shutil.copytree(base, case)
  config = json.loads((case / 'run' / 'config.json').read_text())
  config['data']['vocabulary'] = str(case / 'spm' / 'vocab.model')
  (case / 'run' / 'config.json').write_text(json.dumps(config))
  shutil.copy(case / 'b' / 'vocab.model', case / 'spm' / 'vocab.model')
  return str(case)


READS_THE_RUN = {
    'train': lambda c: ['train', f'--workdir={c}/run', '--config.train.steps=2'],
    'eval': lambda c: ['eval', f'--workdir={c}/run', '--num_batches=1'],
    'infer': lambda c: ['infer', f'--workdir={c}/run', '--input=the sea', '--max_decode_length=2'],
    'export': lambda c: ['export', f'--workdir={c}/run', f'--out={c}/hf'],
    'data': lambda c: ['data', f'--workdir={c}/run', '--show=1'],
    'finetune': lambda c: ['finetune', f'--workdir={c}/ft', f'--from={c}/run',
                           f'--task={c}/task.tsv', *TINY_FINETUNE],
    'teacher': lambda c: ['train', f'--workdir={c}/student', *TINY_RUN,
                          f'--config.data.source={c}/corpus.txt',
                          f'--config.data.vocabulary={c}/spm/vocab.model',
                          f'--config.train.teacher_workdir={c}/run'],
    'store': lambda c: ['data', *TINY_RUN, f'--config.data.vocabulary={c}/spm/vocab.model',
                        f'--config.data.mixture.a.source={c}/store',
                        f'--config.data.mixture.a.weight=1',
                        f'--config.data.mixture.b.source={c}/corpus.txt',
                        f'--config.data.mixture.b.weight=1', '--show=1'],
}


@pytest.mark.parametrize('command', READS_THE_RUN)
def test_a_vocabulary_retrained_under_the_same_path_is_refused_naming_both_digests(
    world, tmp_path, capfd, command):
  _, a, b = world
  case = case_of(world, tmp_path)
  before = snapshot(tmp_path)
  status, err = in_this_process(READS_THE_RUN[command](case), capfd)
  lines = err.strip().splitlines()
  assert (status, len(lines)) == (2, 1), err[-3000:]
  assert f'sha256 {a[:12]}' in lines[0] and f'sha256 {b[:12]}' in lines[0], lines[0]
  assert 'was made with the vocabulary' in lines[0], lines[0]
  after = snapshot(tmp_path)
  assert after == before, changes(before, after)


def test_a_workdir_made_before_the_record_trains_on_and_records_it(world, tmp_path, capfd):
  """No vocabulary.json: t5lite before 2026-12-04 made it. It is not checked (it cannot be),
  trains on with the vocabulary its config names, and records it from then on."""
  base, a, _ = world
  run = tmp_path / 'run'
  shutil.copytree(base / 'run', run)
  os.remove(run / vocabulary.RECORD_FILE)
  spm = str(base / 'spm' / 'vocab.model')
  config = json.loads((run / 'config.json').read_text())
  config['data']['vocabulary'] = spm  # its config named the world's A
  (run / 'config.json').write_text(json.dumps(config))
  status, err = in_this_process(['train', f'--workdir={run}', '--config.train.steps=2'], capfd)
  assert status == 0, err[-3000:]
  with open(run / vocabulary.RECORD_FILE, encoding='utf-8') as f:
    assert json.load(f)['sha256'] == a


def test_a_workdir_of_the_bundled_vocabulary_before_2026_12_04_keeps_it(tmp_path, capfd):
  """A workdir made before the record, whose config names 'bundled', was made with what is now
  'bundled-v1' (the bundled model regenerated with UL2's mode tokens moved every id): it resumes
  with it and no flag; given today's 'bundled' (a preset's), it is refused naming both digests
  and the setting that reads it."""
  run = tmp_path / 'run'
  flags = ['--config.data.source=synthetic', '--config.train.steps=2',
           '--config.checkpoint.every_steps=1']
  status, err = in_this_process(['train', f'--workdir={run}', *TINY_RUN, *flags,
                                 '--config.data.vocabulary=bundled-v1'], capfd)
  assert status == 0, err[-3000:]
  config = json.loads((run / 'config.json').read_text())
  config['data']['vocabulary'] = 'bundled'  # as t5lite wrote it then
  (run / 'config.json').write_text(json.dumps(config))
  os.remove(run / vocabulary.RECORD_FILE)
  before = snapshot(tmp_path)
  status, err = in_this_process(['train', f'--workdir={run}', *TINY_RUN, *flags,
                                 '--config.train.steps=3'], capfd)
  assert status == 2 and len(err.strip().splitlines()) == 1, err[-3000:]
  v1, today = (vocabulary.load_vocabulary(name).digest[:12] for name in ('bundled-v1', 'bundled'))
  assert f"'bundled-v1' (sha256 {v1})" in err and f'(sha256 {today})' in err, err
  assert err.strip().endswith('(--config.data.vocabulary=bundled-v1)'), err
  assert snapshot(tmp_path) == before
  status, err = in_this_process(['train', f'--workdir={run}', '--config.train.steps=3'], capfd)
  assert status == 0, err[-3000:]
  assert json.loads((run / 'config.json').read_text())['data']['vocabulary'] == 'bundled-v1'
  assert json.loads((run / vocabulary.RECORD_FILE).read_text())['sha256'][:12] == v1
