"""Local paths and `gs://` URIs alike. Every file of a workdir (checkpoints, config.json,
metrics.jsonl, TensorBoard events, the lock, a fine-tuning run's best/) is reached through
`path()`, an `etils.epath.Path`: the path type orbax itself takes, which speaks Cloud Storage
through TensorFlow's filesystems. `os.path` never sees a URI: `gs://b/run` made absolute would be
`./gs:/b/run` on local disk.
"""

import importlib
import os

from etils import epath


def is_uri(name: str | os.PathLike) -> bool:
  """Whether `name` is a URI such as gs://bucket/run rather than a local path."""
  return '://' in os.fspath(name)


def path(name: str | os.PathLike) -> epath.Path:
  """`name` as an epath.Path: a local path absolute and with links resolved (one name per
  place, and orbax needs absolute paths), a URI as given less a trailing '/'."""
  if is_uri(name):
    # TensorFlow's filesystems serve the URI: loaded as the pipeline loads it (quiet, off the
    # accelerators); only a run with a remote path imports it for this
    importlib.import_module('t5lite.data.tf_setup').load()
    return epath.Path(os.fspath(name).rstrip('/'))
  return epath.Path(os.path.realpath(name))


# Linux's limits, in bytes: of one name in a path (ext4, XFS, tmpfs...) and of a whole path.
NAME_MAX, PATH_MAX = 255, 4096


def check_name(name: str, flag: str) -> None:
  """Refuses a local path no file system here can hold (a name over NAME_MAX bytes, a path over
  PATH_MAX), before a command creates anything on the way to it."""
  if is_uri(name):
    return
  full = os.fsencode(os.path.abspath(name))
  longest = max(full.split(b'/'), key=len)
  if len(longest) > NAME_MAX:
    raise ValueError(f'{flag}={name}: a name in it is {len(longest)} bytes long; file names hold '
                     f'at most {NAME_MAX}')
  if len(full) >= PATH_MAX:
    raise ValueError(f'{flag}={name} is {len(full)} bytes long; paths hold at most {PATH_MAX - 1}')


def ancestors(place: epath.Path) -> list[epath.Path]:
  """`place` and each folder above it, up to the root, or up to the bucket of a URI."""
  chain = [place, *place.parents]
  if not is_uri(place):
    return chain
  return [p for p in chain if is_uri(p) and os.fspath(p).split('://', 1)[1]]


def within(inner: str | os.PathLike, outer: str | os.PathLike) -> bool:
  """Whether `inner` is `outer` or lies inside it."""
  inner, outer = os.fspath(path(inner)), os.fspath(path(outer))
  return inner == outer or inner.startswith(outer.rstrip('/') + '/')


def write_text(file: epath.Path, text: str) -> None:
  """Writes `file` whole or not at all, so a kill never leaves half of it: locally a temporary
  sibling renamed over it; on Cloud Storage one upload, which is atomic by itself."""
  if is_uri(file):
    file.write_text(text)
    return
  temporary = file.with_name(file.name + '.tmp')
  temporary.write_text(text)
  temporary.replace(file)
