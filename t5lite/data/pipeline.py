"""The input pipeline: `config.data` -> per-process batches of int32 numpy arrays, resumable.

  batches = make_pipeline(config.data, 'train', process_index=0, process_count=1, start=state)
  batch = next(batches)   # {'encoder_input_tokens': int32[b, inputs_length], ...}
  state = batches.state() # small JSON-able dict: the position after the last batch returned

In-memory sources ('bundled', files) are addressed by index. The split's documents are
tokenized once, concatenated without EOS between them (T5's `reduce_concat_tokens`) and cut
into N chunks of the objective's raw length, the cuts shifted by a random offset each epoch.
Global example i is chunk index_shuffle(i mod N) of epoch i // N, its noise seeded by (seed, i)
(so a chunk seen again in a later epoch is masked anew); global batch k is examples
[kB, (k+1)B), and process p computes only its slice [kB + pb, kB + (p+1)b). So batch k is a
function of (seed, k, data); the processes' batches together are the one-process batch;
resuming at batch k replays nothing: state {'batch': k}.

'tfds:' sources are streamed: each process reads its contiguous share of the records in file
order, in blocks of 128 documents that are concatenated (T5's `reduce_concat_tokens`), split
into chunks (a block's last chunk is shorter), noised and packed, block by block. The state
is a record offset, {'batch', 'block', 'row', 'process_index', 'process_count'}: a resumed
pipeline reads from that block's first record and skips `row` rows (at most one block of
replay). The trade-off: batches depend on the process count, documents are not shuffled beyond
the dataset's own order, and positions are per process (`start` accepts the list of them).

`data.objective` names the objective (t5lite/objectives/) that gives the raw length of a chunk,
the transform that noises it, the packed rows' lengths and the feature converter; both paths
use it alike, and every batch holds exactly the features it declares.

TensorFlow never sees an accelerator (see `t5lite/data/__init__.py`); tf.data runs on
`data.threads` threads per process.
"""

import atexit
import functools
import os
import weakref

import ml_collections
import numpy as np
from t5lite.data.tf_setup import tf

from t5lite import objectives
from t5lite.data import batches as batches_lib
from t5lite.data import packing
from t5lite.data import sources
from t5lite.data import vocabulary

DOCS_PER_BLOCK = 128  # T5's reduce_concat_tokens batch: documents concatenated before splitting
_ENDLESS = 1 << 62
_PACK_WINDOW = 256  # examples packed together; a block leaves one short chunk to pack
_POSITION_FEATURES = ('block', 'row')


class Pipeline:
  """An iterator of per-process batches that knows where it is: `state()` resumes it exactly."""

  def __init__(self, dataset: tf.data.Dataset, position: dict):
    self._batches = dataset.as_numpy_iterator()
    self._position = position
    _OPEN_PIPELINES.add(self)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    try:
      batch = next(self._batches)
    except tf.errors.InvalidArgumentError as error:  # the pipeline's own checks, e.g. no text
      raise ValueError(f'data: {error.message.strip().splitlines()[0]}') from None
    self._position['batch'] += 1
    if 'block' in batch:
      self._position.update(block=int(batch.pop('block')[-1]), row=int(batch.pop('row')[-1]) + 1)
    return batch

  def state(self) -> dict:
    return dict(self._position)

  def close(self):
    """Stops the tf.data threads (which may call Python: tokenization of streamed text)."""
    self._batches = None


_OPEN_PIPELINES = weakref.WeakSet()


@atexit.register
def _close_open_pipelines():
  """Closes pipelines before Python shuts down under their threads (it aborts or hangs else)."""
  for batches in list(_OPEN_PIPELINES):
    batches.close()


def make_pipeline(data: ml_collections.ConfigDict, split: str = 'train', *,
                  process_index: int, process_count: int,
                  start: int | dict | list = 0) -> Pipeline:
  """Batches of `split` ('train' | 'validation' | 'all') for process `process_index` of
  `process_count`, from `start` (runs reach it through `batches.make_batches`).

  `start` is a number of global batches already consumed, or a `state()` (for streamed
  sources, this process's state or the list of all processes' states). Raises ValueError with
  one line for anything in `data` that cannot work.
  """
  per_process = batches_lib.per_process_batch(data.batch_size, process_index, process_count)
  objective = objectives.get(data.objective)
  raw_length = objective.raw_length(data)
  vocab = vocabulary.load_vocabulary(data.vocabulary)
  streamed = data.source.startswith(sources.TFDS_PREFIX)
  position = _start_position(start, process_index, process_count, streamed)
  if streamed:
    rows = _streamed_rows(data, split, vocab, objective, raw_length, position)
  else:
    tokens = _split_tokens(data.source, data.text_key, data.vocabulary, split,
                           data.validation_fraction)
    examples = _indexed_examples(tokens, raw_length, data, per_process, process_index,
                                 position['batch'], objective.pairs)
    examples = objective.transform(examples, data, vocab)
    rows = examples.map(  # one example per row (only BART's inputs fall short of theirs)
        functools.partial(packing.pad_rows, lengths=objective.row_lengths(data)),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  batches = rows.batch(per_process, drop_remainder=True)
  return Pipeline(_model_features(batches, objective, data, per_process), position)


def _start_position(start, process_index: int, process_count: int, streamed: bool) -> dict:
  """The position to start from, checked against how this pipeline addresses its data."""
  start = batches_lib.own_position(start, process_index)
  position = {'batch': int(start['batch'])}
  if not streamed:
    return position
  if position['batch'] and 'block' not in start:
    raise ValueError('a tfds: source resumes from its pipeline state() (a record offset), '
                     'not from a batch number')
  if start.get('process_count', process_count) != process_count:
    raise ValueError(f'this tfds: position was saved by {start["process_count"]} processes; '
                     f'streamed sources resume on the same count, not {process_count}')
  position.update(block=int(start.get('block', 0)), row=int(start.get('row', 0)),
                  process_index=process_index, process_count=process_count)
  return position


@functools.lru_cache(maxsize=2)
def _tokenized_corpus(source: str, text_key: str, vocabulary_name: str):
  """(documents, their tokens) of an in-memory source: read and tokenized once per process."""
  documents, _ = sources.read_documents(source, text_key)
  return documents, vocabulary.load_vocabulary(vocabulary_name).encode_documents(documents)


@functools.lru_cache(maxsize=4)
def _split_tokens(source: str, text_key: str, vocabulary_name: str, split: str,
                  validation_fraction: float) -> np.ndarray:
  """All tokens of a split's documents, concatenated without EOS between documents."""
  documents, tokens = _tokenized_corpus(source, text_key, vocabulary_name)
  keep = sources.split_mask(documents, split, validation_fraction)
  if not keep.any():
    raise ValueError(f'the {split} split of {source!r} is empty; change '
                     f'data.validation_fraction={validation_fraction}')
  return np.concatenate([t for t, k in zip(tokens, keep) if k])


def _indexed_examples(tokens: np.ndarray, raw_length: int, data, per_process: int,
                      process_index: int, first_batch: int, pairs: bool = False) -> tf.data.Dataset:
  """This process's raw chunks from global batch `first_batch` on: {'targets', 'seed'}, and
  with `pairs` 'other': raw_length tokens from anywhere in the split."""
  chunks_per_epoch = len(tokens) // raw_length
  if chunks_per_epoch == 0:
    raise ValueError(f'the split has {len(tokens)} tokens, fewer than one example of '
                     f'{raw_length}; add text or change data.validation_fraction')
  slack = len(tokens) - chunks_per_epoch * raw_length  # room to shift the cuts each epoch
  tokens = tf.constant(tokens)
  example_key, epoch_key = tf.unstack(
      tf.random.experimental.stateless_split(tf.constant([data.seed, 0], tf.int64), 2))
  other_key = tf.constant([data.seed, 1], tf.int64)

  def example(n):
    # n counts this process's examples; i is the example's place in the global stream.
    i = n // per_process * data.batch_size + process_index * per_process + n % per_process
    shuffle_key, offset_key = tf.unstack(tf.random.experimental.stateless_split(
        tf.random.experimental.stateless_fold_in(epoch_key, i // chunks_per_epoch), 2))
    chunk = tf.random.experimental.index_shuffle(i % chunks_per_epoch, shuffle_key,
                                                 chunks_per_epoch - 1)
    offset = tf.random.stateless_uniform([], offset_key, 0, slack + 1, dtype=tf.int64)
    begin = offset + chunk * raw_length
    return _raw_example(tokens, begin, raw_length, (example_key, other_key), i, pairs)

  first = first_batch * per_process
  return tf.data.Dataset.range(first, _ENDLESS).map(
      example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _raw_example(tokens: tf.Tensor, begin, raw_length: int, keys, n, pairs: bool) -> dict:
  """Raw chunk `n` of a stream, from `begin`: {'targets', 'seed'}, its seed folded from n into
  keys[0]; with `pairs`, 'other': raw_length tokens from anywhere, placed by keys[1] and n."""
  example = {'targets': tokens[begin:begin + raw_length],
             'seed': tf.random.experimental.stateless_fold_in(keys[0], n)}
  if pairs:
    example['other'] = _random_window(tokens, raw_length,
                                      tf.random.experimental.stateless_fold_in(keys[1], n))
  return example


def _random_window(tokens: tf.Tensor, length: int, seed) -> tf.Tensor:
  """`length` consecutive tokens from a uniformly random place (all of them if fewer)."""
  last = tf.maximum(tf.size(tokens, tf.int64) - length, 0)
  begin = tf.random.stateless_uniform([], seed, 0, last + 1, dtype=tf.int64)
  return tokens[begin:begin + length]


def _streamed_rows(data, split: str, vocab, objective: objectives.Objective, raw_length: int,
                   position: dict) -> tf.data.Dataset:
  """Packed rows of this process's share of a TFDS split, from `position` on, with their place.

  Each row carries ('block', 'row'): the block of DOCS_PER_BLOCK records it came from (counted
  across epochs) and its index among that block's rows.
  """
  builder = sources.tfds_builder(data.source[len(sources.TFDS_PREFIX):], data.tfds_data_dir)
  read_split, hash_split = sources.tfds_split(builder, split)
  if hash_split == 'validation' and data.validation_fraction <= 0:
    raise ValueError('the validation split is empty: data.validation_fraction is 0')
  num_records = builder.info.splits[read_split].num_examples
  p, count = position['process_index'], position['process_count']
  first, last = num_records * p // count, num_records * (p + 1) // count
  blocks_per_epoch = -(-(last - first) // DOCS_PER_BLOCK)
  if not blocks_per_epoch:
    raise ValueError(f'{data.source} has {num_records} {read_split} records, too few for '
                     f'{count} processes')
  block = position['block'] % blocks_per_epoch

  def epoch_blocks(first_block):
    texts = sources.tfds_documents(builder, read_split, first + first_block * DOCS_PER_BLOCK,
                                   last, data.text_key)
    return texts.batch(DOCS_PER_BLOCK)

  blocks = epoch_blocks(block).concatenate(epoch_blocks(0).repeat())
  blocks = blocks.enumerate(start=position['block'])

  encode_block = _block_encoder(vocab)

  def tokenize(block_number, texts):
    if hash_split != 'all':
      keep = sources.in_validation(texts, data.validation_fraction) == (hash_split == 'validation')
      texts = tf.boolean_mask(texts, keep)
    tokens = tf.numpy_function(encode_block, [texts], tf.int32, stateful=False)
    return block_number, tf.ensure_shape(tokens, [None])

  blocks = blocks.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  blocks = _fail_on_endless_empty_blocks(blocks, blocks_per_epoch, data.source)
  block_rows = functools.partial(_block_rows, data=data, vocab=vocab, objective=objective,
                                 raw_length=raw_length)
  return blocks.flat_map(block_rows).skip(position['row'])


def _block_encoder(vocab):
  """numpy: one block's documents -> their tokens, concatenated without EOS between them."""
  def encode_block(texts: np.ndarray) -> np.ndarray:
    docs = [text.decode('utf-8', errors='replace') for text in texts]
    return np.concatenate([np.zeros([0], np.int32)] + vocab.encode_documents(docs))
  return encode_block


def _fail_on_endless_empty_blocks(blocks, blocks_per_epoch: int, source: str):
  """Stops a stream with no text anywhere (it would loop over empty epochs forever)."""
  def count(empty_run, block):
    block_number, tokens = block
    empty_run = (empty_run + 1) * tf.cast(tf.size(tokens) == 0, tf.int64)
    check = tf.debugging.Assert(empty_run <= blocks_per_epoch,
                                [f'{source}: no text in a whole epoch of this split'])
    with tf.control_dependencies([check]):
      return empty_run, (tf.identity(block_number), tokens)
  return blocks.scan(tf.constant(0, tf.int64), count)


def _block_rows(block_number, tokens, data, vocab, objective: objectives.Objective,
                raw_length: int) -> tf.data.Dataset:
  """One block's tokens -> raw chunks (the last shorter) -> the objective -> packed rows.

  Next-sentence pairs take whole chunks only, their 'other' text from the same block, a row each.
  """
  size = tf.size(tokens, tf.int64)
  num_chunks = size // raw_length if objective.pairs else (size + raw_length - 1) // raw_length
  block_key, other_key = (
      tf.random.experimental.stateless_fold_in(tf.constant([data.seed, k], tf.int64), block_number)
      for k in (0, 1))

  def chunk(c):
    return _raw_example(tokens, c * raw_length, raw_length, (block_key, other_key), c,
                        objective.pairs)

  examples = tf.data.Dataset.range(num_chunks).map(chunk)
  examples = objective.transform(examples, data, vocab)
  lengths = objective.row_lengths(data)
  rows = (examples.map(functools.partial(packing.pad_rows, lengths=lengths)) if objective.pairs
          else packing.pack(examples, lengths, window=_PACK_WINDOW))
  return rows.enumerate().map(lambda r, row: {**row, 'block': block_number, 'row': r})


def _model_features(batches: tf.data.Dataset, objective: objectives.Objective, data,
                    rows: int) -> tf.data.Dataset:
  """Packed batches -> the model's features, exactly those `objective.features` declares and in
  its shapes, prefetched, on a bounded thread pool."""
  declared = objective.features(data)

  def features(batch):
    out = objective.convert(batch)
    if out.keys() != declared.keys():
      raise AssertionError(f'{objective.name} makes features {sorted(out)}, and declares '
                           f'{sorted(declared)}')
    out = {name: tf.ensure_shape(value, [rows] + ([] if declared[name] is None
                                                  else [declared[name]]))
           for name, value in out.items()}
    out.update({k: batch[k] for k in _POSITION_FEATURES if k in batch})
    return out

  batches = batches.map(features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_fusion = True  # chunk + corrupt in one step: 2x faster
  threads = data.get('threads', 0)
  options.threading.private_threadpool_size = threads or max(1, (os.cpu_count() or 2) // 2)
  options.threading.max_intra_op_parallelism = 1
  return batches.prefetch(tf.data.AUTOTUNE).with_options(options)
