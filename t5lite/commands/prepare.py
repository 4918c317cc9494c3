"""`t5lite prepare`: tokenize a corpus once into a token store (t5lite/data/store.py).

  t5lite prepare --source='corpus/*.jsonl.zst' --out=/data/store
  t5lite prepare --source='gs://b/c4/*.json.gz' --out=gs://b/store --num_shards=32 --shard_index=$i

It streams: whatever the corpus, memory holds a few batches of documents and their tokens. A
thread reads and hashes documents while SentencePiece encodes the previous ones on `workers`
threads (`--vocabulary=bytes` stores the UTF-8 bytes themselves: no model, one byte a token). Part i of N takes the source's inputs (files, or a TFDS dataset's file shards) [i*n/N,
(i+1)*n/N) in order, so the parts in order hold the corpus in order and need no merge pass: run
them on N machines at once (a SLURM array, the workers of a TPU VM slice) or one after another.

A part is the unit of a restart, and of safety (t5lite/data/store_writer.py): one run at a time
writes it, and its files take their places only when it is complete, so that a refused or
interrupted run leaves the store as it was. A killed part run again starts over, replacing what
the killed run left; a part that is complete is refused unless --overwrite.
"""

import collections
import time

from t5lite.data import sources
from t5lite.data import store
from t5lite.data import store_writer
from t5lite.data import vocabulary as vocabulary_lib

_PROGRESS_EVERY_S = 1.0


def prepare(source: str, out: str, *, vocabulary: str = 'bundled', text_key: str = 'text',
            validation_fraction: float = 0.05, tfds_data_dir: str = '', workers: int = 0,
            num_shards: int = 1, shard_index: int = 0, overwrite: bool = False,
            max_bad_fraction: float = sources.MAX_BAD_FRACTION,
            progress=None) -> tuple[dict, sources.Skipped]:
  """Writes part `shard_index` of `num_shards` of the store `out`; returns its manifest and what
  reading the source skipped.

  Every check runs before anything is written: one ValueError line for a bad setting, a source
  that cannot be read (or a file of it with more than `max_bad_fraction` of its lines
  malformed), or an --out that is no place for this part. `progress`: a text stream for a
  progress line (documents, tokens, tokens/s, ETA), or None.
  """
  if not 0 <= validation_fraction < 1:
    raise ValueError(f'--validation_fraction={validation_fraction} must be in [0, 1)')
  if not 0 <= shard_index < num_shards:
    raise ValueError(f'--shard_index={shard_index} must be in [0, --num_shards={num_shards})')
  if workers < 0:
    raise ValueError(f'--workers={workers} must be at least 0 (0: every core)')
  skipped = sources.Skipped(max_bad_fraction=max_bad_fraction)
  vocab = vocabulary_lib.load_vocabulary(vocabulary, flag='--vocabulary')
  every_input = sources.inputs(source, text_key, tfds_data_dir, flag='--source')
  if num_shards > len(every_input):
    raise ValueError(f'--num_shards={num_shards}: --source has {len(every_input)} input(s) '
                     '(files, or TFDS file shards) to share; give at most that many shards')
  first = len(every_input) * shard_index // num_shards
  mine = every_input[first:len(every_input) * (shard_index + 1) // num_shards]
  part = store.part_name(shard_index, num_shards)
  manifest = {
      'format': store.FORMAT, 'part': part,
      'dtype': vocab.store_dtype.str,
      'vocabulary': vocab.identity(vocabulary),
      'source': source, 'text_key': text_key, 'validation_fraction': validation_fraction,
      'inputs': [item.name for item in mine],
      'checksums': {'algorithm': 'crc32c', 'block_bytes': store.BLOCK_BYTES}}
  store_writer.check_out(out, manifest, num_shards, overwrite)

  where = f'part {shard_index} of {num_shards} of {out}'
  documents, tokens = collections.Counter(), collections.Counter()
  meter = _Progress(progress, part, len(mine))
  with store_writer.PartWriter(out, part, where) as writer:
    store_writer.check_out(out, manifest, num_shards, overwrite)  # again, now that no other run can write it
    for chunk in store.tokenize(mine, vocab, validation_fraction, skipped, workers=workers):
      for split, split_tokens, count in zip(store.SPLITS, chunk[:2], chunk.documents):
        writer.write(split, split_tokens.tobytes())
        documents[split] += count
        tokens[split] += split_tokens.size
      meter.update(sum(documents.values()), sum(tokens.values()), chunk.inputs_done)
    meter.close()
    if not sum(tokens.values()):
      raise ValueError(f'--source {source!r} holds no text in part {shard_index} of '
                       f'{num_shards} ({skipped.line()})')
    if not tokens['train']:
      raise ValueError(f'--validation_fraction={validation_fraction} held out all '
                       f'{documents["validation"]:,} documents of part {shard_index} of '
                       f'{num_shards}, which would have no train tokens; give a smaller one')
    manifest.update(documents={s: documents[s] for s in store.SPLITS},
                    tokens={s: tokens[s] for s in store.SPLITS},
                    skipped=dict(sorted(skipped.items())))
    writer.publish(manifest)
  return manifest, skipped


class _Progress:
  """One line, rewritten in place about once a second: documents, tokens, tokens/s, ETA (by the
  inputs read, of this part's)."""

  def __init__(self, stream, part: str, num_inputs: int):
    self._stream, self._part, self._num_inputs = stream, part, num_inputs
    self._start = self._shown = time.monotonic()
    self._width = 0

  def update(self, documents: int, tokens: int, inputs_done: tuple[float, int]) -> None:
    now = time.monotonic()
    if self._stream is None or now - self._shown < _PROGRESS_EVERY_S:
      return
    self._shown, elapsed = now, now - self._start
    done = inputs_done[0] / max(inputs_done[1], 1)
    eta = _duration((1 - done) * elapsed / done) if done else '?'
    line = (f'{self._part}: {documents:,} documents, {tokens:,} tokens, '
            f'{tokens / elapsed:,.0f} tokens/s, {inputs_done[0]:.1f}/{inputs_done[1]} inputs, '
            f'ETA {eta}')
    self._stream.write('\r' + line.ljust(self._width))
    self._stream.flush()
    self._width = len(line)

  def close(self) -> None:
    if self._stream is not None and self._width:
      self._stream.write('\n')
      self._stream.flush()


def _duration(seconds: float) -> str:
  return (f'{seconds:.0f} s' if seconds < 120 else f'{seconds / 60:.0f} min' if seconds < 7200
          else f'{seconds / 3600:.1f} h')
