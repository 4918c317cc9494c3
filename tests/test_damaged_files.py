"""Every kind of file t5lite reads, damaged at random, through the real command (issue #29).

For each kind (KINDS), a valid file of a tiny world made once (a trained run, its Hugging Face
export, a corpus and its token store, a task, prompts) is copied into a fresh case folder and
damaged by Hypothesis
(`damages`): cut at any byte, bits flipped, emptied, other bytes, saved as UTF-16, blank lines
added, for JSON a value replaced by one of another type or null, or nested 100,000 deep, or a
folder or a FIFO in its place. Then the command that reads it runs in this process (`cli.main`,
stderr captured at the file descriptor), and must either succeed (exit 0: the damage was harmless,
e.g. a blank line in metrics.jsonl) or refuse with exit status 2 and exactly one stderr line that
names the file, leaving the case folder byte for byte as it was (tests/fs.py's SHA-256 snapshot).

Profiles: `make test` runs the fast one, each kind's `examples` (about 440 in all), derandomized so
that every run tries the same ones. The long one runs T5LITE_FUZZ_SCALE times as many, from a
fresh seed each time (Hypothesis prints a failing example and how to reproduce it):

  T5LITE_FUZZ_SCALE=25 .venv/bin/python -m pytest -q tests/test_damaged_files.py
"""

import functools
import gzip
import json
import lzma
import os
import shutil
import signal
import tempfile
from typing import Callable, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t5lite import cli
from tests.fs import changes, snapshot
from tests.test_cli_mistakes import CONFIGS, TINY_FINETUNE, TINY_RUN, in_this_process
from tests.texts import keyword_task, random_corpus

SCALE = int(os.environ.get('T5LITE_FUZZ_SCALE', '1'))  # above 1: the long profile
SECONDS_PER_COMMAND = 120  # a command that takes longer is blocked (on a FIFO, say)
DEEP = 100_000  # JSON nesting
STORE_PART = 'part-00000-of-00001'  # the world's token store has one part
BUNDLED_VOCABULARY = os.path.join(os.path.dirname(cli.__file__), 'data', 'bundled', 'vocab.model')


@pytest.fixture(scope='module')
def world(tmp_path_factory) -> str:
  """A folder of the valid files every case copies from: a run at step 1 (TINY_RUN on the
  corpus: its checkpoint, config.json and metrics.jsonl), its Hugging Face export, the corpus as
  .txt, .txt.xz and .jsonl.gz and as a token store, a task as .tsv and .jsonl, prompts, and a
  SentencePiece model."""
  base = tmp_path_factory.mktemp('damage_world')
  text = random_corpus(base / 'corpus.txt')
  raw = (base / 'corpus.txt').read_bytes()
  (base / 'corpus.txt.xz').write_bytes(lzma.compress(raw))
  (base / 'corpus.jsonl.gz').write_bytes(gzip.compress(b''.join(
      json.dumps({'text': doc}).encode() + b'\n' for doc in raw.decode().split('\n\n'))))
  keyword_task(base / 'task.tsv', 40)
  (base / 'task.jsonl').write_text(''.join(
      json.dumps(dict(zip(('input', 'target'), line.split('\t')))) + '\n'
      for line in (base / 'task.tsv').read_text().splitlines()[1:]))
  (base / 'prompts.jsonl').write_text('{"input": "the sea <extra_id_0> ship"}\n'
                                      '{"input": "a letter"}\n')
  shutil.copy(BUNDLED_VOCABULARY, base / 'vocab.model')
  assert cli.main(['prepare', f'--source={text}', f'--out={base / "store"}']) == 0
  assert cli.main(['train', f'--workdir={base / "run"}', *TINY_RUN, f'--config.data.source={text}',
                   '--config.checkpoint.every_steps=1']) == 0
  assert cli.main(['export', f'--workdir={base / "run"}', f'--out={base / "hf"}']) == 0
  modes = {os.stat(base / 'hf' / name).st_mode for name in os.listdir(base / 'hf')}
  assert len(modes) == 1, 'the export\'s files have different modes'
  return str(base)


@pytest.fixture(scope='module')
def tokenizer_json(world) -> None:
  """Adds hf_json to the world: the export with the tokenizer.json transformers saves in place of
  spiece.model (transformers is slow to import: only the kind that reads it asks for this)."""
  import transformers  # pylint: disable=import-outside-toplevel
  hf, hf_json = os.path.join(world, 'hf'), os.path.join(world, 'hf_json')
  shutil.copytree(hf, hf_json)
  transformers.AutoTokenizer.from_pretrained(hf).save_pretrained(hf_json)
  os.remove(os.path.join(hf_json, 'spiece.model'))


class Case(NamedTuple):
  """One example's folder: copies of the world's files, one of them damaged."""
  folder: str

  def path(self, name: str) -> str:
    return os.path.join(self.folder, name)

  @property
  def new(self) -> str:
    """A workdir or output that does not exist."""
    return self.path('new')


class Kind(NamedTuple):
  """A kind of file: where it is in a case folder, the command that reads it, how it parses."""
  name: str
  file: str  # relative to the case folder
  argv: Callable[[Case], list[str]]
  copies: tuple[str, ...]  # what of the world the case folder holds
  form: str = 'bytes'  # bytes | json (one value) | jsonl (one per line) | compressed
  examples: int = 20  # in the fast profile: fewer where a harmless damage trains or decodes
  # What the line may name instead of the file: a path of the case, for a damage that leaves the
  # file readable but at odds with the rest of its folder (a config.json of another model than
  # the checkpoints' is named by the workdir), or words (a setting a later check refuses)
  or_names: str = ''
  or_says: str = ''


def resume(steps: int) -> Callable[[Case], list[str]]:
  return lambda c: ['train', f'--workdir={c.path("run")}', f'--config.train.steps={steps}']


def import_hf(folder: str) -> Callable[[Case], list[str]]:
  return lambda c: ['import-hf', f'--hf={c.path(folder)}', f'--workdir={c.new}']


def tokenizer(file: str) -> Callable[[Case], list[str]]:
  return lambda c: ['tokenizer', f'--input={c.path(file)}', '--vocab_size=30', f'--out={c.new}']


def finetune(task: str) -> Callable[[Case], list[str]]:
  return lambda c: ['finetune', f'--workdir={c.new}', f'--from={c.path("run")}',
                    f'--task={c.path(task)}', *TINY_FINETUNE]


def show_data(source: str, vocabulary: str = '') -> Callable[[Case], list[str]]:
  """`t5lite data --show=1` of TINY_RUN's data from `source`, with `vocabulary` if given."""
  return lambda c: ['data', f'--config={CONFIGS}/t5_tiny.py', '--show=1',
                    '--config.data.batch_size=8', '--config.data.inputs_length=32',
                    '--config.data.targets_length=8', f'--config.data.source={c.path(source)}',
                    *([f'--config.data.vocabulary={c.path(vocabulary)}'] if vocabulary else [])]


def verify(store: str) -> Callable[[Case], list[str]]:
  return lambda c: ['data', f'--verify={c.path(store)}']


RUN, HF, TEXT = ('run',), ('hf',), ('corpus.txt',)
KINDS = [
    # a workdir's own files: train resumed at its step reads config.json (nothing to train); a
    # mesh that does not fit the devices is named by its settings (mesh.dcn_fsdp=3 ...,
    # config.mesh.rules.batch=...), checked where the devices are known
    Kind('workdir-config', 'run/config.json', resume(1), RUN, 'json', 40, or_names='run',
         or_says='mesh.'),
    Kind('workdir-metrics', 'run/metrics.jsonl', resume(2), RUN, 'jsonl', 2),
    # another digest, still 64 hex digits: named by the workdir, as another vocabulary is
    Kind('workdir-vocabulary', 'run/vocabulary.json', resume(1), RUN, 'json', 20, or_names='run'),
    # its checkpoint's files that orbax reads as JSON (the line names the checkpoint)
    Kind('checkpoint-metadata', 'run/checkpoints/1/_CHECKPOINT_METADATA', resume(1), RUN, 'json',
         6, or_names='run/checkpoints'),
    Kind('checkpoint-config', 'run/checkpoints/1/config/metadata', resume(1), RUN, 'json', 6,
         or_names='run/checkpoints'),
    Kind('checkpoint-data-position', 'run/checkpoints/1/data/metadata', resume(2), RUN, 'json', 2,
         or_names='run/checkpoints'),
    # a Hugging Face folder, imported
    Kind('hf-config', 'hf/config.json', import_hf('hf'), HF, 'json'),
    Kind('hf-safetensors', 'hf/model.safetensors', import_hf('hf'), HF, examples=40),
    Kind('hf-spiece', 'hf/spiece.model', import_hf('hf'), HF, examples=6),
    Kind('hf-tokenizer-json', 'hf_json/tokenizer.json', import_hf('hf_json'), ('hf_json',),
         'json', 4),
    # text, as tokenizer input and as data.source
    Kind('text-txt', 'corpus.txt', tokenizer('corpus.txt'), TEXT, examples=60),
    Kind('text-txt-xz', 'corpus.txt.xz', tokenizer('corpus.txt.xz'), ('corpus.txt.xz',),
         'compressed', 60),
    Kind('text-jsonl-gz', 'corpus.jsonl.gz', show_data('corpus.jsonl.gz'), ('corpus.jsonl.gz',),
         'compressed', 60),
    Kind('vocabulary', 'vocab.model', show_data('corpus.txt', 'vocab.model'),
         ('vocab.model', 'corpus.txt'), examples=30),
    # a token store, read by a run, and read whole
    Kind('store-manifest', f'store/{STORE_PART}.json', show_data('store'), ('store',), 'json', 40),
    Kind('store-train', f'store/{STORE_PART}.train', verify('store'), ('store',), examples=30),
    Kind('store-validation', f'store/{STORE_PART}.validation', verify('store'), ('store',),
         examples=10),
    Kind('store-checksums', f'store/{STORE_PART}.train.crc32c', verify('store'), ('store',),
         examples=20, or_names=f'store/{STORE_PART}.train'),  # the file it checks, and it
    # fine-tuning tasks and infer's inputs
    Kind('task-tsv', 'task.tsv', finetune('task.tsv'), (*RUN, 'task.tsv'), examples=6),
    Kind('task-jsonl', 'task.jsonl', finetune('task.jsonl'), (*RUN, 'task.jsonl'), 'jsonl', 2),
    Kind('infer-inputs', 'prompts.jsonl', lambda c: ['infer', f'--workdir={c.path("run")}',
                                                     f'--input_file={c.path("prompts.jsonl")}',
                                                     '--max_decode_length=2'],
         (*RUN, 'prompts.jsonl'), 'jsonl', 2),
]


# A value of each JSON type: what replaces a value of another type
OTHER_VALUES = [None, True, 7, 4.5, -1, '256', [], {}]


def json_paths(value, prefix=()) -> list[tuple]:
  """Every place in a parsed JSON value, as the keys and indices that reach it."""
  places = [prefix]
  if isinstance(value, dict):
    for key, item in value.items():
      places += json_paths(item, (*prefix, key))
  elif isinstance(value, list):
    for index, item in enumerate(value[:50]):  # tokenizer.json's 8,100 pieces: the first few
      places += json_paths(item, (*prefix, index))
  return places


def replaced(value, place: tuple, new):
  """`value` with what is at `place` replaced by `new`."""
  if not place:
    return new
  copy = dict(value) if isinstance(value, dict) else list(value)
  copy[place[0]] = replaced(value[place[0]], place[1:], new)
  return copy


@st.composite
def json_damage(draw, text: str) -> bytes:
  """A JSON text with a value replaced by one of another type (null too), or nested deep."""
  value = json.loads(text)
  place = draw(st.sampled_from(json_paths(value)))
  here = functools.reduce(lambda node, key: node[key], place, value)
  if draw(st.booleans()):
    new = draw(st.sampled_from([v for v in OTHER_VALUES if type(v) is not type(here)]))
    return json.dumps(replaced(value, place, new)).encode()
  nested = json.dumps(replaced(value, place, '@'))
  return nested.replace('"@"', '[' * DEEP + ']' * DEEP).encode()


@st.composite
def damages(draw, raw: bytes, form: str):
  """('bytes', the damaged file's bytes) or ('folder' | 'fifo', None): what replaces the file."""
  how = draw(st.sampled_from(
      ['cut', 'flip', 'empty', 'garbage', 'utf16', 'blank_lines', 'folder', 'fifo']
      + (['json', 'json'] if form in ('json', 'jsonl') else [])))
  if how in ('folder', 'fifo'):
    return how, None
  if how == 'cut':
    return 'bytes', raw[:draw(st.integers(0, len(raw) - 1))]
  if how == 'flip':
    damaged = bytearray(raw)
    head = min(len(raw), 4096)  # where the headers and most of the structure are
    for _ in range(draw(st.integers(1, 8))):
      at = draw(st.integers(0, head - 1) | st.integers(0, len(raw) - 1))
      damaged[at] ^= 1 << draw(st.integers(0, 7))
    return 'bytes', bytes(damaged)
  if how == 'empty':
    return 'bytes', b''
  if how == 'garbage':
    return 'bytes', draw(st.binary(min_size=1, max_size=512))
  if how == 'utf16':
    return 'bytes', raw.decode('latin-1').encode('utf-16')
  if how == 'blank_lines':
    lines = raw.split(b'\n')
    for _ in range(draw(st.integers(1, 3))):
      lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from([b'', b'  ', b'\r'])))
    return 'bytes', b'\n'.join(lines)
  if form == 'json':
    return 'bytes', draw(json_damage(raw.decode()))
  lines = raw.decode().split('\n')  # jsonl: one line's value
  number = draw(st.integers(0, len(lines) - 2))
  lines[number] = draw(json_damage(lines[number])).decode()
  return 'bytes', '\n'.join(lines).encode()


def place_damage(path: str, damage) -> None:
  """Puts the damaged file (or a folder, or a FIFO) at `path`."""
  what, raw = damage
  os.remove(path)
  if what == 'folder':
    os.mkdir(path)
  elif what == 'fifo':
    os.mkfifo(path)
  else:
    with open(path, 'wb') as f:
      f.write(raw)


class Blocked(BaseException):
  """A command ran for SECONDS_PER_COMMAND: not an Exception, so no handler swallows it."""


def run_blocking(argv: list[str], capfd) -> tuple[int, str]:
  """(exit status, stderr) of `cli.main(argv)`; Blocked if it does not finish in time."""
  def stop(*_):
    raise Blocked(f't5lite {" ".join(argv)} ran for {SECONDS_PER_COMMAND} s')
  previous = signal.signal(signal.SIGALRM, stop)
  signal.alarm(SECONDS_PER_COMMAND)
  try:
    return in_this_process(argv, capfd)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def make_case(world: str, root: str, kind: Kind) -> Case:
  """A fresh folder with copies of what of the world `kind` needs."""
  case = Case(tempfile.mkdtemp(dir=root))
  for name in kind.copies:
    source = os.path.join(world, name)
    (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, case.path(name))
  return case


@pytest.mark.parametrize('kind', KINDS, ids=[kind.name for kind in KINDS])
def test_a_damaged_file_is_refused_in_one_line_naming_it_or_harmless(world, tmp_path, capfd,
                                                                     request, kind):
  if 'hf_json' in kind.copies:
    request.getfixturevalue('tokenizer_json')

  @settings(max_examples=kind.examples * SCALE, derandomize=SCALE == 1,
            database=None, deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(data=st.data())
  def check(data):
    case = make_case(world, str(tmp_path), kind)
    path = case.path(kind.file)
    with open(path, 'rb') as f:
      raw = f.read()
    place_damage(path, data.draw(damages(raw, kind.form), label='damage'))
    argv = kind.argv(case)
    before = snapshot(case.folder)
    status, err = run_blocking(argv, capfd)
    lines = err.splitlines()
    if status == 0:  # harmless: the command did its work
      assert 'Traceback' not in err, err[-4000:]
    else:
      assert (status, len(lines)) == (2, 1), (
          f't5lite {" ".join(argv)}\nexit status {status}, {len(lines)} stderr lines:\n'
          f'{err[-4000:]}')
      names = [path] + [case.path(kind.or_names)] * bool(kind.or_names) + [kind.or_says] * bool(
          kind.or_says)
      assert any(name in lines[0] for name in names), f'the line names none of {names}: {lines[0]}'
      after = snapshot(case.folder)
      assert after == before, f'{case.folder} changed: {changes(before, after)}'
    shutil.rmtree(case.folder)

  check()
