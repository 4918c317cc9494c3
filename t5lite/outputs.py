"""Where `export`, `tokenizer`, `data --out` and `infer --out` may write, and how: never over a
workdir or over what they did not write, and all or nothing.

  check_folder(out, ('config.json', 'model.safetensors'), workdir=workdir)  # first, cheap
  ...                                                                       # the expensive part
  with writing(out, folder=True) as temp:                                   # last
    write_files_into(temp)

The checks raise a one-line ValueError, having written nothing, for an output that is
--workdir, inside it or above it; inside or above any workdir (a folder with config.json and
checkpoints/); a file where a folder is wanted or the reverse; or in a folder that cannot be
written. --overwrite lifts none of these. An existing output is replaced only if the command
wrote it (an earlier output: a folder holding only the command's files, a file `earlier`
recognises, or an empty file); anything else needs --overwrite, which replaces the command's own
files and leaves any other files of a folder alone: it never deletes what the command does not
write.

`writing` yields a hidden temporary sibling of the output, which takes the output's place only
when the block completes (a rename; into an existing folder, one rename per file), so an
exception mid-write leaves the earlier output as it was and no temporary behind; a kill can leave
the hidden temporary, never a half-written file, and the next write of that output removes it.
"""

import contextlib
import glob
import hashlib
import os
import secrets
import shutil
import tempfile
import zipfile
from typing import Callable, Collection, Iterator

from etils import epath

from t5lite import files
from t5lite import paths


def check_folder(path: str, files: Collection[str], *, workdir: str | None = None,
                 overwrite: bool = False) -> None:
  """Refuses `path` as the folder a command writes `files` in (see the module docstring); a file
  may be in a subfolder ('generator/config.json')."""
  out = _check_place(path, workdir)
  if out.exists() and not out.is_dir():
    raise ValueError(f'--out={path} is a file, not a folder; give a folder')
  if not out.is_dir():
    return
  below = next((top for top, folders, names in out.walk()
                if 'config.json' in names and 'checkpoints' in folders), None)
  if below is not None:
    raise ValueError(f'--out={path} holds the workdir {below}; write it outside any workdir')
  subfolders = {name.split('/')[0] for name in files if '/' in name}
  entries = sorted(entry.name for entry in out.iterdir())
  for name in subfolders & set(entries):
    if not (out / name).is_dir():
      raise ValueError(f'--out={path} holds {name}, which is not a folder; give another folder')
    entries += sorted(f'{name}/{entry.name}' for entry in (out / name).iterdir())
  blocked = [name for name in files if name in entries and not (out / name).is_file()]
  if blocked:
    raise ValueError(f'--out={path} holds {blocked[0]}, which is not a file; give another folder')
  others = [name for name in entries if name not in files and name not in subfolders]
  if others and not overwrite:
    raise ValueError(f'--out={path} holds {others[0]}{", ..." if len(others) > 1 else ""}, which '
                     'this command does not write; give a new or empty folder, or --overwrite '
                     f'to replace {_listed(files)} in it')


def check_file(path: str, earlier: Callable[[epath.Path], bool], *, workdir: str | None = None,
               overwrite: bool = False) -> None:
  """Refuses `path` as a file a command writes; `earlier(path)`: whether the command wrote it."""
  out = _check_place(path, workdir)
  if path.endswith('/') or out.is_dir():
    raise ValueError(f'--out={path} is a folder, not a file; give a file')
  regular = out.is_file() if paths.is_uri(out) else os.path.isfile(out)  # epath: a fifo is too
  if out.exists() and not regular:
    raise ValueError(f'--out={path} is not a regular file; give a file')
  if regular and out.stat().length and not (overwrite or earlier(out)):
    raise ValueError(f'--out={path} is a file this command did not write; give a new path, or '
                     '--overwrite to replace it')


def _check_place(path: str, workdir: str | None) -> epath.Path:
  """Refuses a path in or above --workdir, in any workdir, or where nothing can be written;
  returns it as a path."""
  if not path:
    raise ValueError('--out is empty; give a path')
  out = paths.path(path)
  if workdir is not None:
    if paths.within(out, workdir):
      inside = '' if out == paths.path(workdir) else 'inside '
      raise ValueError(f'--out={path} is {inside}--workdir={workdir}; write it outside the workdir')
    if paths.within(workdir, out):
      raise ValueError(f'--out={path} holds --workdir={workdir}; write it outside the workdir')
  for folder in paths.ancestors(out):
    if is_workdir(folder):
      raise ValueError(f'--out={path} is {"" if folder == out else "inside "}the workdir '
                       f'{folder}; write it outside any workdir')
  if not paths.is_uri(out):
    existing = next(f for f in paths.ancestors(out.parent) if os.path.lexists(f))
    if not os.path.isdir(existing):
      raise ValueError(f'--out={path}: {existing} is a file, not a folder')
    if not os.access(existing, os.W_OK | os.X_OK):
      raise ValueError(f'--out={path}: cannot write in {existing}')
  return out


def is_workdir(folder: epath.Path) -> bool:
  """What `train` makes: config.json and checkpoints/ (an HF folder has config.json only)."""
  return (folder / 'config.json').is_file() and (folder / 'checkpoints').is_dir()


@contextlib.contextmanager
def writing(path: str, *, folder: bool = False) -> Iterator[str]:
  """Yields a local temporary path (an empty folder if `folder`) to write into; when the block
  completes, it becomes `path`, or its files replace their namesakes in the existing folder
  `path`. On an exception nothing is left behind. Locally the temporary is a hidden sibling,
  renamed into place; for a URI it is uploaded file by file, each upload atomic by itself."""
  out = paths.path(path)
  if paths.is_uri(out):
    with tempfile.TemporaryDirectory() as local:
      temp = os.path.join(local, out.name)
      if folder:
        os.mkdir(temp)
      yield temp
      _upload(temp, out, folder)
    return
  parent = os.fspath(out.parent)
  created = next((f for f in reversed(list(paths.ancestors(out.parent))) if not f.exists()), None)
  os.makedirs(parent, exist_ok=True)
  prefix = _temporary_prefix(out.name)
  for stale in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + '*.tmp')):
    _remove(stale)  # of a write of this output that was killed
  temp = os.path.join(parent, f'{prefix}{secrets.token_hex(4)}.tmp')
  try:
    if folder:
      os.mkdir(temp)
    yield temp
    if not folder or not out.is_dir():
      os.replace(temp, out)
    else:
      for name in _files_in(temp):
        os.makedirs(os.path.dirname(out / name), exist_ok=True)
        os.replace(os.path.join(temp, name), out / name)
      shutil.rmtree(temp)
  except BaseException:
    _remove(temp)
    if created:
      shutil.rmtree(created, ignore_errors=True)
    raise


def _temporary_prefix(name: str) -> str:
  """How the hidden temporaries of the output `name` begin ('.hf.1a2b3c4d.'; a random token and
  '.tmp' follow): short enough for a name (NAME_MAX) whatever `name`'s length, and told apart
  from other outputs' by a digest of the whole name."""
  digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
  stem = os.fsencode(name)[:paths.NAME_MAX - 32].decode(errors='ignore')
  return f'.{stem}.{digest}.'


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)


def _upload(local: str, out: epath.Path, folder: bool) -> None:
  """Copies the local file or folder `local` to the URI `out`."""
  pairs = [(local, out)]
  if folder:
    pairs = [(os.path.join(local, name), out / name) for name in _files_in(local)]
  for source, target in pairs:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(source, 'rb') as f, target.open('wb') as g:
      shutil.copyfileobj(f, g)


def _files_in(folder: str) -> list[str]:
  """The files under a local folder, as paths relative to it."""
  return sorted(os.path.relpath(os.path.join(root, name), folder)
                for root, _, names in os.walk(folder) for name in names)


def is_jsonl_of(path: epath.Path, keys: Collection[str]) -> bool:
  """Whether every line of `path` is a JSON object with exactly `keys`."""
  try:
    with epath.Path(path).open() as f:
      return all(_is_object_of(line, keys) for line in f)
  except (OSError, UnicodeDecodeError):
    return False


def _is_object_of(line: str, keys: Collection[str]) -> bool:
  try:
    row = files.parse_json(line, 'a line')
  except ValueError:
    return False
  return isinstance(row, dict) and row.keys() == set(keys)


def is_npz_of(path: epath.Path, prefixes: tuple[str, ...]) -> bool:
  """Whether `path` is an .npz (a zip of .npy arrays) whose arrays' names all start with one of
  `prefixes`."""
  try:
    with epath.Path(path).open('rb') as f, zipfile.ZipFile(f) as archive:
      names = archive.namelist()
  except (OSError, zipfile.BadZipFile):
    return False
  return bool(names) and all(name.endswith('.npy') and name.startswith(prefixes)
                             for name in names)


def _listed(names) -> str:
  """'a', 'a and b', 'a, b and c'."""
  return ' and '.join([', '.join(names[:-1]), names[-1]] if len(names) > 2 else names)
