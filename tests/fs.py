"""File-system helpers of the fault tests: a snapshot that shows whether anything changed, and
acting as another user where root would ignore file modes."""

import contextlib
import hashlib
import os


def snapshot(directory) -> dict[str, str]:
  """Every folder and file under `directory`, files with their SHA-256: 'nothing changed'. A FIFO
or other special file is noted as such, never opened (that would block)."""
  found = {}
  for root, folders, files in os.walk(directory):
    for name in folders:
      found[os.path.relpath(os.path.join(root, name), directory)] = 'folder'
    for name in files:
      path = os.path.join(root, name)
      if not os.path.isfile(path):
        found[os.path.relpath(path, directory)] = 'special'
        continue
      with open(path, 'rb') as f:
        found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return found


def changes(before: dict[str, str], after: dict[str, str]) -> str:
  """What differs between two snapshots, for a failing assertion's message."""
  added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
  changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
  return f'added {added}, removed {removed}, changed {changed}'


@contextlib.contextmanager
def acting_as(user):
  """Root ignores file modes: a root test acts meanwhile as `user`, for whom they hold."""
  if user is None:
    yield
    return
  os.setegid(user.pw_gid)
  os.seteuid(user.pw_uid)
  try:
    yield
  finally:
    os.seteuid(0)
    os.setegid(0)
