"""The input pipeline: a split's tokens -> the objective's batches of int32 numpy arrays.

  batches = make_pipeline(config.data, 'train', share=slice(0, 8), first_batch=0)
  batch = next(batches)   # {'encoder_input_tokens': int32[8, inputs_length], ...}
  state = batches.state() # {'batch': k}: the global batches consumed, where a resume starts

Runs reach it through `batches.make_batches`, which gives the rows `share` of each global batch
that this process feeds. The split's tokens (t5lite/data/store.py: a token store, or any other
source tokenized in memory) are the split's documents concatenated without EOS between them
(T5's `reduce_concat_tokens`), cut into N chunks of the objective's raw length, the cuts shifted
by a random offset each epoch. Global example i is chunk index_shuffle(i mod N) of epoch i // N,
its noise seeded by (seed, i) (so a chunk seen again in a later epoch is masked anew); global
batch k is examples [kB, (k+1)B), and a process computes only its share of them. So batch k is a
function of (seed, k, tokens); the processes' batches together are the one-process batch; a
resume at batch k replays nothing; and reading is random access, by windows of READ_EXAMPLES
examples, whatever the size of the tokens.

`data.objective` names the objective (t5lite/objectives/) that gives the raw length of a chunk,
the transform that noises it, the packed rows' lengths and the feature converter; every batch
holds exactly the features it declares. A single source is `_source_rows`: global row r is
example r of its one stream. A mixture (`_mixture_batches`; its schedule is
t5lite/inputs/mixture.py's) builds the same chain over several streams, and only which stream
and example a row is changes (`_scheduled` in place of `_single_stream`): one chain of tf.data
ops per objective and settings, each row from the chain of its component, in the schedule's
order. Settings an objective lets vary row by row (its `row_settings`: span corruption's noise
and mode) do not split a chain: each chunk carries its stream's values. So corpora mixed under
one objective are one chain, and UL2's seven denoisers two (six span corruptions, one prefix
LM). The run's objective converts them all, so every component must make its features
(`mixture.components`).

TensorFlow never sees an accelerator (see `t5lite/data/tf_setup.py`); tf.data runs on
`data.threads` threads per process.
"""

import atexit
import functools
import os
import re
import weakref
import zlib

from absl import logging
import ml_collections
import numpy as np
from t5lite.data.tf_setup import parallel_map, plain, tf

from t5lite import objectives
from t5lite.data import packing
from t5lite.data import store
from t5lite.data import vocabulary
from t5lite.inputs import mixture
from t5lite.token_ids import PAD_ID

READ_EXAMPLES = 512  # examples whose tokens one call reads
ROW_BLOCK = 1024  # rows located at a time
_ENDLESS = 1 << 62


class Pipeline:
  """An iterator of per-process batches that knows where it is: `state()` resumes it exactly."""

  def __init__(self, dataset: tf.data.Dataset, first_batch: int, segment: dict):
    self._batches = dataset.as_numpy_iterator()
    self._batch, self._segment = first_batch, segment
    _OPEN_PIPELINES.add(self)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    try:
      batch = next(self._batches)
    except tf.errors.InvalidArgumentError as error:  # the pipeline's own checks, and the
      first = error.message.strip().splitlines()[0]  # ValueErrors of its Python (a damaged store)
      raised = re.search(r'\bValueError: (.*)', first)
      raise ValueError(raised[1] if raised else f'data: {first}') from None
    self._batch += 1
    return batch

  def state(self) -> dict:
    return {'batch': self._batch, **self._segment}

  def close(self):
    """Stops the tf.data threads (which may call Python: reading a store's tokens)."""
    self._batches = None


_OPEN_PIPELINES = weakref.WeakSet()


@atexit.register
def _close_open_pipelines():
  """Closes pipelines before Python shuts down under their threads (it aborts or hangs else)."""
  for batches in list(_OPEN_PIPELINES):
    batches.close()


def make_pipeline(data: ml_collections.ConfigDict, split: str = 'train', *, share: slice,
                  first_batch: int | dict = 0) -> Pipeline:
  """Batches of `split` ('train' | 'validation' | 'all'): the rows `share` of each global batch,
  from global batch `first_batch` (or a position: {'batch', and a mixture's segment}) on. One
  ValueError line for anything in `data` that cannot work."""
  position = first_batch if isinstance(first_batch, dict) else {'batch': first_batch}
  vocab = vocabulary.load_vocabulary(data.vocabulary)
  per_process = share.stop - share.start
  if data.get('mixture'):
    batches, segment = _mixture_batches(data, split, vocab, share, position)
    resume = segment.position()
  else:
    batches = _source_rows(data, split, vocab, share, position['batch']).batch(
        per_process, drop_remainder=True)
    resume = {}
  return Pipeline(_model_features(batches, objectives.get(data.objective), data, per_process),
                  position['batch'], resume)


def _source_rows(data: ml_collections.ConfigDict, split: str, vocab, share: slice,
                 first_batch: int) -> tf.data.Dataset:
  """One source's packed rows, from global batch `first_batch` on: global row r is example r of
  its stream, noised by data.objective."""
  objective = objectives.get(data.objective)
  objectives.check_reads(data, objectives.set_mode(data), objective, 'data')
  examples = _indexed_examples([_stream(data, objective, split)], data, share, first_batch,
                               objective.pairs)
  return _noised_rows(examples, data, objective, vocab)


def _stream(data: ml_collections.ConfigDict, objective: objectives.Objective, split: str,
            name: str = '') -> '_Stream':
  """`data`'s split cut into `objective`'s chunks; one line naming mixture component `name`
  (data's one source if '') for a source that cannot give one."""
  where = f'data.mixture.{name}' if name else ''
  try:
    raw_length = objective.raw_length(data)
    tokens = store.split_tokens(data, split)
  except (ValueError, FileNotFoundError) as error:
    if not name:
      raise
    raise ValueError(f'{where}: {str(error).removeprefix("data.source: ")}') from None
  if tokens.size < raw_length:
    raise ValueError(f'{where + ": " if name else ""}the {split} split has {tokens.size} tokens, '
                     f'fewer than one example of {raw_length}; add text or change '
                     'data.validation_fraction' + (f' ({tokens.skipped})' if tokens.skipped else ''))
  if tokens.skipped and split != 'validation':  # once a source, and only when it is taken
    logging.warning('%s: %s', where or 'data.source', tokens.skipped)
  # A component's random choices are keyed by its name; a single source's as before mixtures.
  return _Stream(tokens, raw_length, objective.row_values(data),
                 [data.seed, 2 * zlib.crc32(name.encode()) if name else 0])


def _noised_rows(examples: tf.data.Dataset, data: ml_collections.ConfigDict,
                 objective: objectives.Objective, vocab) -> tf.data.Dataset:
  """Raw chunks -> `objective`'s examples, an example per packed row (only BART's inputs fall
  short of their row)."""
  return parallel_map(objective.transform(examples, data, vocab),
                      functools.partial(packing.pad_rows, lengths=objective.row_lengths(data)))


def _mixture_batches(data: ml_collections.ConfigDict, split: str, vocab, share: slice,
                     position: dict) -> tuple[tf.data.Dataset, mixture.Segment]:
  """A mixture's batches from `position` on, each row's component beside them, and the schedule
  segment in force: a chain per group of its components (`_groups`), each row from its
  component's chain, in the schedule's order."""
  mixture.check_rule(data)
  first_batch, per_process = position['batch'], share.stop - share.start
  segment = mixture.resumed_segment(mixture.component_weights(data), position,
                                    first_batch * data.batch_size)
  groups = _groups(mixture.components(data))
  chains = []
  for group in groups:
    streams = [_stream(view, objective, split, name) for _, (name, view, objective) in group]
    _, (_, view, objective) = group[0]
    examples = _indexed_examples(streams, view, share, first_batch, objective.pairs,
                                 _scheduled(segment, [index for index, _ in group]))
    chains.append(_noised_rows(examples, view, objective, vocab))
  group_of = np.zeros(len(segment.schedule.names), np.int64)  # each component's group
  for g, group in enumerate(groups):
    group_of[[index for index, _ in group]] = g
  rows = chains[0] if len(chains) == 1 else tf.data.Dataset.choose_from_datasets(
      chains, _row_blocks(share, first_batch, data.batch_size).map(
          plain(lambda rows: tf.gather(group_of, _locate(segment, rows)[0]))).unbatch())
  components = tf.data.Dataset.range(first_batch, _ENDLESS).map(plain(  # a batch's at a time
      lambda k: _locate(segment, k * data.batch_size + share.start + tf.range(
          per_process, dtype=tf.int64))[0]))
  batches = tf.data.Dataset.zip(rows.batch(per_process, drop_remainder=True), components).map(
      plain(lambda batch, component: {**batch, 'component': component}))
  return batches, segment


def _groups(components: list) -> list[list[tuple[int, tuple]]]:
  """The components (index, (name, data, objective)) grouped by objective and the settings of it
  that are not row settings: a group shares one tf.data chain (a chain per component costs a
  mixture a quarter of its rate)."""
  groups = {}
  for index, (name, view, objective) in enumerate(components):
    key = (objective.name, *(repr(view[setting]) for setting in objective.settings
                             if setting not in objective.row_settings))
    groups.setdefault(key, []).append((index, (name, view, objective)))
  return list(groups.values())


def _scheduled(segment: mixture.Segment, members: list[int]):
  """Global rows -> (stream, example number) for the chain of mixture components `members`, by
  `segment`'s schedule: a component's stream is its place in `members`, -1 another chain's."""
  stream_of = tf.constant([members.index(c) if c in members else -1
                           for c in range(len(segment.schedule.names))], tf.int64)

  def locate(rows):
    component, example = _locate(segment, rows)
    return tf.gather(stream_of, component), example

  return locate


def _locate(segment: mixture.Segment, row):
  """(component, its example number) of global row `row` (or of each of a vector of rows): the
  schedule's lookup, in TF."""
  schedule = segment.schedule
  position = (row - segment.start) % schedule.cycle
  component = tf.gather(tf.constant(schedule.component, tf.int64), position)
  example = (tf.gather(tf.constant(segment.examples), component)
             + (row - segment.start) // schedule.cycle * tf.gather(
                 tf.constant(schedule.rows), component)
             + tf.gather(tf.constant(schedule.rank), position))
  return component, example


def _single_stream(rows):
  """Global rows -> (stream, example number) for a single source: row r is its example r."""
  return tf.zeros_like(rows), rows


class _Stream:
  """One source's tokens cut into chunks of `raw_length`, the values of its objective's
  `row_settings` its chunks carry, and the keys of its random choices."""

  def __init__(self, tokens: store.Tokens, raw_length: int, row_values: dict, seed: list):
    self.tokens, self.size, self.raw_length = tokens, tokens.size, raw_length
    self.row_values = row_values
    self.chunks = tokens.size // raw_length
    self.slack = tokens.size - self.chunks * raw_length  # room to shift the cuts each epoch
    self.example_key, self.epoch_key = tf.unstack(
        tf.random.experimental.stateless_split(tf.constant(seed, tf.int64), 2))
    self.other_key = tf.constant([seed[0], seed[1] + 1], tf.int64)


def _row_blocks(share: slice, first_batch: int, batch_size: int) -> tf.data.Dataset:
  """The global rows this process feeds, from batch `first_batch` on, ROW_BLOCK at a time
  (int64[ROW_BLOCK]: ops on vectors, as a mixture's every component looks up every row)."""
  per_process = share.stop - share.start

  def block(first):
    n = first + tf.range(ROW_BLOCK, dtype=tf.int64)
    return n // per_process * batch_size + share.start + n % per_process

  return tf.data.Dataset.range(first_batch * per_process, _ENDLESS, ROW_BLOCK).map(plain(block))


def _indexed_examples(streams: list[_Stream], data, share: slice, first_batch: int,
                      pairs: bool = False, locate=_single_stream) -> tf.data.Dataset:
  """This process's raw chunks from global batch `first_batch` on: {'targets', 'seed', the
  stream's row values}, and with `pairs` 'other': a chunk's length of tokens from a random
  place of the split. `locate` says which stream and example each global row is: a single
  source's, or a mixture's by its schedule (`_scheduled`)."""
  chain = _Chain(streams, pairs, locate)
  located = _row_blocks(share, first_batch, data.batch_size).map(plain(chain.located)).unbatch()
  return parallel_map(parallel_map(located, chain.place).batch(READ_EXAMPLES),
                      chain.read).unbatch()


class _Chain:
  """The streams of one tf.data chain, their values stacked so that a row's are looked up on
  vectors, and the three steps from a global row to its chunk: `located` (its stream and example
  number), `place` (where its chunk begins, and its seed), `read` (the tokens)."""

  def __init__(self, streams: list[_Stream], pairs: bool, locate):
    self.streams, self.pairs, self.locate = streams, pairs, locate

    def stacked(attribute):
      return tf.stack([tf.cast(getattr(s, attribute), tf.int64) for s in streams])

    tables = ((name, _row_value_table([s.row_values[name] for s in streams]))
              for name in streams[0].row_values)
    self.values = {name: table for name, table in tables if table is not None}
    self.raw_lengths = stacked('raw_length')
    self.per_stream = {'chunks': stacked('chunks'), 'slack': stacked('slack'),
                       'raw_length': self.raw_lengths, 'epoch_key': stacked('epoch_key'),
                       'example_key': stacked('example_key'), **self.values,
                       **({'size': stacked('size'), 'other_key': stacked('other_key')}
                          if pairs else {})}
    self.longest = max(s.raw_length for s in streams)
    self.ragged = any(s.raw_length != self.longest for s in streams)

  def located(self, rows):
    """A block of rows, kept where they are one of this chain's streams: each one's stream s, the
    example's place i in it, and what `place` needs of the stream, looked up on vectors (row by
    row, these lookups cost every pipeline, a single source's too, about 4% of its rate:
    docs/notes/input-pipeline.md)."""
    s, i = self.locate(rows)
    kept = s >= 0
    i, s = tf.boolean_mask(i, kept), tf.boolean_mask(s, kept)
    return {'i': i, 's': s,
            **{name: tf.gather(table, s) for name, table in self.per_stream.items()}}

  def place(self, row):
    """The chunk of example i of stream s: chunk index_shuffle(i mod N) of epoch i // N, the
    epoch's cuts shifted by a random offset; its seed; with pairs, a random other place."""
    i, s, count = row['i'], row['s'], row['chunks']
    shuffle_key, offset_key = tf.unstack(tf.random.experimental.stateless_split(
        tf.random.experimental.stateless_fold_in(row['epoch_key'], i // count), 2))
    chunk = tf.random.experimental.index_shuffle(i % count, shuffle_key, count - 1)
    offset = tf.random.stateless_uniform([], offset_key, 0, row['slack'] + 1, dtype=tf.int64)
    example = {'targets': tf.stack([s, offset + chunk * row['raw_length']]),
               'seed': tf.random.experimental.stateless_fold_in(row['example_key'], i),
               **{name: row[name] for name in self.values}}
    if self.pairs:
      example['other'] = tf.stack([s, tf.random.stateless_uniform(
          [], tf.random.experimental.stateless_fold_in(row['other_key'], i), 0,
          row['size'] - row['raw_length'] + 1, dtype=tf.int64)])
    return example

  def read(self, examples):
    """Token windows in place of (stream, where they begin), a batch of examples at a time."""
    for name in ('targets', 'other') if self.pairs else ('targets',):
      windows = tf.ensure_shape(tf.numpy_function(self.read_windows, [examples[name]], tf.int32,
                                                  stateful=False), [None, self.longest])
      examples[name] = (tf.RaggedTensor.from_tensor(
          windows, lengths=tf.gather(self.raw_lengths, examples[name][:, 0]))
                        if self.ragged else windows)
    return examples

  def read_windows(self, places: np.ndarray) -> np.ndarray:
    """int64[n, 2] of (stream, begin) -> int32[n, longest], 0-padded."""
    if len(self.streams) == 1:
      return self.streams[0].tokens.windows(places[:, 1], self.longest)
    windows = np.zeros((len(places), self.longest), np.int32)
    for s in np.unique(places[:, 0]):
      rows, length = places[:, 0] == s, self.streams[s].raw_length
      windows[rows, :length] = self.streams[s].tokens.windows(places[rows, 1], length)
    return windows


def _row_value_table(values: list) -> tf.Tensor | None:
  """The streams' values of one row setting, stacked: float32 [streams], or token ids int32
  [streams, the most ids] padded with PAD_ID (so a chain's rows batch as one shape); None for
  ids no stream has (no stream has a mode)."""
  if not isinstance(values[0], list):
    return tf.constant(values, tf.float32)
  longest = max(len(ids) for ids in values)
  if not longest:
    return None
  return tf.constant([ids + [PAD_ID] * (longest - len(ids)) for ids in values], tf.int32,
                     shape=[len(values), longest])


def _model_features(batches: tf.data.Dataset, objective: objectives.Objective, data,
                    rows: int) -> tf.data.Dataset:
  """Packed batches -> the model's features, exactly those `objective.features` declares and in
  its shapes, prefetched, on a bounded thread pool."""
  declared = objective.features(data)

  def features(batch):
    component = batch.pop('component', None)  # a mixture's: each row's, kept beside
    out = objective.convert(batch)
    if out.keys() != declared.keys():
      raise AssertionError(f'{objective.name} makes features {sorted(out)}, and declares '
                           f'{sorted(declared)}')
    out = {name: tf.ensure_shape(value, [rows] + ([] if declared[name] is None
                                                  else [declared[name]]))
           for name, value in out.items()}
    if component is not None:
      out['component'] = tf.cast(component, tf.int32)
    return out

  batches = parallel_map(batches, features)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_fusion = True  # chunk + corrupt in one step: 2x faster
  threads = data.get('threads', 0) or max(1, (os.cpu_count() or 2) // 2)
  options.threading.private_threadpool_size = threads
  options.threading.max_intra_op_parallelism = 1
  # No tuning: every parallel map runs on the whole pool (the most tuning would give it), and no
  # iterator times each element for the tuner, which cost UL2's seven denoisers a tenth of their
  # rate per CPU-second (docs/notes/input-pipeline.md).
  options.autotune.enabled = False
  options.autotune.initial_parallelism = threads
  return batches.prefetch(tf.data.AUTOTUNE).with_options(options)
