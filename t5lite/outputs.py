"""Where `export`, `tokenizer`, `data --out` and `infer --out` may write, and how: never over a
workdir or over what they did not write, and all or nothing.

  check_folder(out, ('config.json', 'model.safetensors'), workdir=workdir)  # first, cheap
  ...                                                                       # the expensive part
  with writing(out, folder=True) as temp:                                   # last
    write_files_into(temp)

The checks raise a one-line ValueError, having written nothing, for an output that is
--workdir, inside it or above it; inside any workdir (a folder with config.json and
checkpoints/); a file where a folder is wanted or the reverse; or in a folder that cannot be
written. --overwrite lifts none of these. An existing output is replaced only if the command
wrote it (an earlier output: a folder holding only the command's files, a file `earlier`
recognises, or an empty file); anything else needs --overwrite, which replaces the command's own
files and leaves any other files of a folder alone: it never deletes what the command does not
write.

`writing` yields a hidden temporary sibling of the output, which takes the output's place only
when the block completes (a rename; into an existing folder, one rename per file), so an
exception mid-write leaves the earlier output as it was and no temporary behind; a kill can leave
the hidden temporary, never a half-written file.
"""

import contextlib
import json
import os
import secrets
import shutil
import zipfile
from typing import Callable, Collection, Iterator


def check_folder(path: str, files: Collection[str], *, workdir: str | None = None,
                 overwrite: bool = False) -> None:
  """Refuses `path` as the folder a command writes `files` in (see the module docstring)."""
  _check_place(path, workdir)
  if os.path.lexists(path) and not os.path.isdir(path):
    raise ValueError(f'--out={path} is a file, not a folder; give a folder')
  if not os.path.isdir(path):
    return
  entries = sorted(os.listdir(path))
  blocked = [name for name in files if name in entries
             and not os.path.isfile(os.path.join(path, name))]
  if blocked:
    raise ValueError(f'--out={path} holds {blocked[0]}, which is not a file; give another folder')
  others = [name for name in entries if name not in files]
  if others and not overwrite:
    raise ValueError(f'--out={path} holds {others[0]}{", ..." if len(others) > 1 else ""}, which '
                     'this command does not write; give a new or empty folder, or --overwrite '
                     f'to replace {" and ".join(files)} in it')


def check_file(path: str, earlier: Callable[[str], bool], *, workdir: str | None = None,
               overwrite: bool = False) -> None:
  """Refuses `path` as a file a command writes; `earlier(path)`: whether the command wrote it."""
  _check_place(path, workdir)
  if path.endswith(os.sep) or os.path.isdir(path):
    raise ValueError(f'--out={path} is a folder, not a file; give a file')
  if os.path.lexists(path) and not os.path.isfile(path):
    raise ValueError(f'--out={path} is not a regular file; give a file')
  if os.path.isfile(path) and os.path.getsize(path) and not (overwrite or earlier(path)):
    raise ValueError(f'--out={path} is a file this command did not write; give a new path, or '
                     '--overwrite to replace it')


def _check_place(path: str, workdir: str | None) -> None:
  """Refuses a path in or above --workdir, in any workdir, or where nothing can be written."""
  if not path:
    raise ValueError('--out is empty; give a path')
  real = os.path.realpath(path)
  if workdir is not None:
    home = os.path.realpath(workdir)
    if _within(real, home):
      raise ValueError(f'--out={path} is {"" if real == home else "inside "}--workdir={workdir}; '
                       'write it outside the workdir')
    if _within(home, real):
      raise ValueError(f'--out={path} holds --workdir={workdir}; write it outside the workdir')
  for folder in _ancestors(real):
    if _is_workdir(folder):
      raise ValueError(f'--out={path} is {"" if folder == real else "inside "}the workdir '
                       f'{folder}; write it outside any workdir')
  existing = next(f for f in _ancestors(os.path.dirname(real)) if os.path.lexists(f))
  if not os.path.isdir(existing):
    raise ValueError(f'--out={path}: {existing} is a file, not a folder')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f'--out={path}: cannot write in {existing}')


def _is_workdir(folder: str) -> bool:
  """What `train` makes: config.json and checkpoints/ (an HF folder has config.json only)."""
  return (os.path.isfile(os.path.join(folder, 'config.json'))
          and os.path.isdir(os.path.join(folder, 'checkpoints')))


def _within(path: str, folder: str) -> bool:
  return os.path.commonpath([path, folder]) == folder


def _ancestors(path: str) -> Iterator[str]:
  """`path` and each folder above it, up to the root."""
  while True:
    yield path
    parent = os.path.dirname(path)
    if parent == path:
      return
    path = parent


@contextlib.contextmanager
def writing(path: str, *, folder: bool = False) -> Iterator[str]:
  """Yields a hidden temporary sibling of `path` (an empty folder if `folder`) to write into; when
  the block completes, it becomes `path`, or its files replace their namesakes in the existing
  folder `path`. On an exception it is removed, as are the missing parent folders it created."""
  path = os.path.abspath(path)
  parent = os.path.dirname(path)
  created = next((f for f in reversed(list(_ancestors(parent))) if not os.path.exists(f)), None)
  os.makedirs(parent, exist_ok=True)
  temp = os.path.join(parent, f'.{os.path.basename(path)}.{secrets.token_hex(4)}.tmp')
  try:
    if folder:
      os.mkdir(temp)
    yield temp
    if not folder or not os.path.isdir(path):
      os.replace(temp, path)
    else:
      for name in os.listdir(temp):
        os.replace(os.path.join(temp, name), os.path.join(path, name))
      os.rmdir(temp)
  except BaseException:
    if os.path.isdir(temp):
      shutil.rmtree(temp)
    elif os.path.lexists(temp):
      os.remove(temp)
    if created:
      shutil.rmtree(created, ignore_errors=True)
    raise


def is_jsonl_of(path: str, keys: Collection[str]) -> bool:
  """Whether every line of `path` is a JSON object with exactly `keys`."""
  try:
    with open(path, encoding='utf-8') as f:
      return all(_is_object_of(line, keys) for line in f)
  except (OSError, UnicodeDecodeError):
    return False


def _is_object_of(line: str, keys: Collection[str]) -> bool:
  try:
    row = json.loads(line)
  except ValueError:
    return False
  return isinstance(row, dict) and row.keys() == set(keys)


def is_npz_of(path: str, prefixes: tuple[str, ...]) -> bool:
  """Whether `path` is an .npz (a zip of .npy arrays) whose arrays' names all start with one of
  `prefixes`."""
  try:
    with zipfile.ZipFile(path) as archive:
      names = archive.namelist()
  except (OSError, zipfile.BadZipFile):
    return False
  return bool(names) and all(name.endswith('.npy') and name.startswith(prefixes)
                             for name in names)
