"""`t5lite prepare`: tokenize a corpus once into a token store (t5lite/data/store.py).

  t5lite prepare --source='corpus/*.jsonl.zst' --out=/data/store
  t5lite prepare --source='gs://b/c4/*.json.gz' --out=gs://b/store --num_shards=32 --shard_index=$i

It streams: whatever the corpus, memory holds a few batches of documents and their tokens. A
thread reads and hashes documents while SentencePiece encodes the previous ones on `workers`
threads. Part i of N takes the source's inputs (files, or a TFDS dataset's file shards) [i*n/N,
(i+1)*n/N) in order, so the parts in order hold the corpus in order and need no merge pass: run
them on N machines at once (a SLURM array, the workers of a TPU VM slice) or one after another.

A part is the unit of a restart. Its files are written under hidden temporary names (on Cloud
Storage, as objects no reader looks at before the manifest), renamed into place when the part is
complete, and its manifest is written last. A killed part run again starts over, replacing what
the killed run left; a part that is complete is refused unless --overwrite.
"""

import collections
import contextlib
import json
import os
import re
import time

from t5lite import files
from t5lite import outputs
from t5lite import paths
from t5lite.data import sources
from t5lite.data import store
from t5lite.data import vocabulary as vocabulary_lib

_PROGRESS_EVERY_S = 1.0
# what a store's folder holds: parts' files, and the temporaries of parts being written
_PART_FILE = re.compile(r'\.?part-\d{5}-of-\d{5}\.(json|train|validation)(\.tmp)?')


def prepare(source: str, out: str, *, vocabulary: str = 'bundled', text_key: str = 'text',
            validation_fraction: float = 0.05, tfds_data_dir: str = '', workers: int = 0,
            num_shards: int = 1, shard_index: int = 0, overwrite: bool = False,
            progress=None) -> dict:
  """Writes part `shard_index` of `num_shards` of the store `out`; returns its manifest.

  Every check runs before anything is written: one ValueError line for a bad setting, a source
  that cannot be read, or an --out that is no place for this part. `progress`: a text stream
  for a progress line (documents, tokens, tokens/s, ETA), or None.
  """
  if not 0 <= validation_fraction < 1:
    raise ValueError(f'--validation_fraction={validation_fraction} must be in [0, 1)')
  if not 0 <= shard_index < num_shards:
    raise ValueError(f'--shard_index={shard_index} must be in [0, --num_shards={num_shards})')
  if workers < 0:
    raise ValueError(f'--workers={workers} must be at least 0 (0: every core)')
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
      'dtype': store.token_dtype(vocab.vocab_size).str,
      'vocabulary': {'name': vocabulary, 'sha256': store.vocabulary_digest(vocab),
                     'size': vocab.vocab_size},
      'source': source, 'text_key': text_key, 'validation_fraction': validation_fraction,
      'inputs': [item.name for item in mine]}
  _check_out(out, manifest, num_shards, overwrite)

  skipped = collections.Counter()
  documents, tokens = collections.Counter(), collections.Counter()
  meter = _Progress(progress, part, len(mine))
  with _part_files(out, part, manifest) as write:
    for chunk in store.tokenize(mine, vocab, validation_fraction, skipped, workers=workers):
      for split, split_tokens, count in zip(store.SPLITS, chunk[:2], chunk.documents):
        write(split, split_tokens.tobytes())
        documents[split] += count
        tokens[split] += split_tokens.size
      meter.update(sum(documents.values()), sum(tokens.values()), chunk.inputs_done)
    meter.close()
    if not sum(tokens.values()):
      raise ValueError(f'--source {source!r} holds no text in part {shard_index} of '
                       f'{num_shards} (skipped: {dict(skipped)})')
    manifest.update(documents={s: documents[s] for s in store.SPLITS},
                    tokens={s: tokens[s] for s in store.SPLITS},
                    skipped=dict(sorted(skipped.items())))
  return manifest


def _check_out(out: str, manifest: dict, num_shards: int, overwrite: bool) -> None:
  """Refuses an --out where this part may not be written (before anything is)."""
  outputs.check_folder(out, (), overwrite=True)  # the place: not in a workdir, not a file
  folder = paths.path(out)
  entries = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
  foreign = [name for name in entries if not _PART_FILE.fullmatch(name)]
  if foreign and not overwrite:
    raise ValueError(f'--out={out} holds {foreign[0]}{", ..." if len(foreign) > 1 else ""}, '
                     'which is no part of a token store; give a new or empty folder, or '
                     '--overwrite to write this part beside it')
  for name in entries:
    match = store.MANIFEST.fullmatch(name)
    if not match:
      continue
    where = f'--out={out} holds part {int(match[1])} of {int(match[2])}'
    if int(match[2]) != num_shards:
      raise ValueError(f'{where}; give --num_shards={int(match[2])}, or a new --out')
    if name == manifest['part'] + '.json':
      if not overwrite:
        raise ValueError(f'{where} already (complete); --overwrite to prepare it again')
      continue
    other = files.read_json(folder / name, '--out')
    for key, flag in (('vocabulary', '--vocabulary'), ('validation_fraction',
                                                       '--validation_fraction'),
                      ('text_key', '--text_key'), ('source', '--source')):
      theirs, ours = other.get(key), manifest[key]
      if key == 'vocabulary':
        theirs, ours = (theirs or {}).get('sha256'), ours['sha256']
      if theirs != ours:
        raise ValueError(f'{where}, prepared with another {flag}; give the same one, or a '
                         'new --out')


def _staging(name: str) -> str:
  return f'.{name}.tmp'


@contextlib.contextmanager
def _part_files(out: str, part: str, manifest: dict):
  """Yields write(split, bytes), which appends to the part's split file; when the block
  completes, the files take their places and `manifest` (as the block left it) is written last.
  On an exception the part's files are removed, and the folders this made if they are empty."""
  folder = paths.path(out)
  remote = paths.is_uri(folder)
  created = None if remote else next(
      (f for f in reversed(list(paths.ancestors(folder))) if not f.exists()), None)
  manifest_file = folder / f'{part}.json'
  names = {split: folder / f'{part}.{split}' for split in store.SPLITS}
  staged = {split: name if remote else name.with_name(_staging(name.name))
            for split, name in names.items()}
  folder.mkdir(parents=True, exist_ok=True)
  if manifest_file.exists():  # --overwrite: the old part stops being one before it changes
    manifest_file.unlink()
  try:
    with contextlib.ExitStack() as open_files:
      handles = {split: open_files.enter_context(staged[split].open('wb'))
                 for split in store.SPLITS}
      yield lambda split, data: handles[split].write(data)
    if not remote:
      for split in store.SPLITS:
        os.replace(staged[split], names[split])
    paths.write_text(manifest_file, json.dumps(manifest, indent=1))
  except BaseException:
    if not remote:
      for file in staged.values():
        if file.exists():
          file.unlink()
      for made in (paths.ancestors(folder)[:paths.ancestors(folder).index(created) + 1]
                   if created is not None else ()):
        try:  # only if empty: a part run beside this one may be writing there
          os.rmdir(made)
        except OSError:
          break
    raise


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
