"""`t5lite prepare`: tokenize a corpus once into a token store (t5lite/data/store.py).

  t5lite prepare --source='corpus/*.jsonl.zst' --out=/data/store
  t5lite prepare --source='gs://b/c4/*.json.gz' --out=gs://b/store --num_shards=32 --shard_index=$i

It streams: whatever the corpus, memory holds a few batches of documents and their tokens. A
thread reads and hashes documents while SentencePiece encodes the previous ones on `workers`
threads. Part i of N takes the source's inputs (files, or a TFDS dataset's file shards) [i*n/N,
(i+1)*n/N) in order, so the parts in order hold the corpus in order and need no merge pass: run
them on N machines at once (a SLURM array, the workers of a TPU VM slice) or one after another.

A part is the unit of a restart, and of safety (`_PartWriter`): one run at a time writes it,
under hidden names of its own (on Cloud Storage, objects no reader looks at), and its files take
their places only when it is complete, the manifest last, so that a refused or interrupted run
leaves the store as it was. A killed part run again starts over, replacing what the killed run
left; a part that is complete is refused unless --overwrite.
"""

import collections
import contextlib
import errno
import json
import os
import re
import secrets
import signal
import threading
import time

from etils import epath

from t5lite import files
from t5lite import lock as lock_lib
from t5lite import outputs
from t5lite import paths
from t5lite.data import sources
from t5lite.data import store
from t5lite.data import vocabulary as vocabulary_lib

_PROGRESS_EVERY_S = 1.0
# what a store's folder holds: parts' files, and the locks and temporaries of parts being written
_PART_FILE = re.compile(r'\.?part-\d{5}-of-\d{5}\..+')


def prepare(source: str, out: str, *, vocabulary: str = 'bundled', text_key: str = 'text',
            validation_fraction: float = 0.05, tfds_data_dir: str = '', workers: int = 0,
            num_shards: int = 1, shard_index: int = 0, overwrite: bool = False,
            max_bad_fraction: float = sources.MAX_BAD_FRACTION,
            progress=None) -> tuple[dict, sources.Skipped]:
  """Writes part `shard_index` of `num_shards` of the store `out`; returns its manifest and what
  reading the source skipped.

  Every check runs before anything is written: one ValueError line for a bad setting, a source
  that cannot be read (or a file of it with more than `max_bad_fraction` of its lines
  malformed), or an --out that is no place for this part. `progress`: a text stream for a
  progress line (documents, tokens, tokens/s, ETA), or None.
  """
  if not 0 <= validation_fraction < 1:
    raise ValueError(f'--validation_fraction={validation_fraction} must be in [0, 1)')
  if not 0 <= shard_index < num_shards:
    raise ValueError(f'--shard_index={shard_index} must be in [0, --num_shards={num_shards})')
  if workers < 0:
    raise ValueError(f'--workers={workers} must be at least 0 (0: every core)')
  skipped = sources.Skipped(max_bad_fraction=max_bad_fraction)
  vocab = vocabulary_lib.load_vocabulary(vocabulary, flag='--vocabulary')
  every_input = sources.inputs(source, text_key, tfds_data_dir, flag='--source')
  if num_shards > len(every_input):
    raise ValueError(f'--num_shards={num_shards}: --source has {len(every_input)} input(s) '
                     '(files, or TFDS file shards) to share; give at most that many shards')
  first = len(every_input) * shard_index // num_shards
  mine = every_input[first:len(every_input) * (shard_index + 1) // num_shards]
  part = store.part_name(shard_index, num_shards)
  manifest = {
      'format': store.FORMAT, 'part': part,
      'dtype': store.token_dtype(vocab.vocab_size).str,
      'vocabulary': {'name': vocabulary, 'sha256': store.vocabulary_digest(vocab),
                     'size': vocab.vocab_size},
      'source': source, 'text_key': text_key, 'validation_fraction': validation_fraction,
      'inputs': [item.name for item in mine],
      'checksums': {'algorithm': 'crc32c', 'block_bytes': store.BLOCK_BYTES}}
  _check_out(out, manifest, num_shards, overwrite)

  where = f'part {shard_index} of {num_shards} of {out}'
  documents, tokens = collections.Counter(), collections.Counter()
  meter = _Progress(progress, part, len(mine))
  with _PartWriter(out, part, where) as writer:
    _check_out(out, manifest, num_shards, overwrite)  # again, now that no other run can write it
    for chunk in store.tokenize(mine, vocab, validation_fraction, skipped, workers=workers):
      for split, split_tokens, count in zip(store.SPLITS, chunk[:2], chunk.documents):
        writer.write(split, split_tokens.tobytes())
        documents[split] += count
        tokens[split] += split_tokens.size
      meter.update(sum(documents.values()), sum(tokens.values()), chunk.inputs_done)
    meter.close()
    if not sum(tokens.values()):
      raise ValueError(f'--source {source!r} holds no text in part {shard_index} of '
                       f'{num_shards} ({skipped.line()})')
    if not tokens['train']:
      raise ValueError(f'--validation_fraction={validation_fraction} held out all '
                       f'{documents["validation"]:,} documents of part {shard_index} of '
                       f'{num_shards}, which would have no train tokens; give a smaller one')
    manifest.update(documents={s: documents[s] for s in store.SPLITS},
                    tokens={s: tokens[s] for s in store.SPLITS},
                    skipped=dict(sorted(skipped.items())))
    writer.publish(manifest)
  return manifest, skipped


def _check_out(out: str, manifest: dict, num_shards: int, overwrite: bool) -> None:
  """Refuses an --out where this part may not be written (before anything is)."""
  outputs.check_folder(out, (), overwrite=True)  # the place: not in or above a workdir, no file
  folder = paths.path(out)
  entries = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
  foreign = [name for name in entries if not _PART_FILE.fullmatch(name)]
  if foreign and not overwrite:
    raise ValueError(f'--out={out} holds {foreign[0]}{", ..." if len(foreign) > 1 else ""}, '
                     'which is no part of a token store; give a new or empty folder, or '
                     '--overwrite to write this part beside it')
  for name in entries:
    match = store.MANIFEST.fullmatch(name)
    if not match:
      continue
    where = f'--out={out} holds part {int(match[1])} of {int(match[2])}'
    if int(match[2]) != num_shards:
      raise ValueError(f'{where}; give --num_shards={int(match[2])}, or a new --out')
    if name == manifest['part'] + '.json':
      if not overwrite:
        raise ValueError(f'{where} already (complete); --overwrite to prepare it again')
      continue
    other = files.read_json(folder / name, '--out')
    for key, flag in (('format', 'version of t5lite'), ('vocabulary', '--vocabulary'),
                      ('validation_fraction', '--validation_fraction'),
                      ('text_key', '--text_key'), ('source', '--source')):
      theirs, ours = other.get(key), manifest[key]
      if key == 'vocabulary':
        theirs, ours = (theirs if isinstance(theirs, dict) else {}).get('sha256'), ours['sha256']
      elif key == 'source':  # its files are read in sorted order: 'a,b' is 'b,a'
        theirs, ours = (_parts(s) if isinstance(s, str) else s for s in (theirs, ours))
      if theirs != ours:
        raise ValueError(f'{where}, prepared with another {flag}; give the same one, or a '
                         'new --out')


def _parts(source: str) -> list[str]:
  return sorted(part.strip() for part in source.split(','))


class _PartWriter:
  """Writes one part of a store, whole or not at all, as the only run writing it.

    with _PartWriter(out, part, 'part 0 of 4 of stores/c4') as writer:
      writer.write('train', token_bytes)  # appended to the split's file, checksummed by block
      writer.publish(manifest)            # the part takes its place; its manifest comes last

  Entering takes the part's lock (a second run of the part is refused in one line; a killed
  run's lock is taken over) and removes a killed run's temporaries. The files are written under
  hidden names of this run's own. `publish` moves them into place and writes the manifest last,
  with Ctrl-C and SIGTERM held back meanwhile: until then a complete part being prepared again
  (--overwrite) stands as it was. Leaving without `publish` (an error, Ctrl-C) removes this run's
  files, the lock, and the folders it made; nothing else was touched.
  """

  def __init__(self, out: str, part: str, where: str):
    self._part, self._where = part, where
    self._folder = paths.path(out)
    self._remote = paths.is_uri(self._folder)
    self._created = None if self._remote else next(
        (f for f in reversed(paths.ancestors(self._folder)) if not f.exists()), None)
    self._lock = lock_lib.Lock(out, 't5lite prepare', name=f'.{part}.lock', what=where)
    self._token = secrets.token_hex(4)
    self._names = [f'{part}.{split}{suffix}' for split in store.SPLITS
                   for suffix in ('', store.CHECKSUMS)]
    self._open = contextlib.ExitStack()  # the staged files, open for writing
    self._files, self._checksums, self._published = {}, {}, False

  def _staged(self, name: str) -> epath.Path:
    return self._folder / f'.{name}.{self._token}.tmp'

  def __enter__(self) -> '_PartWriter':
    self._lock.acquire()
    try:
      with self._writing():
        for stale in self._folder.glob(f'.{self._part}.*.tmp'):
          stale.unlink()  # of a run of this part that was killed: none runs now
        for name in self._names:
          self._files[name] = self._open.enter_context(self._staged(name).open('wb'))
    except BaseException:
      self._clean_up()
      raise
    self._checksums = {split: store.BlockChecksums() for split in store.SPLITS}
    return self

  def write(self, split: str, data: bytes) -> None:
    with self._writing():
      self._files[f'{self._part}.{split}'].write(data)
      self._files[f'{self._part}.{split}{store.CHECKSUMS}'].write(
          self._checksums[split].update(data))

  def publish(self, manifest: dict) -> None:
    with self._writing():
      for split in store.SPLITS:
        self._files[f'{self._part}.{split}{store.CHECKSUMS}'].write(
            self._checksums[split].final())
      staged_manifest = self._staged(f'{self._part}.json')
      self._files[f'{self._part}.json'] = self._open.enter_context(staged_manifest.open('wb'))
      self._files[f'{self._part}.json'].write(json.dumps(manifest, indent=1).encode())
      for file in self._files.values():  # on the disk before they are published: a power cut
        file.flush()  # must not leave a manifest over files the disk never got
        if not self._remote:
          os.fsync(file.fileno())
      self._open.close()  # on Cloud Storage: uploaded
      with _signals_held():
        (self._folder / f'{self._part}.json').unlink(missing_ok=True)  # --overwrite: the
        for name in self._names:  # old part stops being one before its files are replaced
          self._staged(name).replace(self._folder / name)
        staged_manifest.replace(self._folder / f'{self._part}.json')
        self._published = True
        if not self._remote:
          _sync_folder(self._folder)

  def __exit__(self, *exc_info) -> None:
    self._clean_up()

  def _clean_up(self) -> None:
    """Removes this run's temporaries (and, unpublished, the folders it made); releases the
    lock."""
    with contextlib.suppress(OSError):  # a full disk fails the flush of what was buffered
      self._open.close()
    for name in self._files:
      self._staged(name).unlink(missing_ok=True)
    self._lock.release()
    if not self._published and self._created is not None:
      for made in paths.ancestors(self._folder)[:paths.ancestors(self._folder).index(
          self._created) + 1]:
        try:  # only if empty: a part run beside this one may be writing there
          os.rmdir(made)
        except OSError:
          break

  @contextlib.contextmanager
  def _writing(self):
    """OSErrors as one line naming the part, not the hidden file that met them."""
    try:
      yield
    except OSError as error:
      reason = ('no space left on the device' if error.errno == errno.ENOSPC else
                error.strerror or str(error))
      raise ValueError(f'cannot write {self._where}: {reason}') from None


def _sync_folder(folder: epath.Path) -> None:
  """Puts a local folder's renames on the disk."""
  descriptor = os.open(folder, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


@contextlib.contextmanager
def _signals_held():
  """Holds Ctrl-C and SIGTERM back for the block (a part's few renames), then acts on them: the
  part is published whole or not at all, whatever the moment of the signal."""
  received = []
  held = (signal.SIGINT, signal.SIGTERM)
  if threading.current_thread() is not threading.main_thread():
    yield  # only the main thread may set handlers; signals reach it, not this thread
    return
  previous = {number: signal.signal(number, lambda signum, _: received.append(signum))
              for number in held}
  try:
    yield
  finally:
    for number, handler in previous.items():  # None: a handler set outside Python
      signal.signal(number, signal.SIG_DFL if handler is None else handler)
    for number in received:
      signal.raise_signal(number)


class _Progress:
  """One line, rewritten in place about once a second: documents, tokens, tokens/s, ETA (by the
  inputs read, of this part's)."""

  def __init__(self, stream, part: str, num_inputs: int):
    self._stream, self._part, self._num_inputs = stream, part, num_inputs
    self._start = self._shown = time.monotonic()
    self._width = 0

  def update(self, documents: int, tokens: int, inputs_done: tuple[float, int]) -> None:
    now = time.monotonic()
    if self._stream is None or now - self._shown < _PROGRESS_EVERY_S:
      return
    self._shown, elapsed = now, now - self._start
    done = inputs_done[0] / max(inputs_done[1], 1)
    eta = _duration((1 - done) * elapsed / done) if done else '?'
    line = (f'{self._part}: {documents:,} documents, {tokens:,} tokens, '
            f'{tokens / elapsed:,.0f} tokens/s, {inputs_done[0]:.1f}/{inputs_done[1]} inputs, '
            f'ETA {eta}')
    self._stream.write('\r' + line.ljust(self._width))
    self._stream.flush()
    self._width = len(line)

  def close(self) -> None:
    if self._stream is not None and self._width:
      self._stream.write('\n')
      self._stream.flush()


def _duration(seconds: float) -> str:
  return (f'{seconds:.0f} s' if seconds < 120 else f'{seconds / 60:.0f} min' if seconds < 7200
          else f'{seconds / 3600:.1f} h')
