"""Vocabularies with T5's ids: pad 0, eos 1, unk 2, no bos, and sentinels for span corruption.

Two kinds, one interface (`Vocabulary`):

- SentencePiece (`data.vocabulary='bundled'` or a .model path): T5 appends 100 sentinels after
  the pieces, counting down from the top: with 8,000 pieces `<extra_id_0>` is id 8099,
  `<extra_id_1>` 8098, ..., `<extra_id_99>` 8000, so `vocab_size` is 8,100 (the model pads its
  embedding to 8,192, a multiple of 128). `t5lite tokenizer` (data/spm_training.py) trains one and
  reserves UL2's mode tokens as pieces of their own, ids 3, 4 and 5 ('▁[NLU]', '▁[NLG]',
  '▁[S2S]': a mode at the start of a text or after a space is one id).
- Bytes (`data.vocabulary='bytes'`, ByT5's): the UTF-8 bytes of the text, byte b as id b + 3,
  and 125 sentinels above them numbered as transformers' ByT5Tokenizer numbers its extra ids,
  `<extra_id_0>` 259, `<extra_id_1>` 260, ..., `<extra_id_124>` 383: 384 ids, no model file.
  (Google's ByT5 checkpoints were pretrained with seqio's ByteVocabulary, whose sentinels count
  down from 258, the byte 0xFF that UTF-8 never holds; ByT5Tokenizer's extra ids, which t5lite
  follows so that its ids and an exported tokenizer's agree, are the rows above.)

A vocabulary is known by its content (`digest`): a SentencePiece one by the SHA-256 of its model
file, the byte one by that of its canonical description (BYTES_DESCRIPTION). A token store stores
a vocabulary's ids in its narrowest dtype (`store_dtype`), ids less `store_offset`: the byte
vocabulary's store holds the text's UTF-8 bytes themselves.

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
import itertools
import json
import os
import re
from typing import Sequence

import numpy as np
import sentencepiece as spm
from google.protobuf import message
from sentencepiece import sentencepiece_model_pb2

from t5lite import files
from t5lite import paths
from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID

NUM_SENTINELS = 100  # a SentencePiece vocabulary's, as T5's
MODE_TOKENS = ('[NLU]', '[NLG]', '[S2S]')  # UL2's (t5lite/objectives/ul2.py), one piece each
SENTENCE_ENDS = ('.', '!', '?')
BUNDLED = 'bundled'
BUNDLED_V1 = 'bundled-v1'  # the bundled model before 2026-12-04, of the workdirs made with it
BUNDLED_FILES = {BUNDLED: 'bundled/vocab.model', BUNDLED_V1: 'bundled/vocab-v1.model'}
VOCAB_FILE = 'vocab.model'  # what `t5lite tokenizer` writes in its folder
BYTES = 'bytes'  # ByT5's byte vocabulary
BYTE_OFFSET = 3  # byte b is id b + 3, after pad, eos and unk
NUM_BYTE_SENTINELS = 125  # ByT5Tokenizer's extra_ids
SPECIAL_TOKENS = {PAD_ID: '<pad>', EOS_ID: '</s>', UNK_ID: '<unk>'}
# What the byte vocabulary is, whose SHA-256 is its digest: a change here is another vocabulary
BYTES_DESCRIPTION = json.dumps(
    {'vocabulary': BYTES, 'encoding': 'utf-8', 'special': SPECIAL_TOKENS,
     'byte_offset': BYTE_OFFSET, 'sentinels': {'first': 256 + BYTE_OFFSET, 'step': 1,
                                               'count': NUM_BYTE_SENTINELS}}, sort_keys=True)
# What a workdir records of the vocabulary it was made with: the same as a token store's
# manifest holds (data/store.py), its name, its digest and its ids
RECORD_FILE = 'vocabulary.json'
IDENTITY = {'name': str,
            'sha256': files.Field(str, lambda h: re.fullmatch('[0-9a-f]{64}', h) is not None,
                                  'a SHA-256 (64 hex digits)'),
            'size': files.Field(int, lambda n: n > 0, 'a size (at least 1)')}

_SENTINEL = re.compile(r'<extra_id_(\d+)>')


class Vocabulary:
  """What every vocabulary gives: its ids (`num_pieces` of text below `num_sentinels` sentinels),
  its digest and identity, text to ids and back. Ids are Python ints or int32 arrays."""
  num_pieces: int  # ids [0, num_pieces) are pad, eos, unk and the text's pieces (or bytes)
  vocab_size: int
  num_sentinels: int
  sentinel_step: int  # +1 or -1: sentinel n is sentinel_id(0) + n * sentinel_step
  digest: str  # the SHA-256 that says what the vocabulary is, whatever its path
  store_dtype: np.dtype  # a token store's dtype for these ids, less store_offset
  store_offset: int = 0

  def identity(self, name: str) -> dict:
    """What a workdir or a token store records of the vocabulary it was made with (IDENTITY)."""
    return {'name': name, 'sha256': self.digest, 'size': self.vocab_size}

  def check_same(self, recorded: dict, name: str, made: str) -> None:
    """Refuses this vocabulary (`name`: how the user gave it) where `made` (a workdir, a store)
    was made with the `recorded` one, in one line naming both digests."""
    if recorded['sha256'] != self.digest:
      same = [known for known in (*BUNDLED_FILES, BYTES)
              if load_vocabulary(known).digest == recorded['sha256']]
      raise ValueError(
          f'{made} was made with the vocabulary {recorded["name"]!r} (sha256 '
          f'{recorded["sha256"][:12]}), and {name} is another (sha256 {self.digest[:12]}): its '
          'ids would mean other pieces; give the vocabulary it was made with'
          + (f' (--config.data.vocabulary={same[0]})' if same else ''))

  def sentinel_id(self, n: int) -> int:
    """Id of `<extra_id_n>`."""
    if not 0 <= n < self.num_sentinels:
      raise ValueError(f'<extra_id_{n}>: this vocabulary has sentinels 0..'
                       f'{self.num_sentinels - 1}')
    first = self.vocab_size - 1 if self.sentinel_step < 0 else self.num_pieces
    return first + n * self.sentinel_step

  def sentinel_number(self, i: int) -> int | None:
    """N of the sentinel `<extra_id_N>` that id `i` is, or None."""
    if not self.num_pieces <= i < self.vocab_size:
      return None
    return (i - self.sentinel_id(0)) * self.sentinel_step

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, no EOS; `<extra_id_N>` in the text becomes sentinel N, as in T5 prompts."""
    raise NotImplementedError

  def encode_ids(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
    """Ids of many documents, no EOS, sentinel text not parsed: how corpora are tokenized."""
    raise NotImplementedError

  def encode_documents(self, texts: Sequence[str]) -> list[np.ndarray]:
    """`encode_ids` as an int32 array per document."""
    return [np.asarray(ids, np.int32) for ids in self.encode_ids(texts)]

  def stored(self, texts: Sequence[str], num_threads: int = 0) -> np.ndarray:
    """The ids of `texts`, concatenated, as a token store holds them (store_dtype, less
    store_offset); `num_threads`: the encoder's threads (0: every core)."""
    encoded = self.encode_ids(texts, num_threads)
    return np.fromiter(itertools.chain.from_iterable(encoded), self.store_dtype,
                       count=sum(map(len, encoded)))

  def sentence_end_ids(self) -> list[int]:
    """Ids of the pieces '.', '!' and '?' that the vocabulary has: where BART splits sentences."""
    raise NotImplementedError

  def decode(self, ids) -> str:
    """Text of `ids` up to the first EOS, sentinels shown as `<extra_id_N>`, pads dropped."""
    raise NotImplementedError


def _until_eos(ids) -> list[int]:
  ids = [int(i) for i in ids]
  return ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids


class SentencePieceVocabulary(Vocabulary):
  """A SentencePiece model plus T5's 100 sentinels."""
  num_sentinels = NUM_SENTINELS
  sentinel_step = -1  # T5 counts sentinels down from the last id

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
    self.digest = hashlib.sha256(model_proto).hexdigest()
    self.store_dtype = np.dtype('<u2' if self.vocab_size <= 1 << 16 else '<u4')

  def sentence_end_ids(self) -> list[int]:
    ids = [self._sp.piece_to_id(piece) for piece in SENTENCE_ENDS]
    return [i for i in ids if i != UNK_ID]

  def encode(self, text: str) -> list[int]:
    """>>> vocab.encode('The <extra_id_0> walks')  # [..'▁The'.., 8099, ..'▁walks'..]"""
    ids = []
    for i, part in enumerate(_SENTINEL.split(text)):  # text, N, text, N, ..., text
      if i % 2:
        ids.append(self.sentinel_id(int(part)))
      elif part.strip():
        ids.extend(self._sp.encode(part))
    return ids

  def encode_ids(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
    return self._sp.encode(list(texts), num_threads=num_threads or os.cpu_count())

  def decode(self, ids) -> str:
    """Ids past the vocabulary (the model's padding rows, 8100..8191) read as unk, as in seqio;
    the text around sentinels is joined by spaces."""
    parts, run = [], []
    for i in _until_eos(ids):
      n = self.sentinel_number(i)
      if n is not None:
        parts += [self._sp.decode(run), f'<extra_id_{n}>']
        run = []
      else:
        run.append(i if i < self.vocab_size else UNK_ID)
    parts.append(self._sp.decode(run))
    return ' '.join(part for part in parts if part)


class ByteVocabulary(Vocabulary):
  """ByT5's vocabulary: UTF-8 bytes at 3-258, sentinels 259-383 (ByT5Tokenizer's ids exactly).

  >>> BYTE_VOCABULARY.encode('hé <extra_id_0>')  # [107, 198, 172, 35, 259]
  """
  num_pieces = 256 + BYTE_OFFSET
  vocab_size = num_pieces + NUM_BYTE_SENTINELS
  num_sentinels = NUM_BYTE_SENTINELS
  sentinel_step = 1  # ByT5Tokenizer's extra ids count up from 259
  digest = hashlib.sha256(BYTES_DESCRIPTION.encode()).hexdigest()
  store_dtype = np.dtype('u1')  # the bytes themselves
  store_offset = BYTE_OFFSET
  # The special tokens ByT5Tokenizer reads in text: pad, EOS and unk eat the whitespace around
  # them (its AddedTokens strip left and right), sentinels are read as they stand
  _SPECIAL = re.compile(r'\s*(</s>|<pad>|<unk>)\s*|<extra_id_(0|[1-9]\d{0,2})>')

  def encode(self, text: str) -> list[int]:
    """As ByT5Tokenizer(text, add_special_tokens=False): '</s>', '<pad>', '<unk>' and
    `<extra_id_N>` (N < 125) in the text are their ids, the rest its UTF-8 bytes (a lone
    surrogate, which UTF-8 cannot hold, as '?')."""
    ids, at = [], 0
    for match in self._SPECIAL.finditer(text):
      special = self._special_id(match)
      if special is None:
        continue
      ids += self.encode_ids([text[at:match.start()]])[0] + [special]
      at = match.end()
    return ids + self.encode_ids([text[at:]])[0]

  def _special_id(self, match: re.Match) -> int | None:
    if match[1]:
      return {token: i for i, token in SPECIAL_TOKENS.items()}[match[1]]
    n = int(match[2])
    return self.sentinel_id(n) if n < self.num_sentinels else None

  def encode_ids(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
    return [(np.frombuffer(_utf8(text), np.uint8).astype(np.int32) + BYTE_OFFSET).tolist()
            for text in texts]

  def stored(self, texts: Sequence[str], num_threads: int = 0) -> np.ndarray:
    """The texts' UTF-8 bytes: concatenating texts concatenates their bytes, so one encode."""
    return np.frombuffer(_utf8(''.join(texts)), np.uint8)

  def sentence_end_ids(self) -> list[int]:
    return [ord(end) + BYTE_OFFSET for end in SENTENCE_ENDS]

  def decode(self, ids) -> str:
    """As ByT5Tokenizer.decode of the ids up to EOS without pads: the bytes, with the special
    tokens' text among them, read as UTF-8, what is not UTF-8 (a character cut short) dropped;
    ids past the vocabulary read as unk."""
    text = bytearray()
    for i in _until_eos(ids):
      if BYTE_OFFSET <= i < self.num_pieces:
        text.append(i - BYTE_OFFSET)
      elif i != PAD_ID:
        n = self.sentinel_number(i)
        text += (SPECIAL_TOKENS[UNK_ID] if n is None else f'<extra_id_{n}>').encode()
    return text.decode('utf-8', errors='ignore')


def _utf8(text: str) -> bytes:
  return text.encode('utf-8', errors='replace')


BYTE_VOCABULARY = ByteVocabulary()


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
  """'bundled' (the package's vocab.model), 'bundled-v1' (the one before 2026-12-04), 'bytes'
  (ByT5's) or the path of a SentencePiece .model; errors name `flag`, the setting the user gave
  it with (prepare's --vocabulary)."""
  if name == BYTES:
    return BYTE_VOCABULARY
  if name in BUNDLED_FILES:
    proto = importlib.resources.files('t5lite.data').joinpath(BUNDLED_FILES[name]).read_bytes()
  elif not paths.path(name).exists():
    raise ValueError(f'{flag}: no such file {name!r} (use "bundled", "bytes" or a .model path)')
  else:
    proto = files.read_bytes(name, flag)
  return SentencePieceVocabulary(proto, files.named(name, flag))
