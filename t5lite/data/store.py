"""Token stores: a corpus tokenized once by `t5lite prepare`, then read with random access.

A store is a folder, local or gs://, of parts: `prepare --shard_index=i --num_shards=N` writes
part i of N (one machine each, or one after another), and the parts in order are the store:

  part-00000-of-00002.train       the train split's token ids, little-endian uint16 (uint32
  part-00000-of-00002.validation  for vocabularies past 65,536), documents concatenated without
                                  EOS between them (T5's reduce_concat_tokens)
  part-00000-of-00002.json        the part's manifest, written last: a reader never sees a part
                                  that is not whole

A manifest holds the format, the vocabulary (SHA-256 of its model proto, size), the validation
fraction and text key, and what the part was prepared from: its inputs, documents and tokens per
split, and what was skipped and why. A run reads a store only if every part is there, whole and
of the run's vocabulary.

Every text source is read as tokens in the same way (`split_tokens`): a store is read by ranges
(pread; on Cloud Storage, ranged reads); any other source is tokenized in memory when a run starts,
by the same code `prepare` runs, so a store prepared from a source holds exactly the tokens that
source gives in memory, and trains exactly alike.
"""

import bisect
import collections
import concurrent.futures
import functools
import hashlib
import itertools
import json
import os
import queue
import re
import threading
import time
from typing import Iterator, Sequence

from absl import logging
import numpy as np

from t5lite import files
from t5lite import paths
from t5lite.data import sources
from t5lite.data import vocabulary as vocabulary_lib
from t5lite.data.tf_setup import tf

FORMAT = 't5lite token store 1'
SPLITS = ('train', 'validation')
MANIFEST = re.compile(r'part-(\d{5})-of-(\d{5})\.json')
ENCODE_CHARACTERS = 4 << 20  # text tokenized in one multithreaded call: large enough to keep
# every thread busy, small enough that its tokens, Python ints until converted, take ~100 MB
_REMOTE_READERS = 32  # concurrent ranged reads of a store on Cloud Storage


def part_name(index: int, count: int) -> str:
  return f'part-{index:05d}-of-{count:05d}'


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype('<u2' if vocab_size <= 1 << 16 else '<u4')


def vocabulary_digest(vocab: vocabulary_lib.Vocabulary) -> str:
  return hashlib.sha256(vocab.model_proto).hexdigest()


def is_store(source: str) -> bool:
  """Whether `source` names a token store: a folder (not a glob, not 'bundled')."""
  if source == sources.BUNDLED or source.startswith(sources.TFDS_PREFIX) or ',' in source:
    return False
  return paths.path(source).is_dir()


# Tokenizing: what `prepare` and in-memory sources share.


class Tokenized(collections.namedtuple('Tokenized', 'train validation documents inputs_done')):
  """Tokens per split (each concatenated), documents per split, and (inputs read, of how many).
  """


def tokenize(inputs: Sequence[sources.Input], vocab: vocabulary_lib.Vocabulary,
             validation_fraction: float, skipped: collections.Counter, *,
             workers: int = 0) -> Iterator[Tokenized]:
  """The tokens of `inputs`' documents in order, ENCODE_CHARACTERS at a time, split by the stable
  hash (or the input's published split). A thread reads and hashes the next documents while
  SentencePiece encodes these on `workers` threads (0: every core)."""
  dtype = token_dtype(vocab.vocab_size)
  for texts, held_out, progress in _read_ahead(_document_batches(inputs, validation_fraction,
                                                                 skipped)):
    encoded = vocab.encode_ids(texts, num_threads=workers)
    per_split = [[ids for ids, h in zip(encoded, held_out) if h == want] for want in (False, True)]
    yield Tokenized(*(np.fromiter(itertools.chain.from_iterable(split), dtype,
                                  count=sum(map(len, split))) for split in per_split),
                    documents=(len(per_split[0]), len(per_split[1])), inputs_done=progress)


def _document_batches(inputs, validation_fraction: float, skipped):
  """(texts, held out?, progress) of about ENCODE_CHARACTERS of text at a time, in order."""
  for number, item in enumerate(inputs):
    texts, characters = [], 0
    for text in item.documents(skipped):
      texts.append(text)
      characters += len(text)
      if characters >= ENCODE_CHARACTERS:
        yield (texts, _held_out(item, texts, validation_fraction),
               (number + item.fraction_read(), len(inputs)))
        texts, characters = [], 0
    yield texts, _held_out(item, texts, validation_fraction), (number + 1, len(inputs))


def _held_out(item: sources.Input, texts: list[str], validation_fraction: float) -> np.ndarray:
  if item.split is not None:
    return np.full(len(texts), item.split == 'validation')
  return sources.in_validation(texts, validation_fraction)


def _read_ahead(iterator: Iterator, depth: int = 2) -> Iterator:
  """`iterator`'s items, produced on a thread `depth` items ahead; its exception re-raised here."""
  items = queue.Queue(maxsize=depth)
  stop = threading.Event()
  done = object()

  def produce():
    try:
      for item in iterator:
        while not stop.is_set():
          try:
            items.put(item, timeout=0.1)
            break
          except queue.Full:
            pass
        if stop.is_set():
          return
      items.put(done)
    except BaseException as error:  # pylint: disable=broad-except  # re-raised by the consumer
      items.put(error)

  thread = threading.Thread(target=produce, daemon=True)
  thread.start()
  try:
    while (item := items.get()) is not done:
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    stop.set()


# Reading: the tokens of a split, wherever they are.


class Tokens:
  """A split's tokens: pieces (numpy arrays, token files) read as one sequence."""

  def __init__(self, pieces: Sequence, remote: bool = False):
    self._pieces = [p for p in pieces if len(p)]
    self._starts = list(np.cumsum([0] + [len(p) for p in self._pieces]))
    self.size = int(self._starts[-1])
    self._remote = remote

  def __len__(self) -> int:
    return self.size

  def window(self, begin: int, length: int) -> np.ndarray:
    """Tokens [begin, begin + length) as int32, across pieces where it must."""
    end, out = begin + length, []
    piece = bisect.bisect_right(self._starts, begin) - 1
    while begin < end:
      start = self._starts[piece]
      stop = min(end, self._starts[piece + 1])
      out.append(self._pieces[piece][begin - start:stop - start])
      begin, piece = stop, piece + 1
    return np.concatenate(out).astype(np.int32) if len(out) > 1 else out[0].astype(np.int32)

  def windows(self, begins: np.ndarray, length: int) -> np.ndarray:
    """int32[len(begins), length]: the window at each of `begins` (each within the tokens)."""
    if self._remote:
      return np.stack(list(_remote_pool().map(lambda b: self.window(int(b), length), begins)))
    if len(self._pieces) == 1 and isinstance(self._pieces[0], np.ndarray):  # one gather
      return self._pieces[0][begins[:, None] + np.arange(length)].astype(np.int32)
    return np.stack([self.window(int(b), length) for b in begins])


@functools.lru_cache(maxsize=1)
def _remote_pool() -> concurrent.futures.ThreadPoolExecutor:
  return concurrent.futures.ThreadPoolExecutor(_REMOTE_READERS)


class _TokenFile:
  """A token file read by ranges: locally with pread, so that what was read stays in the OS's
  page cache and never in this process's memory (a memory map would count every page it touched,
  and the pages around it, as the process's); on Cloud Storage by ranged reads, an open file per
  thread."""

  def __init__(self, name: str, dtype: np.dtype, size: int, remote: bool):
    self._name, self._dtype, self._size = name, dtype, size
    self._local = threading.local()
    self._fd = None if remote else os.open(name, os.O_RDONLY)

  def __len__(self) -> int:
    return self._size

  def __getitem__(self, where: slice) -> np.ndarray:
    offset = where.start * self._dtype.itemsize
    count = (where.stop - where.start) * self._dtype.itemsize
    if self._fd is not None:
      return np.frombuffer(os.pread(self._fd, count, offset), self._dtype)
    if not hasattr(self._local, 'file'):
      self._local.file = tf.io.gfile.GFile(self._name, 'rb')
    self._local.file.seek(offset)
    return np.frombuffer(self._local.file.read(count), self._dtype)


class Store:
  """A complete token store: its parts' manifests, checked; `tokens(split)` reads a split."""

  def __init__(self, path: str, flag: str = 'data.source'):
    self.path, self._flag = path, flag
    self.manifests = read_manifests(path, flag)
    self.vocabulary = self.manifests[0]['vocabulary']
    self.dtype = np.dtype(self.manifests[0]['dtype'])

  def tokens(self, split: str) -> Tokens:
    """The tokens of 'train', 'validation' or 'all' (train, then validation)."""
    if split not in sources.SPLITS:
      raise ValueError(f'split must be one of {sources.SPLITS}, got {split!r}')
    wanted = SPLITS if split == 'all' else (split,)
    return Tokens([self._file(manifest['part'], name, manifest['tokens'][name])
                   for name in wanted for manifest in self.manifests], paths.is_uri(self.path))

  @functools.lru_cache(maxsize=None)
  def _file(self, part: str, split: str, size: int) -> _TokenFile:
    """A part's token file, opened once however many pipelines read it (one per evaluation)."""
    return _TokenFile(os.path.join(self.path, f'{part}.{split}'), self.dtype, size,
                      paths.is_uri(self.path))

  def check_vocabulary(self, vocab: vocabulary_lib.Vocabulary, name: str) -> None:
    if self.vocabulary['sha256'] != vocabulary_digest(vocab):
      raise ValueError(f'{self._flag}: {self.path} was prepared with the vocabulary '
                       f'{self.vocabulary["name"]!r} (sha256 {self.vocabulary["sha256"][:12]}), '
                       f'not data.vocabulary={name!r}; prepare it again or set data.vocabulary')

  def summary(self) -> str:
    """What the store holds and was prepared from, for `t5lite data --show`."""
    totals = collections.Counter()
    skipped = collections.Counter()
    for manifest in self.manifests:
      for split in SPLITS:
        totals[f'{split}_documents'] += manifest['documents'][split]
        totals[f'{split}_tokens'] += manifest['tokens'][split]
      skipped.update(manifest['skipped'])
    first = self.manifests[0]
    return (f'token store {self.path}: {len(self.manifests)} part(s) prepared from '
            f'{", ".join(sorted({m["source"] for m in self.manifests}))}\n'
            f'  train: {totals["train_documents"]:,} documents, {totals["train_tokens"]:,} tokens'
            f'\n  validation: {totals["validation_documents"]:,} documents, '
            f'{totals["validation_tokens"]:,} tokens (validation_fraction '
            f'{first["validation_fraction"]})\n'
            f'  vocabulary: {self.vocabulary["name"]} ({self.vocabulary["size"]:,} ids, sha256 '
            f'{self.vocabulary["sha256"][:12]})\n'
            f'  skipped: {dict(sorted(skipped.items())) or "nothing"}')


def read_manifests(path: str, flag: str) -> list[dict]:
  """The manifests of every part of the store at `path`, in order; one ValueError line for a
  folder that is no store, a part missing, cut short or of another vocabulary or format."""
  folder = paths.path(path)
  found = {}
  for entry in folder.iterdir():
    match = MANIFEST.fullmatch(entry.name)
    if match:
      found[int(match[1]), int(match[2])] = entry
  if not found:
    raise ValueError(f'{flag}: {path} is a folder but holds no token store (no part-*.json; '
                     'make one with `t5lite prepare`, or a prepare into it has not finished)')
  counts = sorted({count for _, count in found})
  if len(counts) > 1:
    raise ValueError(f'{flag}: {path} mixes parts of stores of {counts[0]} and {counts[1]} parts')
  count = counts[0]
  missing = [i for i in range(count) if (i, count) not in found]
  if missing:
    raise ValueError(f'{flag}: {path} lacks part(s) {", ".join(map(str, missing[:5]))}'
                     f'{" ..." if len(missing) > 5 else ""} of {count} (their prepare has not '
                     'finished)')
  manifests = [_read_manifest(found[i, count], flag) for i in range(count)]
  for manifest in manifests[1:]:
    if manifest['vocabulary']['sha256'] != manifests[0]['vocabulary']['sha256']:
      raise ValueError(f'{flag}: {path}: {manifest["part"]} was prepared with another vocabulary '
                       f'than {manifests[0]["part"]} ({manifest["vocabulary"]["name"]!r})')
  for manifest in manifests:
    dtype = np.dtype(manifest['dtype'])
    for split in SPLITS:
      file = folder / f'{manifest["part"]}.{split}'
      size = file.stat().length if file.exists() else -1
      if size != manifest['tokens'][split] * dtype.itemsize:
        raise ValueError(f'{flag}: {file} holds {max(size, 0)} bytes, its manifest says '
                         f'{manifest["tokens"][split]} tokens: the store is damaged; prepare '
                         f'that part again')
  return manifests


_MANIFEST_KEYS = {'format': str, 'part': str, 'dtype': str, 'vocabulary': dict, 'tokens': dict,
                  'documents': dict, 'skipped': dict, 'source': str, 'validation_fraction': float}


def _read_manifest(file, flag: str) -> dict:
  manifest = files.read_json(file, flag)
  for key, kind in _MANIFEST_KEYS.items():
    if key not in manifest:
      raise ValueError(f'{files.named(file, flag)} is no token store manifest (no {key!r})')
    files.check_type(manifest[key], kind, f'{files.named(file, flag)}: {key}')
  if manifest['format'] != FORMAT:
    raise ValueError(f'{files.named(file, flag)} is of format {manifest["format"]!r}; this '
                     f't5lite reads {FORMAT!r}')
  for key in ('tokens', 'documents'):
    for split in SPLITS:
      files.check_type(manifest[key].get(split), int, f'{files.named(file, flag)}: {key}.{split}')
  return manifest


@functools.lru_cache(maxsize=4)
def open_store(path: str) -> Store:
  return Store(path)


@functools.lru_cache(maxsize=4)
def _in_memory(source: str, text_key: str, vocabulary_name: str, validation_fraction: float,
               tfds_data_dir: str) -> tuple[np.ndarray, np.ndarray]:
  """The (train, validation) tokens of a source tokenized here: once per process."""
  vocab = vocabulary_lib.load_vocabulary(vocabulary_name)
  skipped = collections.Counter()
  pieces = ([], [])
  for chunk in tokenize(sources.inputs(source, text_key, tfds_data_dir), vocab,
                        validation_fraction, skipped):
    pieces[0].append(chunk.train)
    pieces[1].append(chunk.validation)
  train, validation = (np.concatenate(split) for split in pieces)
  if not train.size + validation.size:
    raise ValueError(f'data.source {source!r} holds no text (skipped: {dict(skipped)})')
  if skipped:
    logging.warning('data source %s: skipped %s', source, dict(skipped))
  return train, validation


def split_tokens(data, split: str) -> Tokens:
  """The tokens of `split` of `data.source`: a store's, or any other source's tokenized here."""
  if split not in sources.SPLITS:
    raise ValueError(f'split must be one of {sources.SPLITS}, got {split!r}')
  if is_store(data.source):
    store = open_store(os.fspath(paths.path(data.source)))
    store.check_vocabulary(vocabulary_lib.load_vocabulary(data.vocabulary), data.vocabulary)
    tokens, advice = store.tokens(split), 'its held-out split is the one it was prepared with'
  else:
    train, validation = _in_memory(data.source, data.text_key, data.vocabulary,
                                   data.validation_fraction, data.tfds_data_dir)
    pieces = {'train': [train], 'validation': [validation], 'all': [train, validation]}[split]
    tokens = Tokens(pieces)
    advice = f'change data.validation_fraction={data.validation_fraction}'
  if not tokens.size:
    raise ValueError(f'the {split} split of {data.source!r} is empty; {advice}')
  return tokens
