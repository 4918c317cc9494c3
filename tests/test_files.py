"""The reading boundary (t5lite/files.py): every way a file can be bad is one ValueError line that
names the file (and the line, where there is one)."""

import gzip
import lzma
import os

import pytest

from t5lite import files


@pytest.fixture
def bad(tmp_path):
  """Files each bad in one way, by name."""
  text = 'the sea\n\nthe ship\n'.encode() * 20
  (tmp_path / 'cut.txt.gz').write_bytes(gzip.compress(text)[:30])
  (tmp_path / 'plain.txt.gz').write_bytes(text)
  (tmp_path / 'cut.txt.xz').write_bytes(lzma.compress(text)[:30])
  (tmp_path / 'latin1.txt').write_bytes('one\ntwo\ncaf\xe9\n'.encode('latin-1'))
  (tmp_path / 'deep.json').write_text('[' * 100_000 + ']' * 100_000)
  (tmp_path / 'list.json').write_text('[1, 2]')
  (tmp_path / 'broken.json').write_text('{\n  "a": 1,\n  "b": }\n')
  (tmp_path / 'folder.txt').mkdir()
  os.mkfifo(tmp_path / 'fifo.txt')
  return tmp_path


@pytest.mark.parametrize('name, read, message', [
    ('cut.txt.gz', files.read_bytes, 'is not a complete .gz file'),
    ('plain.txt.gz', files.read_bytes, 'is not a complete .gz file (Not a gzipped file'),
    ('cut.txt.xz', files.read_bytes, 'is not a complete .xz file'),
    ('latin1.txt', files.read_text, ':3: not UTF-8 text (byte 0xe9)'),
    ('deep.json', files.read_json, ' is JSON nested too deep to read'),
    ('list.json', files.read_json, ' is an array, not an object'),
    ('broken.json', files.read_json, " is not JSON (Expecting value at line 3 column 8)"),
    ('folder.txt', files.read_bytes, ' is a folder, not a file'),
    ('fifo.txt', files.read_bytes, ' is not a regular file (a FIFO, socket or device)'),
])
def test_a_bad_file_is_one_line_naming_it(bad, name, read, message):
  with pytest.raises(ValueError) as error:
    read(str(bad / name), '--input')
  assert str(error.value).startswith(f'--input: {bad / name}'), str(error.value)
  assert message in str(error.value) and '\n' not in str(error.value)


def test_a_missing_file_is_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError, match=f'^data.source: {tmp_path}/none.txt: no such file$'):
    files.read_bytes(str(tmp_path / 'none.txt'), 'data.source')


def test_compressed_files_are_read_whole(tmp_path):
  (tmp_path / 'a.txt.gz').write_bytes(gzip.compress(b'the sea'))
  (tmp_path / 'a.txt.xz').write_bytes(lzma.compress('café'.encode()))
  assert files.read_bytes(str(tmp_path / 'a.txt.gz')) == b'the sea'
  assert files.read_text(str(tmp_path / 'a.txt.xz')) == 'café'


@pytest.mark.parametrize('value, expected, message', [
    (None, int, 'x is null, not an integer'),
    ('256', int, "x is a string, not an integer"),
    (4.5, int, 'x is a number, not an integer'),
    (True, int, 'x is true or false, not an integer'),
    (3, float, None),
    (False, bool, None),
    ([], dict, 'x is an array, not an object'),
])
def test_json_types_are_checked_as_json_names_them(value, expected, message):
  if message is None:
    files.check_type(value, expected, 'x')
    return
  with pytest.raises(ValueError, match=f'^{message}$'):
    files.check_type(value, expected, 'x')
