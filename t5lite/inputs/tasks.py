"""Text-to-text tasks for fine-tuning: (input, target) texts -> packed, resumable batches.

`data.task` names the task:
- 'sentiment': the bundled movie-review sentences (bundled/PROVENANCE.md) as classification in
  text, made from the raw `id, score, text` TSV by `sentiment_examples`: sentences with
  |score| < 0.5 dropped, input 'sentiment: ' + text, target 'positive' (score > 0) or
  'negative'. Held out: every sentence whose id is a multiple of 10. That leaves 9,065 to train
  (49.5% positive) and 1,007 held out (50.5% positive).
- a `.tsv` file (a header line naming the tab-separated columns; no quoting) or a `.jsonl`
  file (one object per line), input and target under `data.inputs_key` / `data.targets_key`.
  Held out: the examples whose input text hashes into `data.validation_fraction` (the stable
  hash `sources.in_validation` uses for documents), so duplicates of an input share a split.

A missing column, a blank line or an empty input is one ValueError line naming file and line.
Inputs and targets are tokenized with EOS appended and cut to `data.inputs_length` /
`data.targets_length` (EOS kept last; one warning line counts the cut ones), then packed
several to a row (`packing.pack`), as T5 packs fine-tuning examples.

Training rows: each epoch takes the examples in its own order, a permutation seeded by
(data.seed, epoch), and packs them; global batches run on through the epochs' rows, so global
batch k is a function of (seed, k, task) and `state()` = {'batch', 'epoch', 'row'} resumes
exactly without replay. Held-out rows are packed once in file order; the last batch is padded
with empty rows, which count for nothing.
"""

import dataclasses
import functools
import importlib.resources
from typing import NamedTuple

from absl import logging
import ml_collections
import numpy as np
from t5lite.data.tf_setup import tf

from t5lite import files
from t5lite import paths
from t5lite.data import packing
from t5lite.data import sources
from t5lite.data import vocabulary
from t5lite.inputs import batches

SENTIMENT = 'sentiment'
SENTIMENT_FILE = 'movie_review_sentiment.tsv'
SENTIMENT_PREFIX = 'sentiment: '
SENTIMENT_MIN_SCORE = 0.5  # |mean rating| below this is too close to neutral to label
_PACK_WINDOW = 1024  # examples packed together


class Example(NamedTuple):
  inputs: str
  targets: str


def read_records(name: str, text: str, keys: tuple[str, ...]) -> list[tuple[int, tuple]]:
  """(line number, values of `keys`) of each line of a .tsv (with header) or .jsonl text.

  'id\\tinput\\ttarget\\n7\\tgreat film\\tpositive\\n', keys ('input', 'target')
  -> [(2, ('great film', 'positive'))]. Trailing blank lines are ignored; anything else that
  is not a complete record raises ValueError naming the file and the line.
  """
  lines = text.replace('\r\n', '\n').rstrip('\n').split('\n')
  if not any(lines):
    raise ValueError(f'{name} holds no examples')
  if name.endswith('.tsv'):
    header, first = lines[0].split('\t'), 2
    missing = [k for k in keys if k not in header]
    if missing:
      raise ValueError(f'{name}:1: no column {missing[0]!r} in the header (it has '
                       f'{", ".join(header)}); name the columns with --inputs_key/--targets_key')
    columns, lines = [header.index(k) for k in keys], lines[1:]
  elif name.endswith('.jsonl'):
    first = 1
  else:
    raise ValueError(f'{name}: a task file is .tsv or .jsonl')
  records = []
  for number, line in enumerate(lines, first):
    if not line.strip():
      raise ValueError(f'{name}:{number}: blank line')
    if name.endswith('.tsv'):
      fields = line.split('\t')
      if len(fields) != len(header):
        raise ValueError(f'{name}:{number}: {len(fields)} tab-separated fields, the header '
                         f'has {len(header)}')
      values = tuple(fields[c] for c in columns)
    else:
      values = _json_values(name, number, line, keys)
    records.append((number, values))
  if not records:
    raise ValueError(f'{name} holds no examples')
  return records


def _json_values(name: str, number: int, line: str, keys: tuple[str, ...]) -> tuple:
  record = files.parse_json(line, f'{name}:{number}')
  if not isinstance(record, dict):
    raise ValueError(f'{name}:{number}: not a JSON object')
  for key in keys:
    if not isinstance(record.get(key), str):
      raise ValueError(f'{name}:{number}: no text under {key!r}')
  return tuple(record[k] for k in keys)


def sentiment_examples() -> dict[str, list[Example]]:
  """The bundled sentiment task's train and validation examples (see the module docstring)."""
  raw = importlib.resources.files('t5lite.data').joinpath(f'bundled/{SENTIMENT_FILE}')
  splits = {'train': [], 'validation': []}
  for _, (id_, score, text) in read_records(SENTIMENT_FILE, raw.read_text('utf-8'),
                                            ('id', 'score', 'text')):
    if abs(float(score)) >= SENTIMENT_MIN_SCORE:
      split = 'validation' if int(id_) % 10 == 0 else 'train'
      label = 'positive' if float(score) > 0 else 'negative'
      splits[split].append(Example(SENTIMENT_PREFIX + text, label))
  return splits


def file_examples(path: str, inputs_key: str, targets_key: str,
                  validation_fraction: float) -> dict[str, list[Example]]:
  """A .tsv/.jsonl task file's examples, held out by a stable hash of the input text."""
  if not paths.path(path).exists():
    raise FileNotFoundError(f'data.task: no such file {path!r} (or name a bundled task: '
                            f'{SENTIMENT})')
  records = read_records(path, files.read_text(path, 'data.task'), (inputs_key, targets_key))
  for number, (inputs, targets) in records:
    if not inputs.strip():
      raise ValueError(f'{path}:{number}: empty input')
    if not targets.strip():
      raise ValueError(f'{path}:{number}: empty target')
  examples = [Example(*values) for _, values in records]
  held_out = sources.in_validation([e.inputs for e in examples], validation_fraction)
  return {'train': [e for e, h in zip(examples, held_out) if not h],
          'validation': [e for e, h in zip(examples, held_out) if h]}


@functools.lru_cache(maxsize=4)
def load_examples(task: str, inputs_key: str = 'input', targets_key: str = 'target',
                  validation_fraction: float = 0.1) -> dict[str, list[Example]]:
  """{'train': [...], 'validation': [...]} of a bundled task name or a task file."""
  if task == SENTIMENT:
    return sentiment_examples()
  return file_examples(task, inputs_key, targets_key, validation_fraction)


def tokenize(examples: list[Example], vocab: vocabulary.Vocabulary, lengths: dict[str, int],
             name: str) -> dict[str, list[np.ndarray]]:
  """{'inputs': [...], 'targets': [...]} int32 ids with EOS, cut to `lengths` (EOS kept last)."""
  tokens = {}
  for key, length in lengths.items():
    encoded = vocab.encode_documents([getattr(e, key) for e in examples])
    cut = sum(len(ids) + 1 > length for ids in encoded)
    if cut:
      logging.warning('%s: %d of %d %s are longer than data.%s_length=%d tokens with EOS and '
                      'were truncated', name, cut, len(encoded), key, key, length)
    tokens[key] = [np.append(ids[:length - 1], vocabulary.EOS_ID).astype(np.int32)
                   for ids in encoded]
  return tokens


def pack_examples(tokens: dict[str, list[np.ndarray]], order: np.ndarray,
                  lengths: dict[str, int]) -> dict[str, np.ndarray]:
  """The examples `order` picks, packed in that order -> the model's features [rows, length]."""
  ragged = {key: tf.RaggedTensor.from_row_lengths(
      np.concatenate([tokens[key][i] for i in order]), [len(tokens[key][i]) for i in order])
            for key in lengths}
  rows = packing.pack(tf.data.Dataset.from_tensor_slices(ragged), lengths, window=_PACK_WINDOW)
  rows = rows.batch(len(order)).get_single_element()  # every row at once: one epoch is small
  return {k: v.numpy() for k, v in packing.encoder_decoder_features(rows).items()}


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: its epochs are cached
class Task:
  """One split of a task, tokenized: what its batches are made of."""
  tokens: dict[str, list[np.ndarray]]
  lengths: dict[str, int]
  seed: int

  @property
  def num_examples(self) -> int:
    return len(self.tokens['inputs'])

  @functools.lru_cache(maxsize=4)  # a pipeline reads an epoch, its successor, and a resumed one
  def epoch_rows(self, epoch: int) -> dict[str, np.ndarray]:
    """Training rows of `epoch`: the examples in the order seeded by (seed, epoch), packed."""
    order = np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
    return pack_examples(self.tokens, order, self.lengths)


def load_split(data: ml_collections.ConfigDict, split: str) -> Task:
  """The `split` ('train' | 'validation') of `data.task`, tokenized with `data.vocabulary`."""
  examples = load_examples(data.task, data.inputs_key, data.targets_key,
                           data.validation_fraction)[split]
  if not examples:
    raise ValueError(f'the {split} split of task {data.task!r} is empty; change '
                     f'data.validation_fraction={data.validation_fraction}')
  lengths = {'inputs': data.inputs_length, 'targets': data.targets_length}
  vocab = vocabulary.load_vocabulary(data.vocabulary)
  return Task(tokenize(examples, vocab, lengths, f'task {data.task} ({split})'), lengths,
              data.seed)


class TaskPipeline:
  """This process's share of global batches of a task's training rows, resumable by `state()`."""

  def __init__(self, task: Task, batch_size: int, process_index: int, process_count: int,
               start: int | dict | list = 0):
    self._task, self._batch_size = task, batch_size
    self._share = batches.process_share(batch_size, process_index, process_count)
    start = batches.own_position(start, process_index)
    if 'epoch' in start:
      self._position = {k: int(start[k]) for k in ('batch', 'epoch', 'row')}
    else:  # a batch number: walk the epochs' rows up to it
      self._position = {'batch': 0, 'epoch': 0, 'row': 0}
      self._take(start['batch'] * batch_size)
      self._position['batch'] = start['batch']

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rows = self._take(self._batch_size)
    self._position['batch'] += 1
    return {name: np.concatenate([part[name] for part in rows])[self._share] for name in rows[0]}

  def _take(self, count: int) -> list[dict[str, np.ndarray]]:
    """The next `count` rows (across epochs), as slices of epochs; advances the position."""
    parts, position = [], self._position
    while count:
      rows = self._task.epoch_rows(position['epoch'])
      available = len(rows['encoder_input_tokens']) - position['row']
      taken = min(count, available)
      parts.append({k: v[position['row']:position['row'] + taken] for k, v in rows.items()})
      count -= taken
      position['row'] += taken
      if taken == available:
        position['epoch'], position['row'] = position['epoch'] + 1, 0
    return parts

  def state(self) -> dict:
    return dict(self._position)


def validation_batches(task: Task, batch_size: int, process_index: int,
                       process_count: int) -> list[dict[str, np.ndarray]]:
  """This process's share of every global batch of the held-out rows, packed in file order."""
  rows = pack_examples(task.tokens, np.arange(task.num_examples), task.lengths)
  count = -(-len(rows['encoder_input_tokens']) // batch_size)  # global batches, rounded up
  share = batches.process_share(batch_size, process_index, process_count)
  padded = {k: np.pad(v, [(0, count * batch_size - len(v)), (0, 0)]) for k, v in rows.items()}
  return [{k: v[b * batch_size:(b + 1) * batch_size][share] for k, v in padded.items()}
          for b in range(count)]
