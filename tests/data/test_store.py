"""Token stores: `t5lite prepare` from every format, trained from exactly as the source in memory,
on any process count, after a SIGKILL of prepare or of training, and the bad inputs it refuses."""

import gzip
import io
import json
import lzma
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from t5lite import cli
from t5lite.data import sources
from t5lite.data import spm_training
from t5lite.data import store
from t5lite.data import vocabulary
from t5lite.inputs import batches
from tests.fs import changes, snapshot
from tests.test_cli_mistakes import DISK_MIB, small_disk  # pylint: disable=unused-import
from tests.train.test_loop import SMALL, metrics, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ('the whale ship sea captain mind letter house sister ball dance carriage harpoon '
         'congress nation people war peace union states money law year great').split()


def documents(count: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [' '.join(rng.choice(WORDS, rng.integers(20, 200))).capitalize() + '.'
          for _ in range(count)]


def write_corpus(folder) -> list[str]:
  """The same kind of text in every format t5lite reads; returns the documents in file order."""
  folder.mkdir(exist_ok=True)
  texts = documents(300, seed=1)
  parts = [texts[i::6] for i in range(6)]  # a.txt, b.jsonl, c.jsonl.gz, ... in sorted order
  (folder / 'a.txt').write_text('\n\n'.join(parts[0]))
  (folder / 'b.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in parts[1]))
  jsonl = [''.join(json.dumps({'text': t, 'id': i}) + '\n' for i, t in enumerate(p)).encode()
           for p in parts[2:5]]
  (folder / 'c.jsonl.gz').write_bytes(gzip.compress(jsonl[0]))
  (folder / 'd.jsonl.xz').write_bytes(lzma.compress(jsonl[1]))
  (folder / 'e.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(jsonl[2]))
  pq.write_table(pa.table({'text': parts[5], 'n': list(range(len(parts[5])))}),
                 folder / 'f.parquet', row_group_size=7)
  return [t for p in parts for t in p]


def prepare(capsys, *flags) -> tuple[int, str, str]:
  status = cli.main(['prepare', *flags])
  out, err = capsys.readouterr()
  return status, out, err


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  folder = tmp_path_factory.mktemp('corpus')
  return folder, write_corpus(folder / 'text')


@pytest.fixture(scope='module')
def bundled_store(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('stores') / 'bundled')
  assert cli.main(['prepare', '--source=bundled', f'--out={out}']) == 0
  return out


def take(pipeline, n):
  return [next(pipeline) for _ in range(n)]


def assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for name in x:
      np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def test_a_store_of_the_bundled_corpus_gives_the_bundled_batches_bit_for_bit(bundled_store,
                                                                               small_data):
  for split in ('train', 'validation'):
    from_memory = take(batches.make_batches(small_data(), split, process_index=0,
                                            process_count=1), 3)
    from_store = take(batches.make_batches(small_data(source=bundled_store), split,
                                           process_index=0, process_count=1), 3)
    assert_same(from_store, from_memory)
  manifest = json.loads(open(os.path.join(bundled_store, 'part-00000-of-00001.json')).read())
  assert manifest['documents'] == {'train': 532, 'validation': 23}
  assert manifest['tokens'] == {'train': 3_334_176, 'validation': 127_457}
  assert manifest['dtype'] == '<u2' and manifest['skipped'] == {}


@pytest.mark.parametrize('objective, lengths', [
    ('mlm_nsp', (32, 0)), ('bart', (32, 32)), ('causal_lm', (0, 32)), ('prefix_lm', (16, 16))])
def test_every_objective_reads_a_store_as_it_reads_the_source(bundled_store, small_data,
                                                              objective, lengths):
  """Next-sentence pairs take their other text from anywhere in the store; BART finds its
  sentence ends in the store's tokens."""
  settings = dict(objective=objective, inputs_length=lengths[0], targets_length=lengths[1],
                  batch_size=4)
  assert_same(take(batches.make_batches(small_data(source=bundled_store, **settings),
                                        process_index=0, process_count=1), 2),
              take(batches.make_batches(small_data(**settings), process_index=0,
                                        process_count=1), 2))


def test_every_format_prepares_into_the_tokens_the_source_gives_in_memory(corpus, tmp_path,
                                                                         capsys, small_data):
  folder, texts = corpus
  source = str(folder / 'text' / '*')
  status, out, err = prepare(capsys, f'--source={source}', f'--out={tmp_path / "s"}')
  assert (status, err) == (0, '')
  manifest = json.loads((tmp_path / 's' / 'part-00000-of-00001.json').read_text())
  assert sum(manifest['documents'].values()) == len(texts) == 300
  assert [os.path.basename(name) for name in manifest['inputs']] == [
      'a.txt', 'b.jsonl', 'c.jsonl.gz', 'd.jsonl.xz', 'e.jsonl.zst', 'f.parquet']
  vocab = vocabulary.load_vocabulary('bundled')
  expected = sum(len(ids) for ids in vocab.encode_documents(texts))
  assert sum(manifest['tokens'].values()) == expected
  assert f'300 documents, {expected:,} tokens' in out
  for split in ('train', 'validation', 'all'):
    from_store = store.split_tokens(small_data(source=str(tmp_path / 's')), split)
    in_memory = store.split_tokens(small_data(source=source), split)
    np.testing.assert_array_equal(from_store.window(0, from_store.size),
                                  in_memory.window(0, in_memory.size))


def test_a_byte_store_holds_the_utf8_text_and_reads_as_the_source(corpus, tmp_path, capsys,
                                                                  small_data):
  """--vocabulary=bytes needs no model: a split's file is its documents' UTF-8 bytes, one a
  token (uint8), read as ids byte + 3; batches of ByT5's span corruption from the store are the
  source's in memory, and `data --verify` reads it whole."""
  folder, texts = corpus
  source = str(folder / 'text' / '*')
  status, out, err = prepare(capsys, f'--source={source}', f'--out={tmp_path / "b"}',
                             '--vocabulary=bytes')
  assert (status, err) == (0, '')
  manifest = json.loads((tmp_path / 'b' / 'part-00000-of-00001.json').read_text())
  assert manifest['dtype'] == '|u1'
  assert manifest['vocabulary'] == vocabulary.load_vocabulary('bytes').identity('bytes')
  assert sum(manifest['tokens'].values()) == sum(len(t.encode('utf-8')) for t in texts)
  held_out = sources.in_validation(texts, 0.05)
  train_text = ''.join(t for t, h in zip(texts, held_out) if not h).encode('utf-8')
  assert (tmp_path / 'b' / 'part-00000-of-00001.train').read_bytes() == train_text
  settings = dict(vocabulary='bytes', mean_noise_span_length=20.0, inputs_length=64,
                  targets_length=13)
  stored = store.split_tokens(small_data(source=str(tmp_path / 'b'), **settings), 'train')
  assert stored.window(0, 5).tolist() == [b + 3 for b in train_text[:5]]
  assert_same(take(batches.make_batches(small_data(source=str(tmp_path / 'b'), **settings),
                                        process_index=0, process_count=1), 2),
              take(batches.make_batches(small_data(source=source, **settings), process_index=0,
                                        process_count=1), 2))
  assert cli.main(['data', f'--verify={tmp_path / "b"}']) == 0
  assert f'{sum(manifest["tokens"].values()):,} tokens, every block' in capsys.readouterr().out


def test_parts_prepared_apart_are_one_store_and_any_process_count_reads_it_alike(
    corpus, tmp_path, capsys, small_data):
  folder, _ = corpus
  source = str(folder / 'text' / '*')
  whole, parts = str(tmp_path / 'whole'), str(tmp_path / 'parts')
  assert prepare(capsys, f'--source={source}', f'--out={whole}')[0] == 0
  for index in (2, 0, 1):  # in any order, as machines finish
    assert prepare(capsys, f'--source={source}', f'--out={parts}', '--num_shards=3',
                   f'--shard_index={index}')[0] == 0
  for split in ('train', 'validation'):
    a, b = store.Store(whole).tokens(split), store.Store(parts).tokens(split)
    np.testing.assert_array_equal(a.window(0, a.size), b.window(0, b.size))
  data = small_data(source=parts)
  one = take(batches.make_batches(data, process_index=0, process_count=1, start=5), 2)
  halves = [take(batches.make_batches(data, process_index=p, process_count=2, start=5), 2)
            for p in (0, 1)]
  for k in range(2):
    assert_same([{name: np.concatenate([halves[0][k][name], halves[1][k][name]])
                  for name in one[k]}], [one[k]])
  resumed = take(batches.make_batches(data, process_index=0, process_count=1, start=6), 1)
  assert_same(resumed, one[1:])


def test_windows_across_parts_read_the_concatenation():
  pieces = [np.arange(0, 5, dtype=np.uint16), np.arange(5, 7, dtype=np.uint16),
            np.arange(7, 20, dtype=np.uint16)]
  tokens = store.Tokens(pieces)
  assert tokens.size == 20
  np.testing.assert_array_equal(tokens.windows(np.array([0, 3, 4, 13]), 7),
                                [np.arange(b, b + 7) for b in (0, 3, 4, 13)])
  assert tokens.window(4, 4).dtype == np.int32


def test_data_show_prints_what_the_store_was_prepared_from(bundled_store, capsys):
  assert cli.main(['data', f'--config={ROOT}/configs/t5_tiny.py', '--show=1',
                   f'--config.data.source={bundled_store}']) == 0
  out = capsys.readouterr().out
  assert f'token store {bundled_store}: 1 part(s) prepared from bundled' in out
  assert 'train: 532 documents, 3,334,176 tokens' in out
  assert 'validation: 23 documents, 127,457 tokens (validation_fraction 0.05)' in out
  assert 'skipped: nothing' in out and 'example 0' in out


def test_skipped_records_are_counted_in_the_manifest(tmp_path, capsys):
  text = tmp_path / 'text'
  text.mkdir()
  lines = [json.dumps({'text': t}) for t in documents(20, seed=2)]
  lines[3:3] = ['{not json', json.dumps(['a list']), json.dumps({'body': 'no text key'}),
                b'{"text": "caf\xe9"}'.decode('latin-1')]
  (text / 'a.jsonl').write_bytes('\n'.join(lines).encode('latin-1'))
  status, out, err = prepare(capsys, f'--source={text / "a.jsonl"}', f'--out={tmp_path / "s"}',
                             '--max_bad_fraction=0.2')
  manifest = json.loads((tmp_path / 's' / 'part-00000-of-00001.json').read_text())
  assert status == 0 and sum(manifest['documents'].values()) == 20
  assert manifest['skipped'] == {'lines_without_text': 3, 'non_utf8_documents': 1}
  assert "skipped: {'lines_without_text': 3, 'non_utf8_documents': 1}" in out
  assert err == ('warning: skipped 4 of 24 pieces read (lines_without_text: 3, '
                 f'non_utf8_documents: 1; the first malformed at {text / "a.jsonl"}:4)\n')
  status, out, err = prepare(capsys, f'--source={text / "a.jsonl"}', f'--out={tmp_path / "t"}')
  assert (status, out) == (2, '') and err == (
      f't5lite prepare: error: --max_bad_fraction: 4 of the 24 lines of {text / "a.jsonl"} are '
      'malformed (lines_without_text: 3, non_utf8_documents: 1; the first at '
      f'{text / "a.jsonl"}:4), more than 0.01 of them\n')
  assert not (tmp_path / 't').exists()


def test_a_source_refused_for_its_size_says_what_was_skipped_in_the_same_line(tmp_path, capsys):
  """One line, not a warning and then the refusal."""
  lines = [json.dumps({'text': 'whale'})] * 100
  lines[40] = '{not json'
  (tmp_path / 'a.jsonl').write_text('\n'.join(lines) + '\n')
  status = cli.main(['data', f'--config={ROOT}/configs/t5_tiny.py', '--show=1',
                     f'--config.data.source={tmp_path / "a.jsonl"}'])
  err = capsys.readouterr().err
  assert status == 2 and re.fullmatch(
      't5lite data: error: the train split has [0-9]+ tokens, fewer than one example of [0-9]+; '
      'add text or change data.validation_fraction \\(skipped 1 of 100 pieces read '
      f'\\(lines_without_text: 1; the first malformed at {re.escape(str(tmp_path))}/a.jsonl:41'
      '\\)\\)\n', err), err


def truncated(data: bytes) -> bytes:
  return data[:len(data) // 2]


BAD_INPUTS = {
    'a missing file': (lambda d: str(d / 'missing.jsonl'), 'no such file'),
    'a glob matching nothing': (lambda d: str(d / 'none*.jsonl'), 'matches no files'),
    'a truncated .gz': (lambda d: d / 'cut.jsonl.gz', 'is not a complete .gz file'),
    'a truncated .zst': (lambda d: d / 'cut.jsonl.zst', 'is not a complete .zst file'),
    'a .gz that is not gzip': (lambda d: d / 'plain.jsonl.gz', 'is not a .gz file'),
    'no line with the text key': (lambda d: d / 'other_key.jsonl',
                                  "none of its 5 lines is a JSON object with a string under "
                                  "'text'"),
    'a parquet file without the column': (lambda d: d / 'body.parquet',
                                          "has no column 'text' \\(it has body\\)"),
    'a parquet column of numbers': (lambda d: d / 'numbers.parquet',
                                    "the column 'text' holds int64, not text"),
    'a file that is no parquet': (lambda d: d / 'fake.parquet', 'is not a parquet file'),
    'a folder named like a file': (lambda d: d / 'folder.jsonl', 'is a folder, not a file'),
    'a file of another kind': (lambda d: d / 'notes.docx', 'is not .txt, .jsonl'),
}


@pytest.fixture(scope='module')
def bad_inputs(tmp_path_factory):
  folder = tmp_path_factory.mktemp('bad')
  good = ''.join(json.dumps({'text': t}) + '\n' for t in documents(200, seed=3)).encode()
  (folder / 'cut.jsonl.gz').write_bytes(truncated(gzip.compress(good)))
  (folder / 'cut.jsonl.zst').write_bytes(truncated(zstandard.ZstdCompressor().compress(good)))
  (folder / 'plain.jsonl.gz').write_bytes(good)
  (folder / 'other_key.jsonl').write_text('\n'.join(json.dumps({'body': 'x'}) for _ in range(5)))
  pq.write_table(pa.table({'body': ['a b c']}), folder / 'body.parquet')
  pq.write_table(pa.table({'text': [1, 2]}), folder / 'numbers.parquet')
  (folder / 'fake.parquet').write_bytes(b'PAR1 not really')
  (folder / 'folder.jsonl').mkdir()
  (folder / 'notes.docx').write_text('a,b\n')
  return folder


@pytest.mark.parametrize('case', sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_nothing_written(bad_inputs, tmp_path, capsys, case):
  make_source, message = BAD_INPUTS[case]
  (tmp_path / 'store').mkdir()
  (tmp_path / 'store' / 'README').write_text('the user keeps notes here')
  before = snapshot(tmp_path)
  status, out, err = prepare(capsys, f'--source={make_source(bad_inputs)}',
                             f'--out={tmp_path / "store"}', '--overwrite')
  assert (status, out) == (2, '')
  assert len(err.splitlines()) == 1 and err.startswith('t5lite prepare: error: '), err
  assert re.search(message, err), err
  assert snapshot(tmp_path) == before, changes(before, snapshot(tmp_path))


def test_out_that_may_not_be_written_is_refused_before_reading(bundled_store, tmp_path, capsys):
  workdir = tmp_path / 'run'
  (workdir / 'checkpoints').mkdir(parents=True)
  (workdir / 'config.json').write_text('{}')
  (tmp_path / 'a_file').write_text('x')
  (tmp_path / 'short.model').write_bytes(vocabulary.load_vocabulary().model_proto[:50_000])
  cases = [
      ([f'--out={workdir / "store"}'], 'inside the workdir'),
      ([f'--out={tmp_path / "a_file"}'], 'is a file, not a folder'),
      ([f'--out={bundled_store}'], 'holds part 0 of 1 already \\(complete\\); --overwrite'),
      ([f'--out={tmp_path}/x', '--num_shards=2'], '--source has 1 input'),
      ([f'--out={tmp_path}/x', '--shard_index=1'], 'must be in \\[0, --num_shards=1\\)'),
      ([f'--out={tmp_path}/x', '--workers=3000000000'], '--workers=3000000000 must be at most'),
      ([f'--out={tmp_path}/x', '--num_shards=100000'], '--num_shards=100000 must be at most'),
      ([f'--out={tmp_path}/x', '--shard_index=99999'], '--shard_index=99999 must be at most'),
      ([f'--out={tmp_path}/x', '--validation_fraction=1'], 'must be in \\[0, 1\\)'),
      ([f'--out={tmp_path}/x', '--vocabulary=/no/such.model'],
       "--vocabulary: no such file '/no/such.model'"),
      ([f'--out={tmp_path}/x', f'--vocabulary={tmp_path / "short.model"}'],
       f'--vocabulary: {tmp_path / "short.model"} is not a SentencePiece model \\(cut short'),
  ]
  before = snapshot(tmp_path), snapshot(bundled_store)
  for flags, message in cases:
    status, out, err = prepare(capsys, '--source=bundled', *flags)
    assert status == 2 and len(err.splitlines()) == 1 and re.search(message, err), (flags, err)
  assert (snapshot(tmp_path), snapshot(bundled_store)) == before


def test_parts_of_another_vocabulary_or_setting_are_refused(corpus, tmp_path, capsys):
  folder, _ = corpus
  source = str(folder / 'text' / '*')
  out = tmp_path / 's'
  assert prepare(capsys, f'--source={source}', f'--out={out}', '--num_shards=2')[0] == 0
  status, _, err = prepare(capsys, f'--source={source}', f'--out={out}', '--num_shards=2',
                           '--shard_index=1', '--validation_fraction=0.1')
  assert status == 2 and 'holds part 0 of 2, prepared with another --validation_fraction' in err
  status, _, err = prepare(capsys, f'--source={source}', f'--out={out}', '--num_shards=3')
  assert status == 2 and 'holds part 0 of 2; give --num_shards=2, or a new --out' in err
  # a part of another vocabulary put there by hand is found by the reader
  other = tmp_path / 'other'
  assert prepare(capsys, f'--source={source}', f'--out={other}', '--num_shards=2',
                 '--shard_index=1')[0] == 0
  manifest = json.loads((other / 'part-00001-of-00002.json').read_text())
  manifest['vocabulary']['sha256'] = '0' * 64
  (other / 'part-00001-of-00002.json').write_text(json.dumps(manifest))
  os.rename(other / 'part-00001-of-00002.json', out / 'part-00001-of-00002.json')
  for split in store.SPLITS:
    os.rename(other / f'part-00001-of-00002.{split}', out / f'part-00001-of-00002.{split}')
  with pytest.raises(ValueError, match='part-00001-of-00002 was prepared with another vocabulary'):
    store.Store(str(out))


def test_a_store_missing_a_part_or_cut_short_is_refused_in_one_line(corpus, tmp_path, capsys,
                                                                    small_data):
  folder, _ = corpus
  out = tmp_path / 's'
  assert prepare(capsys, f'--source={folder / "text" / "*"}', f'--out={out}', '--num_shards=3',
                 '--shard_index=1')[0] == 0
  with pytest.raises(ValueError, match='lacks part\\(s\\) 0, 2 of 3'):
    batches.make_batches(small_data(source=str(out)), process_index=0, process_count=1)
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ValueError, match='holds no token store'):
    batches.make_batches(small_data(source=str(empty)), process_index=0, process_count=1)
  for index in (0, 2):
    assert prepare(capsys, f'--source={folder / "text" / "*"}', f'--out={out}',
                   '--num_shards=3', f'--shard_index={index}')[0] == 0
  with open(out / 'part-00002-of-00003.train', 'r+b') as f:
    f.truncate(100)
  with pytest.raises(ValueError, match='part-00002-of-00003.train holds 100 bytes, its manifest'):
    store.Store(str(out))


def test_a_run_with_another_vocabulary_is_refused_before_anything_is_written(
    bundled_store, tmp_path, capsys):
  """t5_tiny shrunk (test_loop.SMALL): the run initialises its model before it reads data."""
  (tmp_path / 'text.txt').write_text('\n\n'.join(documents(200, seed=4)))
  model = spm_training.train_tokenizer(str(tmp_path / 'text.txt'), 80, str(tmp_path / 'vocab'))
  status = train(tmp_path / 'run', f'--config.data.source={bundled_store}',
                 f'--config.data.vocabulary={model}')
  err = capsys.readouterr().err
  assert status == 2 and len(err.splitlines()) == 1, err
  made, given = store.Store(bundled_store).vocabulary['sha256'], vocabulary.load_vocabulary(model)
  assert f"was made with the vocabulary 'bundled' (sha256 {made[:12]})" in err, err
  assert f'(sha256 {given.digest[:12]})' in err, err
  assert not (tmp_path / 'run').exists()


def big_corpus(folder, files: int = 12, per_file: int = 600) -> str:
  """A few MB of JSONL in `files` files of `per_file` documents: prepare takes some seconds on 2
  cores."""
  folder.mkdir()
  texts = documents(per_file, seed=5)
  for i in range(files):
    with gzip.open(folder / f'{i:02d}.jsonl.gz', 'wt') as f:
      f.writelines(json.dumps({'text': t * 3}) + '\n' for t in texts)
  return str(folder / '*.jsonl.gz')


def ctrl_c_default():
  """For a child to send Ctrl-C to: SIGINT as a terminal's foreground process has it, whatever
  this process inherited (a shell's background job, `nohup`, ignores it, and so would the child)."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def tokenizing(source: str, out, python=('-m', 't5lite')) -> subprocess.Popen:
  """A process preparing `source` into `out` on one thread, once it is writing tokens."""
  process = subprocess.Popen([sys.executable, *python, 'prepare', f'--source={source}',
                              f'--out={out}', '--workers=1'], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=ctrl_c_default)
  deadline = time.monotonic() + 120
  while not any(f.stat().st_size for f in out.glob('.part-00000-of-00001.train.*.tmp')):
    assert process.poll() is None and time.monotonic() < deadline, process.communicate()
    time.sleep(0.01)
  return process


@pytest.mark.slow  # two prepare processes and a clean one: about 40 s on 2 cores
def test_a_killed_prepare_leaves_no_part_and_a_rerun_prepares_it_whole(tmp_path, capsys):
  source = big_corpus(tmp_path / 'text')
  out = tmp_path / 'store'
  process = tokenizing(source, out)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert not list(out.glob('*.json'))  # no part: a reader sees no store
  with pytest.raises(ValueError, match='holds no token store'):
    store.Store(str(out))
  status, _, err = prepare(capsys, f'--source={source}', f'--out={out}')
  assert status == 0 and re.fullmatch(  # the killed run's lock, taken over
      f'taking over the lock of part 0 of 1 of {out} left by pid {process.pid} on host .* since '
      '.* \\(no longer running\\)\n', err), err
  assert sorted(os.listdir(out)) == [f'part-00000-of-00001.{s}' for s in
                                     ('json', 'train', 'train.crc32c', 'validation',
                                      'validation.crc32c')]
  assert prepare(capsys, f'--source={source}', f'--out={tmp_path / "clean"}')[0] == 0
  for name in os.listdir(out):
    assert (out / name).read_bytes() == (tmp_path / 'clean' / name).read_bytes(), name


# `python -m t5lite`, with a gc callback as JAX registers one (prepare loads no JAX)
IN_GC = ('import gc, runpy; gc.callbacks.append(lambda phase, info: None); '
         "runpy.run_module('t5lite', run_name='__main__', alter_sys=True)")


@pytest.mark.parametrize('python', [['-m', 't5lite'], ['-c', IN_GC]], ids=['plain', 'gc_callback'])
def test_ctrl_c_stops_prepare_at_once_in_one_line_and_leaves_no_part(tmp_path, python):
  """Thousands of documents per SentencePiece call: the lists of their ids run the garbage
  collector, and its callbacks, right after the call a Ctrl-C most likely lands in. Python only
  reports an exception raised in a gc callback, so the Ctrl-C was lost there and prepare went on
  to finish, exit 0 (with JAX's callback, before prepare stopped loading JAX)."""
  source = big_corpus(tmp_path / 'text', files=6, per_file=1500)
  out = tmp_path / 'store'
  process = tokenizing(source, out, python)
  try:
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=10)
  finally:
    process.kill()
  assert process.returncode == 130 and err == 't5lite prepare: error: interrupted (Ctrl-C)\n', err
  assert not list(out.glob('part-*.json'))


@pytest.mark.slow  # two training processes and one run here: about a minute on 2 cores
def test_training_from_a_store_killed_and_resumed_is_bitwise_the_uninterrupted_run(
    bundled_store, tmp_path):
  """The uninterrupted run in this process; the killed one and its restart are processes of as
  many (fake) devices, which therefore compute alike and share its compiled step."""
  flags = [f'--config.data.source={bundled_store}', '--config.train.steps=8',
           '--config.checkpoint.every_steps=2']

  def launch(workdir, kill_after=None):
    process = subprocess.Popen([sys.executable, '-m', 't5lite', 'train', f'--workdir={workdir}',
                                *SMALL, *flags], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
      if kill_after and line.startswith(f'step {kill_after}/'):
        process.send_signal(signal.SIGKILL)
        break
    return process.wait(timeout=300)

  assert train(tmp_path / 'straight', *flags) == 0
  assert launch(tmp_path / 'killed', kill_after=5) == -signal.SIGKILL
  assert launch(tmp_path / 'killed') == 0
  straight, resumed = metrics(tmp_path / 'straight'), metrics(tmp_path / 'killed')
  assert sorted(straight) == sorted(resumed) == list(range(1, 9))
  assert [straight[s]['loss'] for s in straight] == [resumed[s]['loss'] for s in straight]


def test_the_progress_line_counts_documents_tokens_and_the_inputs_read(corpus, tmp_path,
                                                                       monkeypatch):
  from t5lite.commands import prepare  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(prepare, '_PROGRESS_EVERY_S', 0.0)
  shown = io.StringIO()
  folder, texts = corpus
  manifest, _ = prepare.prepare(str(folder / 'text' / '*'), str(tmp_path / 's'), progress=shown)
  lines = shown.getvalue().split('\r')[1:]
  assert lines[-1].startswith(f'part-00000-of-00001: {len(texts)} documents, '
                              f'{sum(manifest["tokens"].values()):,} tokens, ')
  assert lines[-1].rstrip().endswith('6.0/6 inputs, ETA 0 s')
  assert shown.getvalue().endswith('\n')


def test_a_full_disk_is_one_line_and_leaves_nothing(small_disk, capsys):
  """The disk fills while the part is written: one line, exit 2, and the part's temporaries are
  gone (what was on the disk before stays)."""
  with open(os.path.join(small_disk, 'filler'), 'wb') as f:
    f.write(b'\0' * (DISK_MIB - 4) * 2**20)  # room for 4 MiB: the bundled store needs 6.9 MB
  before = snapshot(small_disk)
  status, out, err = prepare(capsys, '--source=bundled', f'--out={small_disk}/store')
  assert (status, out) == (2, '') and len(err.splitlines()) == 1, err
  assert 'no space left on the device' in err
  assert snapshot(small_disk) == before, changes(before, snapshot(small_disk))
