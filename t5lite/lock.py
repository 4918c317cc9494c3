"""One writer at a time: `train` and `finetune` hold `<workdir>/t5lite.lock` while they run, so a
second run on the same workdir stops at once instead of writing checkpoints over the first's;
`prepare` holds a lock per part of a token store (`.part-00000-of-00004.lock`) in the same way.

The lock is a JSON file naming its holder: host, pid, the process's start time, when it started,
its command, and a heartbeat that the holder rewrites every `heartbeat_seconds`. A run killed
without cleanup (SIGKILL, a lost machine) leaves the file behind, and the next run takes it over
when the holder is gone:

- holder on this host: its pid runs no more, or now belongs to another process (pids are reused:
  the start time in /proc/<pid>/stat tells them apart where there is a /proc);
- holder on another host, whose processes cannot be seen from here: its heartbeat is older than
  `stale_seconds` (the hosts' clocks must agree to well within that).

On a local or NFS filesystem every step is atomic: the lock is created with O_CREAT|O_EXCL, and of
the runs that find the same stale lock only the one that creates `t5lite.lock.takeover-<its
token>` (exclusively too) replaces it, after checking that it still holds what it judged stale.
On gs:// the same code runs through etils.epath, which has no exclusive create (GCS has one, the
ifGenerationMatch=0 precondition, but epath does not expose it): "create if absent" is a check
and then a write, so two runs that start, or take over the same stale lock, within one round trip
of each other (about 0.1 s) can both go on. The rest holds there too.
"""

import json
import os
import socket
import sys
import threading
import time
import uuid

from etils import epath

from t5lite import files
from t5lite import paths

LOCK_NAME = 't5lite.lock'
HEARTBEAT_SECONDS = 30
STALE_SECONDS = 300  # ten missed heartbeats: a busy or briefly disconnected host is not dead
RECORD_KEYS = {'token', 'host', 'pid', 'start_ticks', 'heartbeat'}  # what a holder is judged by


class Lock:
  """`with Lock(workdir, 't5lite train'):` holds the workdir for the block.

  `name`: the lock file's name in `folder`; `what`: how messages name what is locked (the folder;
  'part 0 of 4 of stores/c4'). `enabled=False` (processes other than 0 of a multi-host run)
  makes it do nothing.
  """

  def __init__(self, folder: str, command: str, *, name: str = LOCK_NAME,
               what: str | None = None, enabled: bool = True,
               heartbeat_seconds: float = HEARTBEAT_SECONDS,
               stale_seconds: float = STALE_SECONDS):
    self.what, self.enabled = what or folder, enabled
    self._place = what or f'workdir {folder}'  # what "cannot write to ..." names
    self.path = paths.path(folder) / name
    self.heartbeat_seconds, self.stale_seconds = heartbeat_seconds, stale_seconds
    self.host, self.pid = socket.gethostname(), os.getpid()
    self.token = uuid.uuid4().hex
    state = process_state(self.pid)
    self._local = not paths.is_uri(self.path)
    self._identity = dict(
        token=self.token, host=self.host, pid=self.pid, start_ticks=state and state[1],
        since=time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()), command=command,
        argv=sys.argv)
    self._stop, self._heartbeat = threading.Event(), None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc_info):
    self.release()

  def acquire(self) -> 'Lock':
    """Takes the lock, creating the folder if needed; a ValueError in one line if a live run
    holds it or the folder cannot be written."""
    if not self.enabled:
      return self
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      while not self._create(self.path):
        holder = self._read(self.path)
        if holder is None:
          continue  # released since we tried
        why = self._why_stale(holder)
        if why is None:
          raise ValueError(self._in_use(holder))
        if self._take_over(holder):
          print(f'taking over the lock of {self.what} left by pid {holder["pid"]} on host '
                f'{holder["host"]} since {holder["since"]} ({why})', file=sys.stderr, flush=True)
          break
    except OSError as error:
      raise ValueError(f'cannot write to {self._place}: {error.strerror or error}') from None
    self._stop.clear()
    self._heartbeat = threading.Thread(target=self._beat, daemon=True, name='t5lite.lock')
    self._heartbeat.start()
    return self

  def release(self) -> None:
    """Removes the lock if it is still ours (a run that looked dead may have lost it)."""
    if self._heartbeat is None:
      return
    self._stop.set()
    self._heartbeat.join()
    self._heartbeat = None
    try:
      holder = self._read(self.path)
      if holder is not None and holder['token'] == self.token:
        self.path.unlink(missing_ok=True)
    except OSError as error:  # the run itself is done: the next one takes the lock over
      print(f'warning: could not remove the lock of {self.what}: {error}', file=sys.stderr,
            flush=True)

  def _record(self) -> dict:
    return dict(self._identity, heartbeat=time.time())

  def _create(self, path: epath.Path) -> bool:
    """Writes our record to `path` unless the file exists; atomic on a local filesystem only."""
    text = json.dumps(self._record())
    if self._local:
      try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, 'w', encoding='utf-8') as f:
        f.write(text)
      return True
    if path.exists():
      return False
    path.write_text(text)
    return True

  def _replace(self) -> None:
    """Our record in place of the lock, whole: readers never see a partly written file."""
    temporary = self.path.with_name(f'{self.path.name}.{self.token}.tmp')
    temporary.write_text(json.dumps(self._record()))
    temporary.replace(self.path)

  def _read(self, path: epath.Path) -> dict | None:
    """The record in `path`, None if there is none; waits out a file created but not yet
    written (`_create` writes right after creating)."""
    for _ in range(20):
      try:
        record = files.parse_json(path.read_text(), str(path))
      except FileNotFoundError:
        return None
      except ValueError:
        time.sleep(0.05)
        continue
      if isinstance(record, dict) and RECORD_KEYS <= record.keys():
        return record
      break
    raise ValueError(f'{path} is not a t5lite lock file; remove it if no run uses {self.what}')

  def _why_stale(self, holder: dict) -> str | None:
    """Why the holder of a lock is taken to be gone, None while it may be running."""
    if holder['host'] == self.host:
      return None if is_running(holder['pid'], holder['start_ticks']) else 'no longer running'
    age = time.time() - holder['heartbeat']
    return f'no heartbeat for {age:.0f} s' if age > self.stale_seconds else None

  def _in_use(self, holder: dict) -> str:
    heard = ('' if holder['host'] == self.host else
             f' (last heartbeat {time.time() - holder["heartbeat"]:.0f} s ago, stale after '
             f'{self.stale_seconds:.0f} s)')
    return (f'{self.what} is in use by {holder["command"]} on host {holder["host"]}, pid '
            f'{holder["pid"]}, since {holder["since"]}{heard}; wait for it or stop it')

  def _take_over(self, holder: dict) -> bool:
    """Replaces the stale lock `holder` with ours; False if another run got there first or the
    lock changed, so the caller looks again."""
    marker = self.path.with_name(f'{self.path.name}.takeover-{holder["token"]}')
    if not self._create(marker):
      taker = self._read(marker)
      if taker is not None and self._why_stale(taker):
        marker.unlink(missing_ok=True)  # its run was killed halfway through taking over
      else:
        time.sleep(0.05)  # another run is taking over right now
      return False
    try:
      if self._read(self.path) != holder:
        return False
      self._replace()
      return True
    finally:
      marker.unlink(missing_ok=True)  # whoever creates it next reads the lock again first

  def _beat(self) -> None:
    """Rewrites the heartbeat until released; stops, saying so, if another run took the lock."""
    while not self._stop.wait(self.heartbeat_seconds):
      try:
        holder = self._read(self.path)
        if holder is None or holder['token'] != self.token:
          taker = 'it was removed' if holder is None else (
              f'pid {holder["pid"]} on host {holder["host"]} took it over')
          print(f'warning: lost the lock of {self.what}: {taker}', file=sys.stderr, flush=True)
          return
        self._replace()
      except (OSError, ValueError) as error:  # a passing storage error: try at the next beat
        print(f'warning: could not refresh the lock of {self.what}: {error}', file=sys.stderr,
              flush=True)


def process_state(pid: int) -> tuple[str, int] | None:
  """(state, start time in clock ticks since boot) of process `pid` from /proc/<pid>/stat; None
  without /proc or such a process."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      fields = f.read().rpartition(')')[2].split()  # the fields after the command name
  except OSError:
    return None
  return fields[0], int(fields[19])


def is_running(pid: int, ticks: int | None) -> bool:
  """Whether `pid` is a live process started at `ticks` (at any time if None: no /proc)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # another user's process: it exists
  if ticks is None:
    return True
  state = process_state(pid)
  # Z: a zombie, killed but not yet reaped by its parent.
  return state is not None and state[0] not in ('Z', 'X') and state[1] == ticks
