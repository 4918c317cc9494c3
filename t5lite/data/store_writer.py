"""Writing one part of a token store (t5lite/data/store.py has the format and the reader).

  check_out(out, manifest, num_shards, overwrite)  # may this part be written there? (one line)
  with PartWriter(out, part, 'part 0 of 4 of stores/c4') as writer:
    writer.write('train', token_bytes)  # appended to the split's file, checksummed by block
    writer.publish(manifest)            # the part takes its place; its manifest comes last

A part is the unit of a restart, and of safety: one run at a time writes it, under hidden names
of its own (on Cloud Storage, objects no reader looks at), and its files take their places only
when it is complete, the manifest last, so that a refused or interrupted run leaves the store as
it was.
"""

import contextlib
import errno
import json
import os
import secrets
import signal
import threading

from etils import epath

from t5lite import files
from t5lite import lock as lock_lib
from t5lite import outputs
from t5lite import paths
from t5lite.data import store


def check_out(out: str, manifest: dict, num_shards: int, overwrite: bool) -> None:
  """Refuses an --out where this part may not be written (before anything is)."""
  outputs.check_folder(out, (), overwrite=True)  # the place: not in or above a workdir, no file
  folder = paths.path(out)
  entries = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
  foreign = [name for name in entries if not store.PART_FILE.fullmatch(name)]
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


class PartWriter:
  """Writes one part of a store, whole or not at all, as the only run writing it.

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

  def __enter__(self) -> 'PartWriter':
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
