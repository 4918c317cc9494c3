"""Where text comes from: the bundled corpus, local .txt/.jsonl files, or a prepared TFDS dataset.

`data.source` is one of
- 'bundled': the package's corpus.jsonl.xz (555 documents; see bundled/PROVENANCE.md);
- paths or globs, comma-separated: `.txt` files hold documents separated by blank lines (so one
  big corpus.txt still gives a validation split, and a file of one paragraph is one document);
  `.jsonl` files hold one JSON object per line with the text under `data.text_key`; either may
  be compressed as `.gz` or `.xz`;
- 'tfds:NAME' (e.g. 'tfds:c4/en:3.1.0'), prepared beforehand under `data.tfds_data_dir`: it is
  streamed, never loaded whole and never downloaded.

Held-out documents are chosen by a stable hash of their text (FarmHash, fixed across TF
versions and platforms), so a document and its duplicates are all in one split.
"""

import collections
import glob
import importlib.resources
import lzma
import os
import re
from typing import Sequence

from absl import logging
import numpy as np
from t5lite.data.tf_setup import tf

from t5lite import files
from t5lite import paths

BUNDLED = 'bundled'
TFDS_PREFIX = 'tfds:'
SPLITS = ('train', 'validation', 'all')

_HASH_BUCKETS = 1 << 20
_BLANK_LINES = re.compile(rb'\n(?:[ \t\r\f\v]*\n)+')


def read_documents(source: str | Sequence[str], text_key: str = 'text',
                   flag: str = 'data.source'):
  """(documents, skipped) of an in-memory source; `skipped` counts what was dropped and why.

  Raises ValueError with one line naming `flag` (what gave the source) and the file for a missing
  or unreadable file (t5lite/files.py), a glob matching nothing, an unsupported file type or a
  source without any text.
  """
  patterns = source.split(',') if isinstance(source, str) else list(source)
  documents, skipped = [], collections.Counter()
  for pattern in (p.strip() for p in patterns):
    if pattern.startswith(TFDS_PREFIX):
      raise ValueError(f'{pattern}: TFDS sources are streamed; read text files here instead')
    for name, kind, raw in _raw_files(pattern, flag):
      documents += _parse(kind, raw, text_key, skipped)
  if not documents:
    raise ValueError(f'{flag} {source!r} holds no text (skipped: {dict(skipped)})')
  if skipped:
    logging.warning('data source %s: skipped %s', source, dict(skipped))
  return documents, skipped


def _raw_files(pattern: str, flag: str):
  """(name, kind, decompressed bytes) of each file of one pattern, sorted so that the corpus
  order is fixed; kind is '.txt' or '.jsonl'."""
  if pattern == BUNDLED:
    path = importlib.resources.files('t5lite.data').joinpath('bundled/corpus.jsonl.xz')
    yield 'corpus.jsonl.xz', '.jsonl', lzma.decompress(path.read_bytes())
    return
  names = [pattern]
  if glob.has_magic(pattern):  # TensorFlow's glob for gs:// patterns
    names = sorted(tf.io.gfile.glob(pattern) if paths.is_uri(pattern) else glob.glob(pattern))
  if not names:
    raise ValueError(f'{flag}: the pattern {pattern!r} matches no files')
  for name in names:
    stem, compression = os.path.splitext(name)
    kind = os.path.splitext(stem if compression in files.COMPRESSIONS else name)[1]
    if kind not in ('.txt', '.jsonl'):
      raise ValueError(f'{flag}: {name} is neither .txt nor .jsonl (optionally .gz/.xz)')
    yield name, kind, files.read_bytes(name, flag)


def _parse(kind: str, raw: bytes, text_key: str, skipped: collections.Counter) -> list[str]:
  """Documents of one file's bytes; bad pieces are counted in `skipped`, never fatal."""
  if not raw.strip():
    skipped['empty_files'] += 1
    return []
  pieces = _BLANK_LINES.split(raw) if kind == '.txt' else raw.splitlines()
  texts = (_utf8(p, skipped) for p in pieces if p.strip())
  if kind == '.jsonl':
    texts = (_json_text(line, text_key, skipped) for line in texts if line is not None)
  documents = []
  for text in texts:
    if text is not None and not text.strip():
      skipped['empty_documents'] += 1
    elif text is not None:
      documents.append(text)
  return documents


def _utf8(raw: bytes, skipped: collections.Counter) -> str | None:
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError:
    skipped['non_utf8_documents'] += 1
    return None


def _json_text(line: str, text_key: str, skipped: collections.Counter) -> str | None:
  try:
    row = files.parse_json(line, 'a line')
  except ValueError:
    row = None
  text = row.get(text_key) if isinstance(row, dict) else None
  if not isinstance(text, str):
    skipped[f'lines_without_{text_key}'] += 1
    return None
  return text


def in_validation(texts, validation_fraction: float) -> tf.Tensor:
  """Which of `texts` (a string tensor or list) are held out, by a stable hash of each text.

  Works eagerly on a list of documents and inside tf.data on streamed ones alike.
  """
  buckets = tf.strings.to_hash_bucket_fast(texts, _HASH_BUCKETS)
  return buckets < int(round(validation_fraction * _HASH_BUCKETS))


def split_mask(documents: list[str], split: str, validation_fraction: float) -> np.ndarray:
  """Which documents belong to `split`: 'train', 'validation' (held out by hash) or 'all'."""
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  if split == 'all':
    return np.ones(len(documents), bool)
  held_out = in_validation(documents, validation_fraction).numpy()
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


def tfds_split(builder, split: str) -> tuple[str, str]:
  """(TFDS split to read, split to select by hash within it: 'all' when none is needed).

  A dataset with its own 'validation' split (C4) keeps its train/validation as published;
  others hold out documents of their 'train' split by hash, as the in-memory sources do.
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  if 'validation' in builder.info.splits:
    return ('train' if split == 'all' else split), 'all'
  return 'train', split


def tfds_documents(builder, tfds_split_name: str, start: int, stop: int,
                   text_key: str) -> tf.data.Dataset:
  """Texts of records [start, stop) of a TFDS split, in file order, read deterministically."""
  features = builder.info.features
  if text_key not in features or features[text_key].tf_dtype != tf.string:
    raise ValueError(f'data.text_key: {builder.info.full_name} has no text feature '
                     f'{text_key!r} (it has {", ".join(features.keys())})')
  ds = builder.as_dataset(split=f'{tfds_split_name}[{start}:{stop}]', shuffle_files=False)
  return ds.map(lambda record: record[text_key])
