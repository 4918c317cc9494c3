"""Where text comes from: the documents of a source, streamed in a fixed order.

A source (`data.source`, `t5lite prepare --source`) is comma-separated parts, each one of
- 'bundled': the package's corpus.jsonl.xz (555 documents; see bundled/PROVENANCE.md);
- a path or glob, local or gs://: `.txt` files hold documents separated by blank lines (so one big
  corpus.txt still gives a validation split, and a file of one paragraph is one document);
  `.jsonl` files hold one JSON object per line with the text under `text_key`; either may be
  compressed as `.gz`, `.xz` or `.zst`; `.parquet` files hold the text in the column `text_key`;
- 'tfds:NAME' (e.g. 'tfds:c4/en:3.1.0'), prepared beforehand under `tfds_data_dir`: never
  downloaded.

`inputs()` lists a source's Inputs in one order whatever the order of its parts: its files (of
every path and glob together, each once) in sorted order of their paths, then 'bundled', then its
TFDS datasets in sorted order of their names, each one's file shards in their own order. So `a,b`
and `b,a` make the same store, and `t5lite prepare` shares the same Inputs among machines. Each
Input streams its documents in bounded memory. A piece of a file (a line of .jsonl, a paragraph of
.txt, a row of parquet, a record of TFDS) that is empty is skipped and counted; one that is
malformed (not UTF-8; not a JSON object with a string under the text key) is skipped and counted
too, and a file with more than `max_bad_fraction` of them is refused (see `Skipped`). What makes
the file itself unusable (missing, unreadable, cut short, a .jsonl none of whose lines holds text,
a parquet file without the column) is one ValueError line naming it.

Held-out documents are chosen by a stable hash of their text (FarmHash, fixed across TF versions
and platforms), so a document and its duplicates are all in one split. A TFDS dataset with its
own validation split (C4) keeps its published train/validation instead.
"""

import collections
import contextlib
import glob
import gzip
import importlib.resources
import io
import json
import lzma
import os
import zlib
from typing import Callable, Iterator, Sequence

import numpy as np
import zstandard
from t5lite.data.tf_setup import plain, tf

from t5lite import files
from t5lite import paths

BUNDLED = 'bundled'
TFDS_PREFIX = 'tfds:'
SPLITS = ('train', 'validation', 'all')
TEXT_KINDS = ('.txt', '.jsonl')
KINDS = TEXT_KINDS + ('.parquet',)
COMPRESSIONS = ('.gz', '.xz', '.zst')
MAX_BAD_FRACTION = 0.01  # of a file's pieces that may be malformed, and skipped

_HASH_BUCKETS = 1 << 20
_PARQUET_ROWS = 1024  # rows read at a time from a parquet file


class Input:
  """One file (or TFDS file shard) of a source: `documents(skipped)` streams its texts.

  `split` is the published split its documents belong to ('train' | 'validation'), or None
  where the hash decides.
  """
  name: str
  split: str | None = None

  def documents(self, skipped: collections.Counter) -> Iterator[str]:
    """The texts, in order; what is skipped is added to `skipped` (a Skipped, or any Counter of
    reason -> count) when the input has been read through."""
    raise NotImplementedError

  def fraction_read(self) -> float:
    """How much of the input `documents` has read so far, for a progress line's ETA."""
    return 0.0


class Skipped(collections.Counter):
  """The pieces a source's documents left out, by reason (the Counter a store's manifest
  records), with the pieces read and where the first malformed one is ('a.jsonl:17').

  A piece is a line of .jsonl, a paragraph of .txt, a row of parquet, a record of TFDS. Empty
  files, empty documents and parquet nulls are counted; malformed pieces (not UTF-8; not a JSON
  object with a string under the text key) are counted and bounded per file: adding a file's
  count that is more than `max_bad_fraction` malformed is one ValueError line naming `flag`.
  Per file, not per source: in a source's average one binary file named .jsonl among a thousand
  good ones is lost, and the verdict on a file would change with the files beside it and with
  `prepare --num_shards`; per file it is the same in memory and in every part, and a wrong text
  key fails on the first file instead of becoming a store of the few lines that have it.
  """

  def __init__(self, counts=(), /, *, max_bad_fraction: float = MAX_BAD_FRACTION,
               flag: str = '--max_bad_fraction'):
    if not 0 <= max_bad_fraction <= 1:
      raise ValueError(f'{flag}={max_bad_fraction} must be in [0, 1]')
    self.max_bad_fraction, self.flag = max_bad_fraction, flag
    self.read, self.first_malformed = 0, ''
    super().__init__(counts)

  def update(self, counts=(), /, **more):
    """Adds `counts` (reason -> count); from an Input's count of one file, also its pieces read
    and its first malformed one, after refusing the file if too many of its pieces are."""
    super().update(counts, **more)
    if isinstance(counts, _FileCount):
      malformed = sum(counts.malformed.values())
      if malformed > self.max_bad_fraction * counts.read:
        raise ValueError(
            f'{self.flag}: {malformed:,} of the {counts.read:,} {counts.unit} of {counts.name} '
            f'are malformed ({_reasons(counts.malformed)}; the first at '
            f'{counts.first_malformed}), more than {self.max_bad_fraction:g} of them')
      self.read += counts.read
      self.first_malformed = self.first_malformed or counts.first_malformed

  def line(self) -> str:
    """What was skipped, one line for stderr at the end: 'skipped 3 of 2,000 pieces read
    (lines_without_text: 2, non_utf8_documents: 1; the first malformed at a.jsonl:17)'."""
    pieces = {reason: count for reason, count in self.items() if reason != 'empty_files'}
    line = f'skipped {sum(pieces.values()):,} of {self.read:,} pieces read'
    if pieces:
      first = f'; the first malformed at {self.first_malformed}' if self.first_malformed else ''
      line += f' ({_reasons(pieces)}{first})'
    if self['empty_files']:
      line += f' and {self["empty_files"]:,} empty file(s)'
    return line


class _FileCount(collections.Counter):
  """What reading one file skipped, by reason, with its pieces read (`unit`: 'lines', ...) and
  the malformed ones by reason; its Input adds it to the caller's Counter when the file is read
  through."""

  def __init__(self, name: str, unit: str, where: Callable[[int], str] | None = None):
    super().__init__()
    self.name, self.unit = name, unit
    self._where = where or (lambda number: f'{name}:{number}')  # the place of piece `number`
    self.read, self.malformed, self.first_malformed = 0, collections.Counter(), ''

  def skip_malformed(self, reason: str, number: int) -> None:
    self[reason] += 1
    self.malformed[reason] += 1
    self.first_malformed = self.first_malformed or self._where(number)


def _reasons(counts: dict[str, int]) -> str:
  return ', '.join(f'{reason}: {count:,}' for reason, count in sorted(counts.items()))


def inputs(source: str | Sequence[str], text_key: str = 'text', tfds_data_dir: str = '',
           flag: str = 'data.source') -> list[Input]:
  """The Inputs of `source` in the order of the module's docstring, whatever the order of its
  parts; a file named twice (by a glob and by its name, say) is read once. One ValueError line
  (FileNotFoundError for a missing file) naming `flag` for an empty part, a glob matching
  nothing, a folder, a file of no known kind, a TFDS dataset that is not prepared or lacks the
  text feature."""
  parts = source.split(',') if isinstance(source, str) else list(source)
  named, bundled, datasets = {}, False, set()
  for position, part in enumerate((p.strip() for p in parts), 1):
    if not part:
      raise ValueError(f'{flag}: item {position} of {source!r} is empty (two commas, or one at '
                       'an end?)')
    if part == BUNDLED:
      bundled = True
    elif part.startswith(TFDS_PREFIX):
      datasets.add(part)
    else:
      for name in _matching(part, flag):
        named.setdefault(name if paths.is_uri(name) else os.path.abspath(name), name)
  return ([_file_input(named[where], text_key, flag) for where in sorted(named)]
          + ([_BundledInput(text_key)] if bundled else [])
          + [item for part in sorted(datasets)
             for item in _tfds_inputs(part[len(TFDS_PREFIX):], tfds_data_dir, text_key)])


def read_documents(source: str | Sequence[str], text_key: str = 'text',
                   flag: str = 'data.source', skipped: Skipped | None = None
                   ) -> tuple[list[str], Skipped]:
  """(documents, skipped) of a whole source, in memory: for what is small (a tokenizer's text).
  `skipped` bounds the malformed pieces of each file; by default to MAX_BAD_FRACTION, naming
  `flag`."""
  skipped = Skipped(flag=flag) if skipped is None else skipped
  documents = [text for item in inputs(source, text_key, flag=flag)
               for text in item.documents(skipped)]
  if not documents:
    raise ValueError(f'{flag} {source!r} holds no text ({skipped.line()})')
  return documents, skipped


def _matching(pattern: str, flag: str) -> list[str]:
  if not glob.has_magic(pattern):
    return [pattern]
  names = tf.io.gfile.glob(pattern) if paths.is_uri(pattern) else glob.glob(pattern)
  if not names:
    raise ValueError(f'{flag}: the pattern {pattern!r} matches no files')
  return names


def _kind(name: str) -> tuple[str, str]:
  """(kind, compression) of a file by its name: ('.jsonl', '.gz') for 'a.jsonl.gz'."""
  stem, last = os.path.splitext(name)
  return (os.path.splitext(stem)[1], last) if last in COMPRESSIONS else (last, '')


def _file_input(name: str, text_key: str, flag: str) -> Input:
  kind, compression = _kind(name)
  if kind not in KINDS or kind == '.parquet' and compression:
    if paths.path(name).is_dir():
      raise ValueError(f'{flag}: {name} is a folder: give the text files in it (e.g. '
                       f"'{name.rstrip('/')}/*.jsonl'); a token store is given alone as "
                       'data.source')
    if not paths.path(name).exists():
      raise FileNotFoundError(f'{flag}: {name}: no such file or folder')
    raise ValueError(f'{flag}: {name} is not {", ".join(TEXT_KINDS)} (optionally '
                     f'{", ".join(COMPRESSIONS[:-1])} or {COMPRESSIONS[-1]}) or '
                     f'{" or ".join(KINDS[len(TEXT_KINDS):])}')
  files.check_file(name, flag)
  if kind == '.parquet':
    return _ParquetInput(name, text_key, flag)
  return _TextInput(name, kind, compression, text_key, flag)


class _TextInput(Input):
  """A .txt or .jsonl file, decompressed as it is read."""

  def __init__(self, name: str, kind: str, compression: str, text_key: str, flag: str):
    self.name, self._kind, self._compression = name, kind, compression
    self._text_key, self._flag = text_key, flag
    self._raw, self._size = None, 0

  def fraction_read(self) -> float:
    return self._raw.tell() / self._size if self._raw is not None and self._size else 0.0

  def documents(self, skipped):
    jsonl = self._kind == '.jsonl'
    count = _FileCount(self.name, 'lines' if jsonl else 'paragraphs')
    without_key = f'lines_without_{self._text_key}'
    with self._lines() as stream:
      pieces = (((n, l) for n, l in enumerate(stream, 1) if l.strip()) if jsonl
                else _paragraphs(stream))
      for number, piece in pieces:
        count.read += 1
        if jsonl and not piece.endswith(b'\n') and not _is_json(piece):
          raise ValueError(f'{files.named(self.name, self._flag)} is not a complete .jsonl file: '
                           f'its last line, {number}, is cut short (no newline ends it, and it is '
                           'not a whole JSON record)')
        text = _utf8(piece, count, number)
        if text is not None and jsonl:
          text = _json_text(text, self._text_key)
          if text is None:
            count.skip_malformed(without_key, number)
        if _is_document(text, count):
          yield text
    if not count.read:
      count['empty_files'] += 1
    elif count[without_key] == count.read:
      raise ValueError(f'{files.named(self.name, self._flag)}: none of its {count.read} lines is '
                       f'a JSON object with a string under {self._text_key!r}')
    skipped.update(count)

  @contextlib.contextmanager
  def _lines(self) -> Iterator[Iterator[bytes]]:
    """The file's lines as bytes; a file that cannot be read or is cut short is one line."""
    where = files.named(self.name, self._flag)
    try:
      with paths.path(self.name).open('rb') as raw:
        self._raw, self._size = raw, paths.path(self.name).stat().length
        yield _decompressed(raw, self._compression)
    except (EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError) as error:
      raise ValueError(f'{where} is not a complete {self._compression} file ({error})') from None
    except gzip.BadGzipFile as error:
      raise ValueError(f'{where} is not a {self._compression} file ({error})') from None
    except (OSError, tf.errors.OpError) as error:
      reason = getattr(error, 'strerror', None) or getattr(error, 'message', None) or error
      raise ValueError(f'{where} cannot be read ({reason})') from None


def _decompressed(raw, compression: str) -> Iterator[bytes]:
  if compression == '.gz':
    return gzip.GzipFile(fileobj=raw)
  if compression == '.xz':
    return lzma.LZMAFile(raw)
  if compression == '.zst':
    return _zstd_lines(raw)
  return raw


def _zstd_lines(raw, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
  """The lines of a .zst file of one or more frames; one that ends inside a frame raises
  ZstdError (zstandard's stream reader would end quietly there)."""
  frame, inside, rest = zstandard.ZstdDecompressor().decompressobj(), False, b''
  while chunk := raw.read(chunk_bytes):
    while chunk:
      text = frame.decompress(chunk)
      chunk, inside = (frame.unused_data, False) if frame.eof else (b'', True)
      if frame.eof:
        frame = zstandard.ZstdDecompressor().decompressobj()
      *lines, rest = (rest + text).split(b'\n')
      yield from (line + b'\n' for line in lines)
  if inside:
    raise zstandard.ZstdError('the file ends inside a frame')
  if rest:
    yield rest


def _paragraphs(lines: Iterator[bytes]) -> Iterator[tuple[int, bytes]]:
  """(the number of its first line, from 1; the piece) of the blank-line separated pieces of a
  text file, each without the line break before the blank line that ends it."""
  piece, first = [], 0
  for number, line in enumerate(lines, 1):
    if line.strip():
      first = first if piece else number
      piece.append(line)
    elif piece:
      yield first, b''.join(piece).removesuffix(b'\n')
      piece = []
  if piece:
    yield first, b''.join(piece)


def _is_json(line: bytes) -> bool:
  """Whether `line` is a whole JSON value: the last line of a .jsonl file that no newline ends
  and is not one was cut short."""
  try:
    json.loads(line.decode('utf-8'))
  except RecursionError:  # whole, nested too deep to read: skipped as malformed
    return True
  except ValueError:  # not UTF-8 (cut inside a character), or not JSON
    return False
  return True


def _is_document(text: str | None, skipped: collections.Counter) -> bool:
  """Whether `text` (None: already skipped and counted) is a document; an empty one is counted."""
  if text is not None and not text.strip():
    skipped['empty_documents'] += 1
    return False
  return text is not None


def _utf8(raw: bytes, count: _FileCount, number: int) -> str | None:
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError:
    count.skip_malformed('non_utf8_documents', number)
    return None


def _json_text(line: str, text_key: str) -> str | None:
  try:
    row = files.parse_json(line, 'a line')
  except ValueError:
    return None
  text = row.get(text_key) if isinstance(row, dict) else None
  return text if isinstance(text, str) else None


class _ParquetInput(Input):
  """A .parquet file: the string column `text_key`, read a row group at a time."""

  def __init__(self, name: str, text_key: str, flag: str):
    self.name, self._text_key, self._flag = name, text_key, flag

  def documents(self, skipped):
    import pyarrow  # only for parquet files
    import pyarrow.parquet as pq
    where = files.named(self.name, self._flag)
    try:
      with paths.path(self.name).open('rb') as raw:
        table = pq.ParquetFile(raw)
        field = table.schema_arrow.field(self._text_key) if (
            self._text_key in table.schema_arrow.names) else None
        if field is None:
          raise ValueError(f'{where} has no column {self._text_key!r} (it has '
                           f'{", ".join(table.schema_arrow.names)})')
        if not (pyarrow.types.is_string(field.type) or pyarrow.types.is_large_string(field.type)):
          raise ValueError(f'{where}: the column {self._text_key!r} holds {field.type}, not text')
        count = _FileCount(self.name, 'rows')
        for batch in table.iter_batches(batch_size=_PARQUET_ROWS, columns=[self._text_key]):
          for text in batch.column(0).to_pylist():
            count.read += 1
            if text is None:
              count[f'null_{self._text_key}'] += 1
            elif _is_document(text, count):
              yield text
        if not count.read:
          count['empty_files'] += 1
    except (pyarrow.ArrowException, OSError, tf.errors.OpError) as error:
      reason = getattr(error, 'message', None) or str(error).strip().splitlines()[0]
      raise ValueError(f'{where} is not a parquet file that can be read ({reason})') from None
    skipped.update(count)


class _BundledInput(Input):
  """The bundled corpus, a .jsonl.xz inside the package."""

  def __init__(self, text_key: str):
    self.name, self._text_key = BUNDLED, text_key

  def documents(self, skipped):
    raw = importlib.resources.files('t5lite.data').joinpath('bundled/corpus.jsonl.xz')
    count = _FileCount(self.name, 'lines')
    with lzma.open(io.BytesIO(raw.read_bytes())) as lines:
      for number, line in enumerate(lines, 1):
        count.read += 1
        text = _json_text(line.decode('utf-8'), self._text_key)
        if text is None:
          count.skip_malformed(f'lines_without_{self._text_key}', number)
        else:
          yield text
    skipped.update(count)


def _tfds_inputs(name: str, data_dir: str, text_key: str) -> list[Input]:
  """One Input per file shard of the dataset's train split, and of its validation split where
  it publishes one."""
  builder = tfds_builder(name, data_dir)
  features = builder.info.features
  if text_key not in features or features[text_key].tf_dtype != tf.string:
    raise ValueError(f'data.text_key: {builder.info.full_name} has no text feature '
                     f'{text_key!r} (it has {", ".join(builder.info.features.keys())})')
  published = 'validation' in builder.info.splits
  found = []
  for split in ('train', 'validation') if published else ('train',):
    start = 0
    for length in builder.info.splits[split].shard_lengths:
      found.append(_TfdsInput(builder, split, start, start + length, text_key,
                              split if published else None))
      start += length
  return found


class _TfdsInput(Input):
  """Records [start, stop) of a TFDS split: one of its file shards, read in file order."""

  def __init__(self, builder, split: str, start: int, stop: int, text_key: str,
               published: str | None):
    self._dataset = f'{TFDS_PREFIX}{builder.info.full_name} {split}'
    self.name = f'{self._dataset}[{start}:{stop}]'
    self.split, self._builder, self._text_key = published, builder, text_key
    self._records, self._start = f'{split}[{start}:{stop}]', start

  def documents(self, skipped):
    count = _FileCount(self.name, 'records', lambda number: f'{self._dataset}[{number}]')
    records = self._builder.as_dataset(split=self._records, shuffle_files=False)
    texts = records.map(plain(lambda record: record[self._text_key])).as_numpy_iterator()
    for number, text in enumerate(texts, self._start):
      count.read += 1
      if _is_document(text := _utf8(text, count, number), count):
        yield text
    skipped.update(count)


def in_validation(texts, validation_fraction: float) -> np.ndarray:
  """Which of `texts` (a list of strings) are held out, by a stable hash of each text."""
  if not len(texts):
    return np.zeros([0], bool)
  buckets = tf.strings.to_hash_bucket_fast(texts, _HASH_BUCKETS).numpy()
  return buckets < int(round(validation_fraction * _HASH_BUCKETS))


def split_mask(documents: list[str], split: str, validation_fraction: float) -> np.ndarray:
  """Which documents belong to `split`: 'train', 'validation' (held out by hash) or 'all'."""
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  if split == 'all':
    return np.ones(len(documents), bool)
  held_out = in_validation(documents, validation_fraction)
  return held_out if split == 'validation' else ~held_out


def tfds_builder(name: str, data_dir: str):
  """The builder of a prepared TFDS dataset; one ValueError line if it is unknown or unprepared."""
  import tensorflow_datasets as tfds  # only for TFDS sources: it is slow to import
  where = data_dir or 'the default TFDS data_dir'
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except (tfds.core.registered.DatasetNotFoundError, ValueError, AssertionError) as error:
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise ValueError(f'data.source: TFDS dataset {name!r} not found in {where}: {first_line}'
                     ) from None
  if not builder.is_prepared():
    raise ValueError(f'data.source: TFDS dataset {name!r} is not prepared in {where}; t5lite '
                     f'never downloads: run `tfds build {name} --data_dir=DIR` and set '
                     'data.tfds_data_dir=DIR')
  return builder
