"""Text sources: the bundled corpus, files with bad bytes and empty pieces, TFDS, the split."""

import collections
import gzip
import json
import lzma

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from t5lite import cli
from t5lite.data import sources
from tests.fs import changes, snapshot


def test_bundled_corpus_has_its_555_documents():
  documents, skipped = sources.read_documents('bundled')
  assert len(documents) == 555 and not skipped
  assert documents[0].startswith('Fellow-Citizens of the Senate')


def test_txt_documents_are_separated_by_blank_lines(tmp_path):
  (tmp_path / 'a.txt').write_text('First doc,\nstill first.\n\n  \nSecond doc.\n\n\n')
  (tmp_path / 'b.txt.gz').write_bytes(gzip.compress(b'Third doc.'))
  documents, skipped = sources.read_documents(str(tmp_path / '*.txt*'))
  assert documents == ['First doc,\nstill first.', 'Second doc.', 'Third doc.']
  assert not skipped


def test_jsonl_reads_text_key_and_counts_what_it_skips(tmp_path):
  lines = [json.dumps({'body': 'one'}).encode(), b'{not json', json.dumps({'x': 1}).encode(),
           json.dumps({'body': '   '}).encode(), b'{"body": "caf\xe9"}',
           json.dumps({'body': 7}).encode(), json.dumps({'body': 'two'}).encode()]
  path = tmp_path / 'docs.jsonl.xz'
  path.write_bytes(lzma.compress(b'\n'.join(lines)))
  (tmp_path / 'empty.jsonl').write_bytes(b'\n \n')
  documents, skipped = sources.read_documents(f'{path},{tmp_path / "empty.jsonl"}', 'body',
                                              skipped=sources.Skipped(max_bad_fraction=0.6))
  assert documents == ['one', 'two']
  assert skipped == {'lines_without_body': 3, 'empty_documents': 1, 'non_utf8_documents': 1,
                     'empty_files': 1}
  assert skipped.read == 7 and skipped.first_malformed == f'{path}:2'
  assert skipped.line() == (f'skipped 5 of 7 pieces read (empty_documents: 1, lines_without_body: '
                            f'3, non_utf8_documents: 1; the first malformed at {path}:2) and 1 '
                            'empty file(s)')


def test_non_utf8_paragraphs_are_skipped_not_fatal(tmp_path):
  (tmp_path / 'a.txt').write_bytes(b'good one\n\n\nbad \xff\xfe\nbytes\n\ngood two')
  documents, skipped = sources.read_documents(str(tmp_path / 'a.txt'),
                                              skipped=sources.Skipped(max_bad_fraction=0.5))
  assert documents == ['good one', 'good two'] and skipped == {'non_utf8_documents': 1}
  assert (skipped.read, skipped.first_malformed) == (3, f'{tmp_path / "a.txt"}:4')


@pytest.mark.parametrize('make_source, message', [
    (lambda d: str(d / 'missing.txt'), 'no such file'),
    (lambda d: str(d / 'nothing*.jsonl'), 'matches no files'),
    (lambda d: str(d / 'notes.docx'),
     r'is not .txt, .jsonl \(optionally .gz, .xz or .zst\) or .parquet$'),
    (lambda d: str(d / 'empty.txt'), 'holds no text'),
    (lambda d: 'tfds:c4/en:3.1.0', 'is not prepared in'),
])
def test_unusable_sources_fail_with_one_line(tmp_path, make_source, message):
  (tmp_path / 'notes.docx').write_text('a,b')
  (tmp_path / 'empty.txt').write_text('')
  with pytest.raises((ValueError, FileNotFoundError), match=message) as error:
    sources.read_documents(make_source(tmp_path))
  assert '\n' not in str(error.value)


def test_validation_split_is_stable_disjoint_and_by_document():
  documents, _ = sources.read_documents('bundled')
  train = sources.split_mask(documents, 'train', 0.05)
  validation = sources.split_mask(documents, 'validation', 0.05)
  np.testing.assert_array_equal(train, ~validation)
  assert 10 <= validation.sum() <= 50  # about 5% of 555
  assert sources.split_mask(documents, 'all', 0.05).all()
  # A document's split depends on its text alone, not on the others or their order.
  again = sources.split_mask(documents[::-1], 'validation', 0.05)[::-1]
  np.testing.assert_array_equal(again, validation)
  assert not sources.split_mask(documents, 'validation', 0.0).any()


@pytest.mark.parametrize('name, message', [
    ('c4/en:3.1.0', 'is not prepared in'),
    ('no_such_dataset_anywhere', 'not found in'),
])
def test_tfds_datasets_not_prepared_fail_with_one_line(tmp_path, name, message):
  with pytest.raises(ValueError, match=message) as error:
    sources.tfds_builder(name, str(tmp_path))
  assert '\n' not in str(error.value)


def test_tfds_inputs_are_its_file_shards_read_in_order(tfds_dir):
  items = sources.inputs('tfds:t5lite_test_text/short', tfds_data_dir=tfds_dir)
  assert [item.split for item in items] == [None]  # no published validation split: by hash
  skipped = sources.Skipped()
  texts = list(items[0].documents(skipped))
  assert len(texts) == 135 and skipped == {'empty_documents': 15}  # every tenth one is empty
  assert (skipped.read, skipped.first_malformed) == (150, '')
  with pytest.raises(ValueError, match="no text feature 'body'"):
    sources.inputs('tfds:t5lite_test_text/short', 'body', tfds_dir)


def jsonl(texts, key='text') -> bytes:
  return b''.join(json.dumps({key: t}).encode() + b'\n' for t in texts)


CUT = jsonl(['one', 'two', 'three']) + b'{"text": "fo'  # a download cut inside line 4
CUT_FILES = {
    'cut.jsonl': CUT,
    'cut.jsonl.gz': gzip.compress(CUT),  # a whole .gz of a cut .jsonl
    'cut.jsonl.zst': zstandard.ZstdCompressor().compress(CUT),
    'cut_in_a_character.jsonl': jsonl(['one']) + '{"text": "é"}'.encode()[:-3],
}


@pytest.mark.parametrize('name', sorted(CUT_FILES))
def test_a_jsonl_whose_last_line_is_cut_is_refused(tmp_path, name):
  (tmp_path / name).write_bytes(CUT_FILES[name])
  line = 2 if name.startswith('cut_in') else 4
  with pytest.raises(ValueError) as error:
    sources.read_documents(str(tmp_path / name))
  assert str(error.value) == (f'data.source: {tmp_path / name} is not a complete .jsonl file: its '
                              f'last line, {line}, is cut short (no newline ends it, and it is '
                              'not a whole JSON record)')


def test_a_last_line_without_newline_that_is_whole_is_read(tmp_path):
  (tmp_path / 'a.jsonl').write_bytes(jsonl(['one']) + b'{"text": "two"}  ')
  (tmp_path / 'b.jsonl').write_bytes(jsonl(['three']) + b'{"body": "x"}')  # whole, malformed
  documents, skipped = sources.read_documents(str(tmp_path / '*.jsonl'),
                                              skipped=sources.Skipped(max_bad_fraction=0.5))
  assert documents == ['one', 'two', 'three'] and skipped == {'lines_without_text': 1}
  assert skipped.first_malformed == f'{tmp_path / "b.jsonl"}:2'


def test_malformed_pieces_are_bounded_per_file_not_per_source(tmp_path):
  """A binary file among good ones is refused though the source is 1% malformed; empty
  documents and parquet nulls never count as malformed."""
  for i in range(3):
    (tmp_path / f'good{i}.jsonl').write_bytes(jsonl(f'document {i} {j}' for j in range(100)))
  (tmp_path / 'good3.jsonl').write_bytes(jsonl([''] * 60 + ['x'] * 40))  # 60% empty: fine
  pq.write_table(pa.table({'text': [None] * 50 + ['y'] * 50}), tmp_path / 'good4.parquet')
  (tmp_path / 'zz.jsonl').write_bytes(b'\x89PNG\r\n\x1a\n\x00\x00\n\xff\xd8\n')  # 4 lines
  _, skipped = sources.read_documents(str(tmp_path / 'good*'))
  assert (skipped.read, skipped.first_malformed) == (500, '')
  assert skipped == {'empty_documents': 60, 'null_text': 50}
  assert skipped.line() == 'skipped 110 of 500 pieces read (empty_documents: 60, null_text: 50)'
  with pytest.raises(ValueError) as error:
    sources.read_documents(str(tmp_path / '*'), flag='--input')
  bad = tmp_path / 'zz.jsonl'
  assert str(error.value) == (f'--input: 4 of the 4 lines of {bad} are malformed '
                              '(lines_without_text: 2, non_utf8_documents: 2; the first at '
                              f'{bad}:1), more than 0.01 of them')


def test_max_bad_fraction_bounds_the_malformed_lines_of_each_file(tmp_path):
  """1 malformed line of 100 is within 0.01, 2 are not: a wrong text key that a few lines happen
  to have is refused, not made a store of those few."""
  for bad in (1, 2):
    lines = [json.dumps({'text': f'doc {i}'}) for i in range(100 - bad)]
    lines[50:50] = [json.dumps({'body': 'other'})] * bad
    (tmp_path / f'{bad}.jsonl').write_text('\n'.join(lines) + '\n')
  skipped = sources.Skipped(max_bad_fraction=0.01, flag='--max_bad_fraction')
  (one,) = sources.inputs(str(tmp_path / '1.jsonl'))
  assert len(list(one.documents(skipped))) == 99
  assert (skipped, skipped.read) == ({'lines_without_text': 1}, 100)
  (two,) = sources.inputs(str(tmp_path / '2.jsonl'))
  with pytest.raises(ValueError, match=r'^--max_bad_fraction: 2 of the 100 lines of .*2\.jsonl '
                     r'are malformed \(lines_without_text: 2; the first at .*2\.jsonl:51\), more '
                     r'than 0.01 of them$'):
    list(two.documents(skipped))
  documents, skipped = sources.read_documents(str(tmp_path / '2.jsonl'), 'body',
                                              skipped=sources.Skipped(max_bad_fraction=1))
  assert documents == ['other'] * 2 and skipped.read == 100  # unbounded: a 2-document source


def test_a_plain_counter_still_counts_by_reason_unbounded(tmp_path):
  (tmp_path / 'a.jsonl').write_bytes(b'{"text": "one"}\nnot json\n\n{"text": ""}\n')
  skipped = collections.Counter()
  (item,) = sources.inputs(str(tmp_path / 'a.jsonl'))
  assert list(item.documents(skipped)) == ['one']
  assert dict(sorted(skipped.items())) == {'empty_documents': 1, 'lines_without_text': 1}


@pytest.mark.parametrize('fraction', [-0.1, 1.5])
def test_max_bad_fraction_outside_0_1_is_refused(fraction):
  with pytest.raises(ValueError, match=rf'^--max_bad_fraction={fraction} must be in \[0, 1\]$'):
    sources.Skipped(max_bad_fraction=fraction)


def test_bundled_with_a_wrong_text_key_is_refused():
  with pytest.raises(ValueError, match='^data.source: 555 of the 555 lines of bundled are '
                     r'malformed \(lines_without_body: 555; the first at bundled:1\)'):
    sources.read_documents('bundled', 'body')


def test_files_are_read_in_sorted_order_of_their_paths_each_once(tmp_path, tfds_dir):
  for name in ('b.jsonl', 'a.txt', 'c.jsonl'):
    (tmp_path / name).write_bytes(jsonl([name]) if name.endswith('.jsonl') else name.encode())
  (tmp_path / 'sub').mkdir()
  (tmp_path / 'sub' / 'a.txt').write_text('sub/a.txt')
  names = lambda source: [item.name for item in sources.inputs(source, tfds_data_dir=tfds_dir)]
  a, b, c = (str(tmp_path / n) for n in ('a.txt', 'b.jsonl', 'c.jsonl'))
  assert names(f'{c},{a},{b}') == names(f'{b}, {a},{c}') == [a, b, c]
  # a glob and a comma list together; a file named twice, however spelled, is read once
  assert names(f'{tmp_path}/sub/../b.jsonl,{tmp_path}/*.jsonl,{a},{a}') == [
      a, f'{tmp_path}/sub/../b.jsonl', c]
  assert names(f'{tmp_path}/sub/a.txt,{c},{a}') == [a, c, str(tmp_path / 'sub' / 'a.txt')]
  # then 'bundled', then TFDS datasets by name, each one's file shards in their own order
  tfds = (f'tfds:t5lite_test_text/short,{c},bundled,tfds:t5lite_test_text/empty,'
          f'tfds:t5lite_test_text/short,bundled,{a}')
  assert names(tfds) == [a, c, 'bundled', 'tfds:t5lite_test_text/empty/1.0.0 train[0:200]',
                         'tfds:t5lite_test_text/short/1.0.0 train[0:150]']
  documents, _ = sources.read_documents([b, a, c, b])
  assert documents == ['a.txt', 'b.jsonl', 'c.jsonl']


def prepare(capsys, *flags) -> tuple[int, str, str]:
  status = cli.main(['prepare', *flags])
  out, err = capsys.readouterr()
  return status, out, err


def test_a_comma_list_in_any_order_makes_the_same_store(tmp_path, capsys):
  for name in 'abcd':
    (tmp_path / f'{name}.jsonl').write_bytes(jsonl(f'{name} document {i}' for i in range(40)))
  stores = []
  for order in ('a,b,c,d', 'd,c,b,a'):
    source = ','.join(str(tmp_path / f'{name}.jsonl') for name in order.split(','))
    for index in range(2):
      assert prepare(capsys, f'--source={source}', f'--out={tmp_path / order}', '--num_shards=2',
                     f'--shard_index={index}')[0] == 0
    stores.append({f.name: f.read_bytes() for f in (tmp_path / order).iterdir()
                   if not f.name.endswith('.json')})
    manifest = json.loads((tmp_path / order / 'part-00001-of-00002.json').read_text())
    assert manifest['inputs'] == [str(tmp_path / 'c.jsonl'), str(tmp_path / 'd.jsonl')]
  assert stores[0] == stores[1] and len(stores[0]) == 8  # 2 parts: 2 splits, their checksums


# What prepare refuses in the source itself: one stderr line, exit status 2, nothing written.
BAD_SOURCES = {
    'a folder': (lambda d: d / 'texts', lambda d: f"--source: {d / 'texts'} is a folder: give "
                 f"the text files in it (e.g. '{d / 'texts'}/*.jsonl'); a token store is given "
                 'alone as data.source'),
    'a missing path': (lambda d: d / 'mytexts', lambda d: f"--source: {d / 'mytexts'}: no such "
                       'file or folder'),
    'an empty item': (lambda d: f"{d / 'texts' / 'a.jsonl'},,{d / 'texts' / 'a.jsonl'}",
                      lambda d: f"--source: item 2 of '{d / 'texts' / 'a.jsonl'},,"
                      f"{d / 'texts' / 'a.jsonl'}' is empty (two commas, or one at an end?)"),
    'a trailing comma': (lambda d: f"{d / 'texts' / 'a.jsonl'},",
                         lambda d: f"--source: item 2 of '{d / 'texts' / 'a.jsonl'},' is empty "
                         '(two commas, or one at an end?)'),
    'a cut last line': (lambda d: d / 'cut.jsonl.gz', lambda d: f"--source: {d / 'cut.jsonl.gz'} "
                        'is not a complete .jsonl file: its last line, 4, is cut short (no '
                        'newline ends it, and it is not a whole JSON record)'),
}


@pytest.mark.parametrize('case', sorted(BAD_SOURCES))
def test_a_bad_source_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, case):
  source, message = BAD_SOURCES[case]
  (tmp_path / 'texts').mkdir()
  (tmp_path / 'texts' / 'a.jsonl').write_bytes(jsonl(['one']))
  (tmp_path / 'cut.jsonl.gz').write_bytes(gzip.compress(CUT))
  before = snapshot(tmp_path)
  status, out, err = prepare(capsys, f'--source={source(tmp_path)}', f'--out={tmp_path / "s"}')
  assert (status, out, err) == (2, '', f't5lite prepare: error: {message(tmp_path)}\n')
  assert snapshot(tmp_path) == before, changes(before, snapshot(tmp_path))


def test_a_missing_path_in_a_data_source_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match=f'^data.source: {tmp_path}/corpus: no such file or '
                     'folder$'):
    sources.inputs(f'bundled,{tmp_path}/corpus')
