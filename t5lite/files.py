"""The one boundary where t5lite reads a user's file: text sources, tasks, infer inputs, workdir
and Hugging Face configs, metrics.jsonl, safetensors, vocabularies. Whatever is wrong with the
file (a folder or a FIFO in its place, unreadable, cut short or not what its `.gz` or `.xz` name
says, not UTF-8, not JSON, nested too deep, a JSON value of the wrong type) becomes one ValueError
line that names the file, and the line where there is one (a missing file: FileNotFoundError);
nothing else escapes.

  raw = files.read_bytes(path, 'data.source')   # decompressed by its suffix
  text = files.read_text(path, '--input_file')  # UTF-8
  saved = files.read_json(path)                 # a JSON object
  row = files.parse_json(line, f'{path}:3')     # one line of a .jsonl file
  files.check_schema(saved, {'size': COUNT}, str(path))  # every field's type and value
  size = files.file_size(path)                  # of a regular file, in bytes

`flag` is what named the file to the user ('data.source', '--input'); messages start with it.
"""

import gzip
import json
import lzma
import os
import stat
import zlib
from typing import Any, Callable, NamedTuple

from t5lite import paths

# suffix -> decompress(bytes) and the errors of bytes that are not such a file, or cut short
COMPRESSIONS = {'.gz': (gzip.decompress, (EOFError, OSError, zlib.error)),
                '.xz': (lzma.decompress, (EOFError, lzma.LZMAError))}
JSON_TYPES = {dict: 'an object', list: 'an array', str: 'a string', bool: 'true or false',
              int: 'an integer', float: 'a number', type(None): 'null'}


def named(name, flag: str = '') -> str:
  """'data.source: /a/b.txt' or '/a/b.txt': how messages name a file."""
  return f'{flag}: {name}' if flag else str(name)


def check_file(name, flag: str = '') -> None:
  """Refuses `name` unless it is a regular file (or a symlink to one): reading a FIFO would block
  for ever, and a folder or a device is no file of data."""
  file_size(name, flag)


def file_size(name, flag: str = '') -> int:
  """The size in bytes of the regular file `name`, refused as `check_file` says."""
  file = paths.path(name)
  if paths.is_uri(file):
    if file.is_dir():
      raise ValueError(f'{named(name, flag)} is a folder, not a file')
    if not file.exists():
      raise FileNotFoundError(f'{named(name, flag)}: no such file')
    return file.stat().length
  try:
    status = os.stat(file)
  except FileNotFoundError:
    raise FileNotFoundError(f'{named(name, flag)}: no such file') from None
  except OSError as error:
    raise ValueError(f'{named(name, flag)} cannot be read ({error.strerror})') from None
  if stat.S_ISDIR(status.st_mode):
    raise ValueError(f'{named(name, flag)} is a folder, not a file')
  if not stat.S_ISREG(status.st_mode):
    raise ValueError(f'{named(name, flag)} is not a regular file (a FIFO, socket or device)')
  return status.st_size


def read_bytes(name, flag: str = '') -> bytes:
  """The bytes of the regular file `name`, decompressed if its name ends in a COMPRESSIONS
  suffix."""
  check_file(name, flag)
  try:
    raw = paths.path(name).read_bytes()
  except OSError as error:
    raise ValueError(f'{named(name, flag)} cannot be read ({error.strerror or error})') from None
  suffix = os.path.splitext(os.fspath(name))[1]
  if suffix not in COMPRESSIONS:
    return raw
  decompress, errors = COMPRESSIONS[suffix]
  try:
    return decompress(raw)
  except errors as error:
    raise ValueError(f'{named(name, flag)} is not a complete {suffix} file ({error})') from None


def read_text(name, flag: str = '') -> str:
  """The UTF-8 text of `name` (decompressed as `read_bytes` does)."""
  return decode(read_bytes(name, flag), named(name, flag))


def decode(raw: bytes, where: str) -> str:
  """`raw` as UTF-8; refuses other encodings naming the line of the first bad byte."""
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError as error:
    line = raw[:error.start].count(b'\n') + 1
    raise ValueError(f'{where}:{line}: not UTF-8 text (byte {raw[error.start]:#04x}); save it as '
                     'UTF-8') from None


def parse_json(text: str, where: str) -> Any:
  """The JSON value of `text`; `where` names it in the message ('/a/config.json', '/a/x.jsonl:3')."""
  try:
    return json.loads(text)
  except json.JSONDecodeError as error:
    raise ValueError(f'{where} is not JSON ({error.msg} at line {error.lineno} column '
                     f'{error.colno})') from None
  except RecursionError:
    raise ValueError(f'{where} is JSON nested too deep to read') from None


def read_json(name, flag: str = '') -> dict:
  """The JSON object in the file `name` (configs, indexes, tokenizer.json are all objects)."""
  value = parse_json(read_text(name, flag), named(name, flag))
  check_type(value, dict, named(name, flag))
  return value


def check_type(value, expected: type | tuple[type, ...], where: str) -> None:
  """Refuses a parsed JSON `value` that is not of type `expected` (an int is a float too, true is
  not an int)."""
  expected = expected if isinstance(expected, tuple) else (expected,)
  allowed = expected + (int,) if float in expected else expected
  if isinstance(value, bool) and bool not in expected or not isinstance(value, allowed):
    wanted = ' or '.join(JSON_TYPES.get(t, t.__name__) for t in expected)
    raise ValueError(f'{where} is {JSON_TYPES.get(type(value), type(value).__name__)}, '
                     f'not {wanted}')


class Field(NamedTuple):
  """A JSON value of type `kind` for which `valid(value)` holds; `wanted` says what that is."""
  kind: type | tuple[type, ...]
  valid: Callable[[Any], bool]
  wanted: str


COUNT = Field(int, lambda n: n >= 0, 'a count (an integer, at least 0)')


def check_schema(value, schema, where: str) -> None:
  """Refuses a parsed JSON `value` unlike `schema`, in one line naming the first field that
  differs ('/s/part.json: tokens.train is -3, not a count ...'). A schema is a type (see
  `check_type`), a Field, a dict of the keys an object must have (others are let be), or a
  one-item list: an array of such items.

    check_schema(manifest, {'dtype': Field(str, DTYPES.__contains__, "'<u2' or '<u4'"),
                            'tokens': {'train': COUNT}, 'inputs': [str]}, str(path))
  """
  _check_value(value, schema, where, '')


def _check_value(value, schema, where: str, field: str) -> None:
  named_field = f'{where}: {field}' if field else where
  if isinstance(schema, dict):
    check_type(value, dict, named_field)
    for key, item in schema.items():
      inner = f'{field}.{key}' if field else key
      if key not in value:
        raise ValueError(f'{where} has no {inner!r}')
      _check_value(value[key], item, where, inner)
  elif isinstance(schema, list):
    check_type(value, list, named_field)
    for index, item in enumerate(value):
      _check_value(item, schema[0], where, f'{field}[{index}]')
  elif isinstance(schema, Field):
    check_type(value, schema.kind, named_field)
    if not schema.valid(value):
      raise ValueError(f'{named_field} is {_shown(value)}, not {schema.wanted}')
  else:
    check_type(value, schema, named_field)


def _shown(value) -> str:
  """A value as a message shows it: short, whatever its size."""
  text = json.dumps(value)
  return text if len(text) <= 40 else f'{text[:37]}...'
