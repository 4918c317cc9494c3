"""Text sources: the bundled corpus, files with bad bytes and empty pieces, TFDS, the split."""

import collections
import gzip
import json
import lzma

import numpy as np
import pytest

from t5lite.data import sources


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
  documents, skipped = sources.read_documents(f'{path},{tmp_path / "empty.jsonl"}', 'body')
  assert documents == ['one', 'two']
  assert skipped == {'lines_without_body': 3, 'empty_documents': 1, 'non_utf8_documents': 1,
                     'empty_files': 1}


def test_non_utf8_paragraphs_are_skipped_not_fatal(tmp_path):
  (tmp_path / 'a.txt').write_bytes(b'good one\n\nbad \xff\xfe bytes\n\ngood two')
  documents, skipped = sources.read_documents(str(tmp_path / 'a.txt'))
  assert documents == ['good one', 'good two'] and skipped == {'non_utf8_documents': 1}


@pytest.mark.parametrize('make_source, message', [
    (lambda d: str(d / 'missing.txt'), 'no such file'),
    (lambda d: str(d / 'nothing*.jsonl'), 'matches no files'),
    (lambda d: str(d / 'notes.csv'), r'is not .txt, .jsonl \(optionally .gz, .xz or .zst\)'),
    (lambda d: str(d / 'empty.txt'), 'holds no text'),
    (lambda d: 'tfds:c4/en:3.1.0', 'is not prepared in'),
])
def test_unusable_sources_fail_with_one_line(tmp_path, make_source, message):
  (tmp_path / 'notes.csv').write_text('a,b')
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
  skipped = collections.Counter()
  texts = list(items[0].documents(skipped))
  assert len(texts) == 135 and skipped == {'empty_documents': 15}  # every tenth one is empty
  with pytest.raises(ValueError, match="no text feature 'body'"):
    sources.inputs('tfds:t5lite_test_text/short', 'body', tfds_dir)
