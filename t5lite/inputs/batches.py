"""A config's batches, from whichever source: what training, evaluation and `t5lite data` read.

  batches = make_batches(config.data, 'train', start=state)
  batch = next(batches)   # {'encoder_input_tokens': int32[b, inputs_length], ...}
  state = batches.state() # {'batch': k, ...}: where a resumed run starts

`data.source='synthetic'` makes random tokens in the objective's exact features and shapes,
here and without TensorFlow (as MaxText's synthetic dataset): to measure a step, or to try a
config before its data is prepared. Every other source is text through the input pipeline
(t5lite/inputs/pipeline.py), the one place TensorFlow is imported.

Synthetic batch k is a function of (data.seed, split, k) alone, each row drawn from its own
generator, so that the processes' batches together are the one-process batch. Within a row,
every token is a random id past the special ones; a decoder reads its targets shifted right;
segment ids and loss weights are 1 (one example fills the row); token types and a prefix LM's
causal-attention mark split the row in half; a next-sentence label is a coin flip.
"""

import itertools
import zlib

import ml_collections
import numpy as np

from t5lite import files
from t5lite import objectives
from t5lite import outputs
from t5lite import paths
from t5lite.data import vocabulary
from t5lite.inputs import mixture
from t5lite.token_ids import PAD_ID, UNK_ID

SYNTHETIC = 'synthetic'
# The batches each rollback of a run dropped (t5lite/train/spikes.py), in its workdir:
# {"rollbacks": [{"step", "checkpoint", "batches": [first, end), "loss", "grad_norm"}, ..]}; the
# run, its resumes and `t5lite data --workdir` skip them.
SKIPPED_FILE = 'skipped_batches.json'

# Every model feature's name starts so (packing.py's converters), or is a mixture's `component`:
# how an earlier `data --out` is recognised.
_FEATURE_PREFIXES = ('encoder_', 'decoder_', 'next_sentence_', 'component')


def component_names(data: ml_collections.ConfigDict) -> tuple[str, ...]:
  """What a batch's `component` indexes: the mixture's component names, sorted
  ({'web', 'books'} -> ('books', 'web')); () where batches have no `component` (no mixture, or a
  fine-tuning task's batches, read from the task alone)."""
  if not data.get('mixture') or data.get('task'):
    return ()
  return tuple(sorted(data.mixture))


def make_batches(data: ml_collections.ConfigDict, split: str = 'train', *,
                 process_index: int | None = None, process_count: int | None = None,
                 start: int | dict | list = 0):
  """Batches of `split` ('train' | 'validation' | 'all') for process `process_index` of
  `process_count` (default: JAX's), from `start`: a number of global batches already consumed,
  or a `state()` (a checkpoint saves one per process, as a list). One ValueError line for what
  cannot work."""
  if process_index is None or process_count is None:
    import jax  # pylint: disable=import-outside-toplevel  # only to ask who we are
    process_index, process_count = jax.process_index(), jax.process_count()
  share = process_share(data.batch_size, process_index, process_count)
  position = own_position(start, process_index)
  if any(key != 'batch' and not mixture.is_position_key(key) for key in position):
    raise ValueError(f'this run saved its data position as {position} (a tfds: source streamed '
                     'by t5lite before 2026-11-26); start a new run from a token store '
                     '(t5lite prepare) or from the same source')
  if data.source != SYNTHETIC or data.get('mixture'):
    from t5lite.inputs import pipeline  # pylint: disable=import-outside-toplevel  # TensorFlow's
    return pipeline.make_pipeline(data, split, share=share, first_batch=position)
  objective = objectives.get(data.objective)
  objective.raw_length(data)  # the lengths' own checks, as for text
  return SyntheticBatches(objective.features(data),
                          vocabulary.load_vocabulary(data.vocabulary).vocab_size,
                          seed=(data.seed, zlib.crc32(split.encode())),
                          rows=range(share.start, share.stop),
                          batch_size=data.batch_size,
                          batch=position['batch'])


class SyntheticBatches:
  """Endless per-process batches of random tokens; see the module docstring."""

  def __init__(self, features: dict[str, int | None], vocab_size: int, *, seed: tuple,
               rows: range, batch_size: int, batch: int = 0):
    self._features, self._vocab_size, self._seed = features, vocab_size, seed
    self._rows, self._batch_size, self._batch = rows, batch_size, batch

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    first = self._batch * self._batch_size
    rows = [self._row(np.random.default_rng([*self._seed, first + r])) for r in self._rows]
    self._batch += 1
    return {name: np.stack([row[name] for row in rows]) for name in self._features}

  def _row(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    row = {}
    for name, length in self._features.items():
      if length is None:  # next_sentence_labels
        row[name] = rng.integers(0, 2, dtype=np.int32)
        continue
      side, kind = name.split('_', 1)
      positions = np.arange(length, dtype=np.int32)
      if kind == 'input_tokens':
        tokens = rng.integers(UNK_ID + 1, self._vocab_size, length, dtype=np.int32)
        row[f'{side}_target_tokens'] = tokens
        row[name] = (np.concatenate([np.full(1, PAD_ID, np.int32), tokens[:-1]])
                     if side == 'decoder' else tokens)
      elif kind in ('segment_ids', 'loss_weights'):
        row[name] = np.ones(length, np.int32)
      elif kind == 'positions':
        row[name] = positions
      elif kind == 'token_types':
        row[name] = (positions >= length // 2).astype(np.int32)
      elif kind == 'causal_attention':
        row[name] = (positions < length // 2).astype(np.int32)
      elif kind != 'target_tokens':  # made with its inputs
        raise ValueError(f'data.source={SYNTHETIC!r} cannot make the feature {name}')
    return {name: row[name] for name in self._features}

  def state(self) -> dict:
    return {'batch': self._batch}

  def close(self):
    pass


class SkippingBatches:
  """Batches that jump over ranges of global batch numbers, each [first, end): the batches a
  rollback dropped (t5lite/train/spikes.py). Batch k being a function of k, a run, its resumes
  and `t5lite data` read the same batches after a rollback, opened anew past each range by
  `open_batches(position)` (a batch number, or a `state()` with its batch replaced).

    ranges [(2, 5)]: the steps read batches 0, 1, 5, 6, ..."""

  def __init__(self, open_batches, start, ranges: list[tuple[int, int]]):
    self._open, self._ranges = open_batches, ranges
    self._batches = open_batches(start)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    position = self._batches.state()
    end = self._range_end(position['batch'])
    while end is not None:
      self._batches.close()
      position = dict(position, batch=end)
      self._batches = self._open(position)
      end = self._range_end(end)
    return next(self._batches)

  def _range_end(self, batch: int) -> int | None:
    return next((end for first, end in self._ranges if first <= batch < end), None)

  def state(self) -> dict:
    return self._batches.state()

  def close(self):
    self._batches.close()


def read_skipped(workdir: str) -> list[dict]:
  """The rollbacks recorded in `workdir` (none without SKIPPED_FILE), checked."""
  path = paths.path(workdir) / SKIPPED_FILE
  if not path.exists():
    return []
  rollbacks = files.read_json(path).get('rollbacks')
  files.check_type(rollbacks, list, f'{path}: rollbacks')
  for number, rollback in enumerate(rollbacks):
    where = f'{path}: rollbacks[{number}]'
    files.check_type(rollback, dict, where)
    first_end = rollback.get('batches')
    if not (isinstance(first_end, list) and len(first_end) == 2
            and all(type(b) is int for b in first_end) and 0 <= first_end[0] <= first_end[1]):
      raise ValueError(f'{where}: batches must be [first, end] batch numbers; correct or delete '
                       f'{path}')
  return rollbacks


def skipped_ranges(rollbacks: list[dict]) -> list[tuple[int, int]]:
  """The [first, end) batch numbers each rollback dropped."""
  return [tuple(rollback['batches']) for rollback in rollbacks]


def per_process_batch(batch_size: int, process_index: int, process_count: int) -> int:
  """Rows of each global batch that one process feeds; one line if the processes cannot share it."""
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} is not in [0, {process_count})')
  if batch_size < 1 or batch_size % process_count:
    raise ValueError(f'data.batch_size={batch_size} must be a positive multiple of the '
                     f'{process_count} processes')
  return batch_size // process_count


def process_share(batch_size: int, process_index: int, process_count: int) -> slice:
  """The rows of each global batch that one process feeds: 8 rows, process 1 of 2 -> [4:8]."""
  rows = per_process_batch(batch_size, process_index, process_count)
  return slice(process_index * rows, (process_index + 1) * rows)


def own_position(start: int | dict | list, process_index: int) -> dict:
  """This process's position to start from. Every batch iterator's `state()` is one JSON dict:
  `batch`, the global batches consumed, plus its own cursor (a mixture's schedule segment, a
  task's epoch and row); a checkpoint saves one per process, as a list. A number is a batch."""
  if isinstance(start, (list, tuple)):
    start = start[process_index]
  return {'batch': int(start)} if isinstance(start, (int, np.integer)) else dict(start)


def _data_section(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config.data` of a run's config, or the data section itself."""
  return config.data if 'data' in config else config


def skipping(open_batches, start, ranges: list[tuple[int, int]]):
  """`open_batches(start)`, past `ranges` of batch numbers if there are any (a run's
  rollbacks'); without, the batches themselves, which check no range at each step."""
  return SkippingBatches(open_batches, start, ranges) if ranges else open_batches(start)


def training_batches(data: ml_collections.ConfigDict, skipped: list[tuple[int, int]] = ()):
  """One process's view of all the global training batches, the `skipped` ranges left out."""
  def open_batches(start):
    return make_batches(data, 'train', process_index=0, process_count=1, start=start)
  return skipping(open_batches, 0, skipped)


def write_batches(config: ml_collections.ConfigDict, num_batches: int, out_path: str,
                  overwrite: bool = False, skipped: list[tuple[int, int]] = ()) -> None:
  """Saves the first `num_batches` global training batches, exactly as the train step gets them
  (past the `skipped` ranges of a run's rollbacks).

  np.savez with one array per feature, shaped [num_batches, batch_size, length], at `out_path`
  exactly (numpy would append .npz to a name without it). What may be replaced, and how the
  file is written whole or not at all: t5lite/outputs.py.
  """
  outputs.check_file(out_path, lambda path: outputs.is_npz_of(path, _FEATURE_PREFIXES),
                     overwrite=overwrite)
  batches = training_batches(_data_section(config), skipped)
  first = [next(batches) for _ in range(num_batches)]
  with outputs.writing(out_path) as temp, open(temp, 'wb') as f:
    np.savez(f, **{name: np.stack([b[name] for b in first]) for name in first[0]})


def show_examples(config: ml_collections.ConfigDict, k: int,
                  skipped: list[tuple[int, int]] = ()) -> str:
  """The first `k` training examples as text, masks and sentinels visible, as the model sees
  them (past the `skipped` ranges); after what a token store holds and was prepared from."""
  data = _data_section(config)
  vocab = vocabulary.load_vocabulary(data.vocabulary)
  batches = training_batches(data, skipped)
  summary = []
  if data.source != SYNTHETIC:
    from t5lite.data import store  # pylint: disable=import-outside-toplevel  # TensorFlow's
    if store.is_store(data.source):
      summary.append(store.open_store(data.source).summary())
    if data.get('mixture'):
      summary.append(mixture.describe(data))
  return '\n'.join(summary + [
      f'example {n} ({len(inputs)} input tokens, {len(targets)} target tokens)\n'
      f'  inputs:  {vocab.decode(inputs)}\n  targets: {vocab.decode(targets)}'
      for n, (inputs, targets) in enumerate(itertools.islice(_examples(batches), k))])


def _examples(batches):
  """(inputs, targets) tokens of each example of packed batches, in order.

  Targets are the tokens with loss (MLM: the selected ones); inputs are what the model reads
  besides: the encoder's tokens, or a decoder-only model's prefix (none for a causal LM).
  """
  for batch in batches:
    side = 'encoder' if 'encoder_target_tokens' in batch else 'decoder'
    targets, weights = batch[f'{side}_target_tokens'], batch[f'{side}_loss_weights']
    segments = batch[f'{side}_segment_ids']
    if 'encoder_input_tokens' in batch:
      inputs, input_segments = batch['encoder_input_tokens'], batch['encoder_segment_ids']
    else:
      inputs, input_segments = targets, np.where(weights == 0, segments, 0)
    for row in range(len(targets)):
      for segment in range(1, segments[row].max() + 1):
        yield (inputs[row][input_segments[row] == segment],
               targets[row][(segments[row] == segment) & (weights[row] > 0)])
