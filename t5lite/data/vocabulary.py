"""SentencePiece vocabulary with T5's ids: pad 0, eos 1, unk 2, no bos, 100 sentinels at the end.

T5 appends its sentinels after the SentencePiece pieces, counting down from the top: with 8,000
pieces `<extra_id_0>` is id 8099, `<extra_id_1>` 8098, ..., `<extra_id_99>` 8000, so
`vocab_size` is 8,100 (the model pads its embedding to 8,192, a multiple of 128).

`train_tokenizer` reserves UL2's mode tokens as pieces of their own, ids 3, 4 and 5
('▁[NLU]', '▁[NLG]', '▁[S2S]': a mode at the start of a text or after a space is one id).

The bundled `vocab.model` ('bundled') is a unigram model of 8,000 pieces trained on the bundled
corpus (about 30 CPU-seconds; sha256 0d31e49c9b56), byte for byte by

  t5lite tokenizer --input=bundled --vocab_size=8000 --out=t5lite/data/bundled --overwrite

(--overwrite: the folder holds the corpus too, which stays as it is). Until 2026-12-04 it was
`vocab-v1.model` ('bundled-v1', sha256 356521ec85a9), trained before the mode tokens were
reserved: '[NLU]' is 6 ids there (▁ <unk> N L U <unk>), and every other piece's id is 3 less.
It ships for the workdirs and stores made with it: a workdir of then records no vocabulary, and
its 'bundled' is read as 'bundled-v1' (t5lite/config.py).
"""

import functools
import hashlib
import importlib.resources
import io
import os
import re
from typing import Sequence

import numpy as np
import sentencepiece as spm
from google.protobuf import message
from sentencepiece import sentencepiece_model_pb2

from t5lite import files
from t5lite import outputs
from t5lite import paths
from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID

NUM_SENTINELS = 100
MODE_TOKENS = ('[NLU]', '[NLG]', '[S2S]')  # UL2's (t5lite/objectives/ul2.py), one piece each
SENTENCE_ENDS = ('.', '!', '?')
BUNDLED = 'bundled'
BUNDLED_V1 = 'bundled-v1'  # the bundled model before 2026-12-04, of the workdirs made with it
BUNDLED_FILES = {BUNDLED: 'bundled/vocab.model', BUNDLED_V1: 'bundled/vocab-v1.model'}
VOCAB_FILE = 'vocab.model'  # what `train_tokenizer` writes in its folder
# What a workdir records of the vocabulary it was made with: the same as a token store's
# manifest holds (data/store.py), its name, the SHA-256 of its model and its ids
RECORD_FILE = 'vocabulary.json'
IDENTITY = {'name': str,
            'sha256': files.Field(str, lambda h: re.fullmatch('[0-9a-f]{64}', h) is not None,
                                  'a SHA-256 (64 hex digits)'),
            'size': files.Field(int, lambda n: n > 0, 'a size (at least 1)')}

_SENTINEL = re.compile(r'<extra_id_(\d+)>')
# SentencePiece trains on "sentences" and skips long ones; whole speeches are single lines.
_SENTENCE_BREAK = re.compile(r'(?<=[.!?])\s+|\n\s*\n')


class Vocabulary:
  """A SentencePiece model plus T5's 100 sentinels; ids are Python ints or int32 arrays."""

  def __init__(self, model_proto: bytes, name: str = 'vocabulary'):
    """`name`: how errors name the model ('--vocabulary: spm/vocab.model')."""
    _check_whole_model(model_proto, name)
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError as error:  # a whole proto SentencePiece refuses: 'unk is not defined.'
      raise ValueError(f'{name} is not a SentencePiece model ({error})') from None
    self.model_proto = model_proto  # the .model file's bytes, which an HF export copies
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise ValueError(f'{name} has (pad, eos, unk, bos) ids {ids}, not T5\'s (0, 1, 2, -1); '
                       'train one with `t5lite tokenizer`')
    self.num_pieces = self._sp.get_piece_size()
    self.vocab_size = self.num_pieces + NUM_SENTINELS
    # what the vocabulary is, whatever its path: a model retrained under the same name is another
    self.digest = hashlib.sha256(model_proto).hexdigest()

  def identity(self, name: str) -> dict:
    """What a workdir or a token store records of the vocabulary it was made with (IDENTITY)."""
    return {'name': name, 'sha256': self.digest, 'size': self.vocab_size}

  def check_same(self, recorded: dict, name: str, made: str) -> None:
    """Refuses this vocabulary (`name`: how the user gave it) where `made` (a workdir, a store)
    was made with the `recorded` one, in one line naming both digests."""
    if recorded['sha256'] != self.digest:
      same = [bundled for bundled in BUNDLED_FILES
              if load_vocabulary(bundled).digest == recorded['sha256']]
      raise ValueError(
          f'{made} was made with the vocabulary {recorded["name"]!r} (sha256 '
          f'{recorded["sha256"][:12]}), and {name} is another (sha256 {self.digest[:12]}): its '
          'ids would mean other pieces; give the vocabulary it was made with'
          + (f' (--config.data.vocabulary={same[0]})' if same else ''))

  def sentinel_id(self, n: int) -> int:
    """Id of `<extra_id_n>`: T5 counts sentinels down from the last id."""
    if not 0 <= n < NUM_SENTINELS:
      raise ValueError(f'<extra_id_{n}>: T5 has sentinels 0..{NUM_SENTINELS - 1}')
    return self.vocab_size - 1 - n

  def sentence_end_ids(self) -> list[int]:
    """Ids of the pieces '.', '!' and '?' that the vocabulary has: where BART splits sentences."""
    ids = [self._sp.piece_to_id(piece) for piece in SENTENCE_ENDS]
    return [i for i in ids if i != UNK_ID]

  def unigram_ids(self) -> np.ndarray:
    """(vocab_size,) int32: each id's word as ROUGE reads text (its letters and digits,
    lowercased: '▁The' and 'the' are one word), numbered from 1; 0 for pieces of none
    (punctuation, the special pieces, sentinels). Where PEGASUS scores sentences."""
    words = [''] * self.vocab_size
    for i in range(self.num_pieces):
      if not (self._sp.is_control(i) or self._sp.is_unknown(i)):
        words[i] = re.sub(r'[^a-z0-9]', '', self._sp.id_to_piece(i).lower())
    numbers = {word: n for n, word in enumerate(sorted(set(words) - {''}), start=1)}
    return np.asarray([numbers.get(word, 0) for word in words], np.int32)

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, no EOS; `<extra_id_N>` in the text becomes sentinel N, as in T5 prompts.

    >>> vocab.encode('The <extra_id_0> walks')  # [..'▁The'.., 8099, ..'▁walks'..]
    """
    ids = []
    for i, part in enumerate(_SENTINEL.split(text)):  # text, N, text, N, ..., text
      if i % 2:
        ids.append(self.sentinel_id(int(part)))
      elif part.strip():
        ids.extend(self._sp.encode(part))
    return ids

  def encode_ids(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
    """Ids of many documents in one call on `num_threads` threads (0: every core), no EOS:
    how corpora are tokenized (sentinel text is not parsed, unlike `encode`)."""
    return self._sp.encode(list(texts), num_threads=num_threads or os.cpu_count())

  def encode_documents(self, texts: Sequence[str]) -> list[np.ndarray]:
    """`encode_ids` as an int32 array per document."""
    return [np.asarray(ids, np.int32) for ids in self.encode_ids(texts)]

  def decode(self, ids) -> str:
    """Text of `ids` up to the first EOS, sentinels shown as `<extra_id_N>`, pads dropped.

    Ids past the vocabulary (the model's padding rows, 8100..8191) read as unk, as in seqio.
    """
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    parts, run = [], []
    for i in ids:
      if self.num_pieces <= i < self.vocab_size:
        parts += [self._sp.decode(run), f'<extra_id_{self.vocab_size - 1 - i}>']
        run = []
      else:
        run.append(i if i < self.vocab_size else UNK_ID)
    parts.append(self._sp.decode(run))
    return ' '.join(part for part in parts if part)


def _check_whole_model(model_proto: bytes, name: str) -> None:
  """Refuses bytes that are not a whole SentencePiece model in one line naming `name`. Protobuf
  reads a file cut between two pieces as a smaller model (and an empty one as a model of none);
  the normalizer spec, which SentencePiece writes after the pieces and the trainer spec, is there
  only in a whole one."""
  try:
    whole = sentencepiece_model_pb2.ModelProto.FromString(model_proto).HasField('normalizer_spec')
  except message.DecodeError:
    whole = False
  if not whole:
    raise ValueError(f'{name} is not a SentencePiece model (cut short, or another kind of file)')


@functools.lru_cache(maxsize=4)
def load_vocabulary(name: str = BUNDLED, flag: str = 'data.vocabulary') -> Vocabulary:
  """'bundled' (the package's vocab.model), 'bundled-v1' (the one before 2026-12-04) or the path
  of a SentencePiece .model; errors name `flag`, the setting the user gave it with (prepare's
  --vocabulary)."""
  if name in BUNDLED_FILES:
    proto = importlib.resources.files('t5lite.data').joinpath(BUNDLED_FILES[name]).read_bytes()
  elif not paths.path(name).exists():
    raise ValueError(f'{flag}: no such file {name!r} (use "bundled" or a .model path)')
  else:
    proto = files.read_bytes(name, flag)
  return Vocabulary(proto, files.named(name, flag))


def train_tokenizer(inputs: str | Sequence[str], vocab_size: int = 8000, out_dir: str = '.',
                    text_key: str = 'text', overwrite: bool = False) -> str:
  """Trains a unigram SentencePiece model with T5's ids; returns the path of `vocab.model`.

  `inputs` are what `data.source` accepts ('bundled', .txt/.jsonl files or globs);
  `vocab_size` counts pieces, the three mode pieces among them: the Vocabulary adds the 100
  sentinels. Which `out_dir` may be written, checked before training, and how:
  t5lite/outputs.py.
  """
  from t5lite.data import sources  # TensorFlow's: a run that reads no text never loads it
  outputs.check_folder(out_dir, (VOCAB_FILE,), overwrite=overwrite)
  documents, _ = sources.read_documents(inputs, text_key, flag='--input')
  sentences = (s for doc in documents for s in _SENTENCE_BREAK.split(doc) if s.strip())
  model = io.BytesIO()
  spm.set_random_generator_seed(0)  # input sampling, for corpora above input_sentence_size
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model, vocab_size=vocab_size,
        model_type='unigram', pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        # '▁[NLU]', not '[NLU]': SentencePiece's dummy prefix would make '[NLU]' two ids, ▁ [NLU],
        # and an HF export one (it matches '[NLU]' before its pre-tokenizer adds the ▁)
        user_defined_symbols=['\u2581' + mode for mode in MODE_TOKENS],
        character_coverage=0.9999, max_sentence_length=16384, input_sentence_size=10_000_000,
        shuffle_input_sentence=True, num_threads=os.cpu_count(), minloglevel=2)
  except RuntimeError as error:  # e.g. "... Vocabulary size too high (50000). Please set it ..."
    raise ValueError(f'--vocab_size={vocab_size} does not fit --input {inputs}: '
                     f'{str(error).splitlines()[-1].split("] ")[-1]}') from None
  with outputs.writing(out_dir, folder=True) as temp:
    with open(os.path.join(temp, VOCAB_FILE), 'wb') as f:
      f.write(model.getvalue())
  return str(paths.path(out_dir) / VOCAB_FILE)
