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
holds exactly the features it declares.

TensorFlow never sees an accelerator (see `t5lite/data/tf_setup.py`); tf.data runs on
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
from t5lite.data import packing
from t5lite.data import store
from t5lite.data import vocabulary

READ_EXAMPLES = 64  # examples whose tokens one call reads
_ENDLESS = 1 << 62


class Pipeline:
  """An iterator of per-process batches that knows where it is: `state()` resumes it exactly."""

  def __init__(self, dataset: tf.data.Dataset, first_batch: int):
    self._batches = dataset.as_numpy_iterator()
    self._batch = first_batch
    _OPEN_PIPELINES.add(self)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    try:
      batch = next(self._batches)
    except tf.errors.InvalidArgumentError as error:  # the pipeline's own checks
      raise ValueError(f'data: {error.message.strip().splitlines()[0]}') from None
    self._batch += 1
    return batch

  def state(self) -> dict:
    return {'batch': self._batch}

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
                  first_batch: int = 0) -> Pipeline:
  """Batches of `split` ('train' | 'validation' | 'all'): the rows `share` of each global batch,
  from global batch `first_batch` on. One ValueError line for anything in `data` that cannot
  work."""
  objective = objectives.get(data.objective)
  raw_length = objective.raw_length(data)
  vocab = vocabulary.load_vocabulary(data.vocabulary)
  tokens = store.split_tokens(data, split)
  examples = _indexed_examples(tokens, raw_length, data, share, first_batch, objective.pairs)
  examples = objective.transform(examples, data, vocab)
  rows = examples.map(  # one example per row (only BART's inputs fall short of theirs)
      functools.partial(packing.pad_rows, lengths=objective.row_lengths(data)),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  per_process = share.stop - share.start
  batches = rows.batch(per_process, drop_remainder=True)
  return Pipeline(_model_features(batches, objective, data, per_process), first_batch)


def _indexed_examples(tokens: store.Tokens, raw_length: int, data, share: slice,
                      first_batch: int, pairs: bool = False) -> tf.data.Dataset:
  """This process's raw chunks from global batch `first_batch` on: {'targets', 'seed'}, and
  with `pairs` 'other': raw_length tokens from a random place of the split."""
  chunks_per_epoch = tokens.size // raw_length
  if chunks_per_epoch == 0:
    raise ValueError(f'the split has {tokens.size} tokens, fewer than one example of '
                     f'{raw_length}; add text or change data.validation_fraction')
  slack = tokens.size - chunks_per_epoch * raw_length  # room to shift the cuts each epoch
  per_process = share.stop - share.start
  example_key, epoch_key = tf.unstack(
      tf.random.experimental.stateless_split(tf.constant([data.seed, 0], tf.int64), 2))
  other_key = tf.constant([data.seed, 1], tf.int64)

  def place(n):
    # n counts this process's examples; i is the example's place in the global stream.
    i = n // per_process * data.batch_size + share.start + n % per_process
    shuffle_key, offset_key = tf.unstack(tf.random.experimental.stateless_split(
        tf.random.experimental.stateless_fold_in(epoch_key, i // chunks_per_epoch), 2))
    chunk = tf.random.experimental.index_shuffle(i % chunks_per_epoch, shuffle_key,
                                                 chunks_per_epoch - 1)
    offset = tf.random.stateless_uniform([], offset_key, 0, slack + 1, dtype=tf.int64)
    example = {'targets': offset + chunk * raw_length,
               'seed': tf.random.experimental.stateless_fold_in(example_key, i)}
    if pairs:
      example['other'] = tf.random.stateless_uniform(
          [], tf.random.experimental.stateless_fold_in(other_key, i), 0,
          tokens.size - raw_length + 1, dtype=tf.int64)
    return example

  def read(examples):  # token windows in place of where they begin
    for name in ('targets', 'other') if pairs else ('targets',):
      windows = tf.numpy_function(lambda begins: tokens.windows(begins, raw_length),
                                  [examples[name]], tf.int32, stateful=False)
      examples[name] = tf.ensure_shape(windows, [None, raw_length])
    return examples

  first = first_batch * per_process
  return (tf.data.Dataset.range(first, _ENDLESS)
          .map(place, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
          .batch(READ_EXAMPLES)
          .map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
          .unbatch())


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
    return out

  batches = batches.map(features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_fusion = True  # chunk + corrupt in one step: 2x faster
  threads = data.get('threads', 0)
  options.threading.private_threadpool_size = threads or max(1, (os.cpu_count() or 2) // 2)
  options.threading.max_intra_op_parallelism = 1
  return batches.prefetch(tf.data.AUTOTUNE).with_options(options)
