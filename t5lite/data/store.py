"""Token stores: a corpus tokenized once by `t5lite prepare`, then read with random access.

The format and the reader; a part's writer is t5lite/data/store_writer.py.

A store is a folder, local or gs://, of parts: `prepare --shard_index=i --num_shards=N` writes
part i of N (one machine each, or one after another), and the parts in order are the store:

  part-00000-of-00002.train         the train split's token ids, little-endian uint16 (uint32
  part-00000-of-00002.validation    for vocabularies past 65,536; of the byte vocabulary, the
                                    UTF-8 bytes themselves, uint8, id = byte + 3), documents
                                    concatenated without EOS between them (T5's
                                    reduce_concat_tokens)
  part-00000-of-00002.train.crc32c  the CRC32C of each BLOCK_BYTES block of the split's file,
  ....validation.crc32c             little-endian uint32 (the last block's over what it holds)
  part-00000-of-00002.json          the part's manifest, written last: a reader never sees a
                                    part that is not whole

A manifest holds the format, the vocabulary (SHA-256 of its model proto, size), the validation
fraction and text key, the checksums' algorithm and block, and what the part was prepared from:
its inputs, documents and tokens per split, and what was skipped and why. A run reads a store
only if every part is there, every field of its manifest as the format says, each file of the
size its manifest gives and of the run's vocabulary; and it checks the blocks of each window it
reads against their checksums (`_TokenFile`), so a damaged byte is refused, not trained on.

Every text source is read as tokens in the same way (`split_tokens`): a store is read by ranges
(pread; on Cloud Storage, ranged GETs); any other source is tokenized in memory when a run starts,
by the same code `prepare` runs, so a store prepared from a source holds exactly the tokens that
source gives in memory, and trains exactly alike.
"""

import bisect
import collections
import concurrent.futures
import functools
import os
import queue
import re
import threading
import time
from typing import Callable, Iterator, Sequence

from google.api_core import exceptions as google_exceptions
import google_crc32c
import numpy as np

from t5lite import files
from t5lite import paths
from t5lite.data import sources
from t5lite.data import vocabulary as vocabulary_lib

FORMAT = 't5lite token store 2'
FORMAT_1 = 't5lite token store 1'  # of 2026-11-26 and 27: no checksums
SPLITS = ('train', 'validation')
DTYPES = ('|u1', '<u2', '<u4')
PART = r'part-(\d{5})-of-(\d{5})'  # part_name's pattern: part i of N
MANIFEST = re.compile(PART + r'\.json')
# what a store's folder holds: parts' files, and the locks and temporaries of parts being written
PART_FILE = re.compile(r'\.?' + PART + r'\..+')
CHECKSUMS = '.crc32c'  # a split file's checksums: the CRC32C of each of its blocks, '<u4'
BLOCK_BYTES = 4096  # a window (1.1 KB at 512/114) touches one or two such blocks
VERIFY_BLOCKS = 4096  # blocks `Store.verify` reads at a time (16 MiB)
ENCODE_CHARACTERS = 4 << 20  # text tokenized in one multithreaded call: large enough to keep
# every thread busy, small enough that its tokens, Python ints until converted, take ~100 MB
_REMOTE_READERS = 32  # concurrent ranged reads of a store on Cloud Storage


def part_name(index: int, count: int) -> str:
  return f'part-{index:05d}-of-{count:05d}'


def token_dtype(identity: dict) -> np.dtype:
  """The dtype a store of the vocabulary of `identity` (vocabulary.IDENTITY) holds its ids in."""
  if identity['sha256'] == vocabulary_lib.BYTE_VOCABULARY.digest:
    return vocabulary_lib.BYTE_VOCABULARY.store_dtype
  return np.dtype('<u2' if identity['size'] <= 1 << 16 else '<u4')


def id_offset(dtype: np.dtype) -> int:
  """What is added to a store's values of `dtype` to make ids: the byte vocabulary's 3."""
  return vocabulary_lib.BYTE_OFFSET if dtype.itemsize == 1 else 0


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
  hash (or the input's published split), as a store holds them (`Vocabulary.stored`). A thread
  reads and hashes the next documents while SentencePiece encodes these on `workers` threads
  (0: every core); the byte vocabulary's are the texts' UTF-8 bytes."""
  for texts, held_out, progress in _read_ahead(_document_batches(inputs, validation_fraction,
                                                                 skipped)):
    per_split = [[text for text, h in zip(texts, held_out) if h == want]
                 for want in (False, True)]
    yield Tokenized(*(vocab.stored(split, num_threads=workers) for split in per_split),
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


class BlockChecksums:
  """The CRC32C of each BLOCK_BYTES block of a file written in pieces of any size: `update(piece)`
  gives the checksums of the blocks the piece completes, `final()` that of the last block,
  however short ('<u4' bytes, as a split's CHECKSUMS file holds them)."""

  def __init__(self):
    self._crc, self._filled = 0, 0  # of the block being filled

  def update(self, piece: bytes) -> bytes:
    done, at = [], 0
    while at < len(piece):
      take = min(BLOCK_BYTES - self._filled, len(piece) - at)
      self._crc = google_crc32c.extend(self._crc, piece[at:at + take])
      self._filled, at = self._filled + take, at + take
      if self._filled == BLOCK_BYTES:
        done.append(self._crc)
        self._crc, self._filled = 0, 0
    return np.array(done, '<u4').tobytes()

  def final(self) -> bytes:
    return np.array([self._crc] if self._filled else [], '<u4').tobytes()


# Reading: the tokens of a split, wherever they are.


class Tokens:
  """A split's tokens: pieces (numpy arrays, token files) read as one sequence, each value plus
  `offset` (a byte store's 3). `skipped`: what tokenizing them here skipped, one line ('' if
  nothing), for the run to say once it goes on, or to fold into the line that refuses them."""

  def __init__(self, pieces: Sequence, remote: bool = False, skipped: str = '', offset: int = 0):
    self.skipped, self.offset = skipped, offset
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
    window = np.concatenate(out) if len(out) > 1 else out[0]
    return window.astype(np.int32) + self.offset

  def windows(self, begins: np.ndarray, length: int) -> np.ndarray:
    """int32[len(begins), length]: the window at each of `begins` (each within the tokens)."""
    if self._remote:
      return np.stack(list(_remote_pool().map(lambda b: self.window(int(b), length), begins)))
    if len(self._pieces) == 1 and isinstance(self._pieces[0], np.ndarray):  # one gather
      return self._pieces[0][begins[:, None] + np.arange(length)].astype(np.int32) + self.offset
    return np.stack([self.window(int(b), length) for b in begins])


@functools.lru_cache(maxsize=1)
def _remote_pool() -> concurrent.futures.ThreadPoolExecutor:
  return concurrent.futures.ThreadPoolExecutor(_REMOTE_READERS)


def _ranges(name: str, remote: bool) -> Callable[[int, int], bytes]:
  """read(count, offset) of the file `name`: locally pread, so that what was read stays in the
  OS's page cache and never in this process's memory (a memory map would count every page it
  touched, and the pages around it, as the process's); on Cloud Storage a GET of exactly those
  bytes, a client per thread (TensorFlow's files would fetch 64 MB from the offset and keep it,
  for each file and thread: 8.8 GB for a test's 7 MB store)."""
  if not remote:
    return functools.partial(os.pread, os.open(name, os.O_RDONLY))
  bucket, _, blob = name.removeprefix('gs://').partition('/')
  local = threading.local()

  def read(count: int, offset: int) -> bytes:
    if not hasattr(local, 'blob'):
      from google.cloud import storage  # pylint: disable=import-outside-toplevel
      local.blob = storage.Client().bucket(bucket).blob(blob)
    return local.blob.download_as_bytes(start=offset, end=offset + count - 1, checksum=None)
  return read


class _TokenFile:
  """A split's token file of one part, whose every read is verified: the BLOCK_BYTES blocks a
  window touches (one or two) are read whole and checked against their CRC32C in the split's
  checksum file, so a damaged byte is never trained on. It costs a few microseconds a window
  (bench/corpus_store.py), not a pass over the store before the run."""

  def __init__(self, name: str, dtype: np.dtype, size: int, remote: bool, damaged: str):
    self._name, self._dtype, self._size, self._damaged = name, dtype, size, damaged
    self._bytes = size * dtype.itemsize
    self._read_tokens = _ranges(name, remote)
    self._read_checksums = _ranges(name + CHECKSUMS, remote)

  def __len__(self) -> int:
    return self._size

  def __getitem__(self, where: slice) -> np.ndarray:
    begin, end = where.start * self._dtype.itemsize, where.stop * self._dtype.itemsize
    first, last = begin // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1  # the blocks [first, last)
    offset = first * BLOCK_BYTES
    try:
      raw = self._read_tokens(min(last * BLOCK_BYTES, self._bytes) - offset, offset)
      checksums = self._read_checksums((last - first) * 4, first * 4)
    except (OSError, google_exceptions.GoogleAPIError) as error:
      reason = getattr(error, 'strerror', None) or getattr(error, 'message', None) or error
      raise ValueError(f'{self._name} (or its checksums) cannot be read at byte {offset:,} '
                       f'({reason})') from None
    if len(raw) < end - offset or len(checksums) < (last - first) * 4:
      raise ValueError(f'{self._name} (or its checksums) ends before byte {end:,}: '
                       f'{self._damaged}')
    if last - first == 1:
      if google_crc32c.value(raw) != int.from_bytes(checksums, 'little'):
        self._refuse(offset, len(raw))
    else:
      for block in range(last - first):
        data = raw[block * BLOCK_BYTES:(block + 1) * BLOCK_BYTES]
        if google_crc32c.value(data) != int.from_bytes(checksums[block * 4:block * 4 + 4],
                                                       'little'):
          self._refuse(offset + block * BLOCK_BYTES, len(data))
    return np.frombuffer(raw, self._dtype, (end - begin) // self._dtype.itemsize, begin - offset)

  def _refuse(self, at: int, length: int):
    raise ValueError(f'{self._name}: the bytes {at:,} to {at + length:,} do not match their '
                     f'checksum in {os.path.basename(self._name)}{CHECKSUMS}: {self._damaged}')


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
    return Tokens([self._file(index, name) for name in wanted
                   for index in range(len(self.manifests))], paths.is_uri(self.path),
                  offset=id_offset(self.dtype))

  @functools.lru_cache(maxsize=None)
  def _file(self, index: int, split: str) -> _TokenFile:
    """A part's token file, opened once however many pipelines read it (one per evaluation)."""
    manifest = self.manifests[index]
    return _TokenFile(os.path.join(self.path, f'{manifest["part"]}.{split}'), self.dtype,
                      manifest['tokens'][split], paths.is_uri(self.path),
                      _damaged(self.path, index, len(self.manifests)))

  def verify(self, progress=None) -> int:
    """Reads every block of every part, checks it against its checksum and every token against
    the vocabulary's size; returns the tokens read. One ValueError line naming the part and the
    offset of the first damage. `progress`: a text stream for a line rewritten about once a
    second (tokens read, of how many), or None."""
    total = sum(sum(manifest['tokens'].values()) for manifest in self.manifests)
    step = VERIFY_BLOCKS * BLOCK_BYTES // self.dtype.itemsize
    done, shown, line = 0, time.monotonic(), False
    for index, manifest in enumerate(self.manifests):
      for split in SPLITS:
        file, size = self._file(index, split), manifest['tokens'][split]
        for begin in range(0, size, step):
          tokens = file[begin:min(begin + step, size)].astype(np.int64) + id_offset(self.dtype)
          past = np.flatnonzero(tokens >= self.vocabulary['size'])
          if past.size:
            raise ValueError(f'{self.path}/{manifest["part"]}.{split}: token {begin + past[0]:,} '
                             f'is id {tokens[past[0]]}, past the vocabulary\'s '
                             f'{self.vocabulary["size"]:,} ids: '
                             f'{_damaged(self.path, index, len(self.manifests))}')
          done += tokens.size
          if progress is not None and time.monotonic() - shown >= 1:
            shown, line = time.monotonic(), True
            progress.write(f'\r{done:,} of {total:,} tokens verified')
            progress.flush()
    if line:
      progress.write('\n')
    return done

  def check_vocabulary(self, vocab: vocabulary_lib.Vocabulary, name: str) -> None:
    vocab.check_same(self.vocabulary, f'data.vocabulary={name!r}', f'{self._flag}: {self.path}')
    if self.vocabulary['size'] != vocab.vocab_size:
      raise ValueError(f'{self._flag}: {self.path}: its manifests say its vocabulary has '
                       f'{self.vocabulary["size"]:,} ids, data.vocabulary={name!r} (the same '
                       f'model) has {vocab.vocab_size:,}: the store is damaged; prepare it again')

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


def _damaged(path: str, index: int, count: int) -> str:
  """The end of every message about a damaged part: what to do."""
  return (f'the store is damaged; prepare part {index} of {count} again (--overwrite '
          f'--shard_index={index} --num_shards={count}), and check the rest with '
          f'`t5lite data --verify={path}`')


def read_manifests(path: str, flag: str) -> list[dict]:
  """The manifests of every part of the store at `path`, in order; one ValueError line for a
  folder that is no store, a part missing, damaged, of another format, vocabulary or setting,
  or a part's file of another size than its manifest says or no regular file."""
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
  strays = sorted(index for index, _ in found if index >= count)
  if strays:
    raise ValueError(f'{flag}: {path} holds {found[strays[0], count].name}, but a store of '
                     f'{count} parts has no part {strays[0]}: the store is damaged')
  missing = [i for i in range(count) if (i, count) not in found]
  if missing:
    raise ValueError(f'{flag}: {path} lacks part(s) {", ".join(map(str, missing[:5]))}'
                     f'{" ..." if len(missing) > 5 else ""} of {count}: prepare each with '
                     f'--num_shards={count} --shard_index=N (or wait for those being prepared)')
  manifests = [_read_manifest(found[i, count], i, count, path, flag) for i in range(count)]
  for manifest in manifests[1:]:
    for key in ('vocabulary', 'dtype', 'validation_fraction'):
      if manifest[key] != manifests[0][key]:
        raise ValueError(f'{flag}: {path}: {manifest["part"]} was prepared with another {key} '
                         f'than {manifests[0]["part"]} ({_setting(manifest[key])} vs '
                         f'{_setting(manifests[0][key])})')
  for index, manifest in enumerate(manifests):
    for split in SPLITS:
      token_bytes = manifest['tokens'][split] * np.dtype(manifest['dtype']).itemsize
      for suffix, size in (('', token_bytes), (CHECKSUMS, 4 * -(-token_bytes // BLOCK_BYTES))):
        file = folder / f'{manifest["part"]}.{split}{suffix}'
        try:
          found_size = files.file_size(file, flag)
        except (ValueError, FileNotFoundError) as error:
          raise ValueError(f'{error}: {_damaged(path, index, count)}') from None
        if found_size != size:
          raise ValueError(f'{files.named(file, flag)} holds {found_size:,} bytes, its manifest '
                           f'says {size:,}: {_damaged(path, index, count)}')
  return manifests


def _setting(value) -> str:
  return value['name'] if isinstance(value, dict) else repr(value)


def _manifest_schema(part: str) -> dict:
  """What every field of part `part`'s manifest must be (t5lite/files.py checks it)."""
  counts = {split: files.COUNT for split in SPLITS}
  return {
      'format': files.Field(str, lambda f: f == FORMAT, repr(FORMAT)),
      'part': files.Field(str, lambda p: p == part, f'{part!r}, as its file is named'),
      'dtype': files.Field(str, lambda d: d in DTYPES, ' or '.join(map(repr, DTYPES))),
      'vocabulary': vocabulary_lib.IDENTITY,
      'source': str, 'text_key': str, 'inputs': [str],
      'validation_fraction': files.Field(float, lambda f: 0 <= f < 1, 'in [0, 1)'),
      'documents': counts, 'tokens': counts,
      'skipped': files.Field(dict, lambda counts: all(
          isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()),
                             'counts by reason'),
      'checksums': {'algorithm': files.Field(str, lambda a: a == 'crc32c', "'crc32c'"),
                    'block_bytes': files.Field(int, lambda b: b == BLOCK_BYTES,
                                               f'{BLOCK_BYTES}')},
  }


def _read_manifest(file, index: int, count: int, path: str, flag: str) -> dict:
  """Part `index`'s manifest, every field checked; its dtype the one its vocabulary needs."""
  where = files.named(file, flag)
  try:
    manifest = files.read_json(file, flag)
  except (ValueError, FileNotFoundError) as error:
    raise ValueError(f'{error}: {_damaged(path, index, count)}') from None
  if manifest.get('format') == FORMAT_1:
    raise ValueError(f'{where} is of {FORMAT_1!r}, before block checksums; this t5lite reads '
                     f'{FORMAT!r}: prepare the store again')
  try:
    files.check_schema(manifest, _manifest_schema(part_name(index, count)), where)
    wanted = token_dtype(manifest['vocabulary']).str
    if manifest['dtype'] != wanted:
      raise ValueError(f'{where}: dtype is {manifest["dtype"]!r}, not {wanted!r} as a '
                       f'vocabulary of {manifest["vocabulary"]["size"]:,} ids needs')
  except ValueError as error:
    raise ValueError(f'{error}: {_damaged(path, index, count)}') from None
  return manifest


def verify(path: str, progress=None) -> str:
  """`t5lite data --verify`: reads the whole store at `path` (Store.verify); what it holds, in a
  line."""
  if not paths.path(path).is_dir():
    raise ValueError(f'--verify={path} is no folder; give a token store')
  checked = Store(path, '--verify')
  tokens = checked.verify(progress)
  return (f'{path}: {len(checked.manifests)} part(s), {tokens:,} tokens, every block as its '
          'checksum says and every id within the vocabulary')


@functools.lru_cache(maxsize=4)
def open_store(path: str) -> Store:
  return Store(path)


@functools.lru_cache(maxsize=4)
def _in_memory(source: str, text_key: str, vocabulary_name: str, validation_fraction: float,
               tfds_data_dir: str) -> tuple[np.ndarray, np.ndarray, str]:
  """The (train, validation) tokens of a source tokenized here, once per process, and what was
  skipped (Skipped.line(), or '')."""
  vocab = vocabulary_lib.load_vocabulary(vocabulary_name)
  skipped = sources.Skipped(flag='data.source')
  pieces = ([], [])
  for chunk in tokenize(sources.inputs(source, text_key, tfds_data_dir), vocab,
                        validation_fraction, skipped):
    pieces[0].append(chunk.train)
    pieces[1].append(chunk.validation)
  train, validation = (np.concatenate(split) for split in pieces)
  if not train.size + validation.size:
    raise ValueError(f'data.source {source!r} holds no text ({skipped.line()})')
  return train, validation, skipped.line() if skipped else ''


def split_tokens(data, split: str) -> Tokens:
  """The tokens of `split` of `data.source`: a store's, or any other source's tokenized here."""
  if split not in sources.SPLITS:
    raise ValueError(f'split must be one of {sources.SPLITS}, got {split!r}')
  if is_store(data.source):
    store = open_store(os.fspath(paths.path(data.source)))
    store.check_vocabulary(vocabulary_lib.load_vocabulary(data.vocabulary), data.vocabulary)
    tokens, advice = store.tokens(split), 'its held-out split is the one it was prepared with'
  else:
    train, validation, skipped = _in_memory(data.source, data.text_key, data.vocabulary,
                                            data.validation_fraction, data.tfds_data_dir)
    pieces = {'train': [train], 'validation': [validation], 'all': [train, validation]}[split]
    offset = vocabulary_lib.load_vocabulary(data.vocabulary).store_offset
    tokens = Tokens(pieces, skipped=skipped, offset=offset)
    advice = f'change data.validation_fraction={data.validation_fraction}'
  if not tokens.size:
    raise ValueError(f'the {split} split of {data.source!r} is empty; {advice}'
                     + (f' ({tokens.skipped})' if tokens.skipped else ''))
  return tokens
