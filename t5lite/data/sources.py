"""Where text comes from: the documents of a source, streamed in a fixed order.

A source (`data.source`, `t5lite prepare --source`) is comma-separated parts, each one of
- 'bundled': the package's corpus.jsonl.xz (555 documents; see bundled/PROVENANCE.md);
- a path or glob, local or gs://: `.txt` files hold documents separated by blank lines (so one big
  corpus.txt still gives a validation split, and a file of one paragraph is one document);
  `.jsonl` files hold one JSON object per line with the text under `text_key`; either may be
  compressed as `.gz`, `.xz` or `.zst`; `.parquet` files hold the text in the column `text_key`;
- 'tfds:NAME' (e.g. 'tfds:c4/en:3.1.0'), prepared beforehand under `tfds_data_dir`: never
  downloaded.

`inputs()` lists a source's Inputs in order (its files; a TFDS dataset's file shards), so that
`t5lite prepare` can share them among machines, and each Input streams its documents in bounded
memory. A damaged piece of a file (a line that is not JSON or lacks the text, bytes that are not
UTF-8, an empty document) is skipped and counted by reason; what makes the file itself unusable
(missing, unreadable, cut short, a .jsonl none of whose lines holds text, a parquet file without
the column) is one ValueError line naming it.

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
import lzma
import os
import zlib
from typing import Iterator, Sequence

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
    raise NotImplementedError

  def fraction_read(self) -> float:
    """How much of the input `documents` has read so far, for a progress line's ETA."""
    return 0.0


def inputs(source: str | Sequence[str], text_key: str = 'text', tfds_data_dir: str = '',
           flag: str = 'data.source') -> list[Input]:
  """The Inputs of `source` in order; one ValueError line (FileNotFoundError for a missing file)
  naming `flag` for a glob matching nothing, a file of no known kind, a TFDS dataset that is not
  prepared or lacks the text feature."""
  parts = source.split(',') if isinstance(source, str) else list(source)
  found = []
  for part in (p.strip() for p in parts):
    if part == BUNDLED:
      found.append(_BundledInput(text_key))
    elif part.startswith(TFDS_PREFIX):
      found += _tfds_inputs(part[len(TFDS_PREFIX):], tfds_data_dir, text_key)
    else:
      found += [_file_input(name, text_key, flag) for name in _matching(part, flag)]
  return found


def read_documents(source: str | Sequence[str], text_key: str = 'text',
                   flag: str = 'data.source') -> tuple[list[str], collections.Counter]:
  """(documents, skipped) of a whole source, in memory: for what is small (a tokenizer's text)."""
  skipped = collections.Counter()
  documents = [text for item in inputs(source, text_key, flag=flag)
               for text in item.documents(skipped)]
  if not documents:
    raise ValueError(f'{flag} {source!r} holds no text (skipped: {dict(skipped)})')
  return documents, skipped


def _matching(pattern: str, flag: str) -> list[str]:
  if not glob.has_magic(pattern):
    return [pattern]
  names = sorted(tf.io.gfile.glob(pattern) if paths.is_uri(pattern) else glob.glob(pattern))
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
    raise ValueError(f'{flag}: {name} is not .txt, .jsonl (optionally .gz, .xz or .zst) or '
                     '.parquet')
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
    lines = without_key = 0
    with self._lines() as stream:
      pieces = _paragraphs(stream) if self._kind == '.txt' else (l for l in stream if l.strip())
      for piece in pieces:
        lines += 1
        text = _utf8(piece, skipped)
        if text is not None and self._kind == '.jsonl':
          text = _json_text(text, self._text_key)
          if text is None:
            without_key += 1
            skipped[f'lines_without_{self._text_key}'] += 1
        if _is_document(text, skipped):
          yield text
    if not lines:
      skipped['empty_files'] += 1
    elif without_key == lines:
      raise ValueError(f'{files.named(self.name, self._flag)}: none of its {lines} lines is a '
                       f'JSON object with a string under {self._text_key!r}')

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


def _paragraphs(lines: Iterator[bytes]) -> Iterator[bytes]:
  """The blank-line separated pieces of a text file, each without the line break before the
  blank line that ends it."""
  piece = []
  for line in lines:
    if line.strip():
      piece.append(line)
    elif piece:
      yield b''.join(piece).removesuffix(b'\n')
      piece = []
  if piece:
    yield b''.join(piece)


def _is_document(text: str | None, skipped: collections.Counter) -> bool:
  """Whether `text` (None: already skipped and counted) is a document; an empty one is counted."""
  if text is not None and not text.strip():
    skipped['empty_documents'] += 1
    return False
  return text is not None


def _utf8(raw: bytes, skipped: collections.Counter) -> str | None:
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError:
    skipped['non_utf8_documents'] += 1
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
        rows = 0
        for batch in table.iter_batches(batch_size=_PARQUET_ROWS, columns=[self._text_key]):
          for text in batch.column(0).to_pylist():
            rows += 1
            if text is None:
              skipped[f'null_{self._text_key}'] += 1
            elif _is_document(text, skipped):
              yield text
        if not rows:
          skipped['empty_files'] += 1
    except (pyarrow.ArrowException, OSError, tf.errors.OpError) as error:
      reason = getattr(error, 'message', None) or str(error).strip().splitlines()[0]
      raise ValueError(f'{where} is not a parquet file that can be read ({reason})') from None


class _BundledInput(Input):
  """The bundled corpus, a .jsonl.xz inside the package."""

  def __init__(self, text_key: str):
    self.name, self._text_key = BUNDLED, text_key

  def documents(self, skipped):
    raw = importlib.resources.files('t5lite.data').joinpath('bundled/corpus.jsonl.xz')
    with lzma.open(io.BytesIO(raw.read_bytes())) as lines:
      for line in lines:
        text = _json_text(line.decode('utf-8'), self._text_key)
        if text is None:
          skipped[f'lines_without_{self._text_key}'] += 1
        else:
          yield text


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
    self.name = f'{TFDS_PREFIX}{builder.info.full_name} {split}[{start}:{stop}]'
    self.split, self._builder, self._text_key = published, builder, text_key
    self._records = f'{split}[{start}:{stop}]'

  def documents(self, skipped):
    records = self._builder.as_dataset(split=self._records, shuffle_files=False)
    for text in records.map(plain(lambda record: record[self._text_key])).as_numpy_iterator():
      if _is_document(text := _utf8(text, skipped), skipped):
        yield text


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
