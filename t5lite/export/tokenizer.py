"""Hugging Face tokenizer files for an export folder, and t5lite's vocabulary back from one.

Export writes what `transformers.AutoTokenizer.from_pretrained(folder)` needs to encode every
text to t5lite's ids, with no network and no tokenizer.json (transformers 5 builds its fast
tokenizer from spiece.model itself, offline):
- spiece.model: the SentencePiece model, byte for byte; HF's T5 tokenizer appends the 100
  sentinels `<extra_id_99>` ... `<extra_id_0>` after its pieces, T5's ids exactly;
- tokenizer_config.json: tokenizer_class T5Tokenizer, named because every family exports this
  vocabulary, and AutoTokenizer would otherwise pick the class of config.json's model_type
  (BERT's WordPiece, GPT-2's byte-level BPE, ...); clean_up_tokenization_spaces off, so that
  decoding does not glue punctuation where SentencePiece would not;
- special_tokens_map.json: eos, pad, unk and the sentinels, as HF's own T5 folders have them.

Import reads a folder's spiece.model or, failing that, rebuilds the SentencePiece model from a
unigram tokenizer.json (what HF saves), which encodes the same: same pieces, scores, types and
normalization, though not the same bytes (the training options are lost).
"""

import base64
import binascii
import json

from sentencepiece import sentencepiece_model_pb2

from t5lite import files
from t5lite import paths
from t5lite.data import vocabulary
from t5lite.data.vocabulary import NUM_SENTINELS

SPIECE_FILE = 'spiece.model'
CONFIG_FILE = 'tokenizer_config.json'
SPECIAL_TOKENS_FILE = 'special_tokens_map.json'
FILES = (SPIECE_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE)  # what export_tokenizer writes
TOKENIZER_JSON_FILE = 'tokenizer.json'  # read by import_tokenizer only

SPECIAL_TOKENS = {'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}
SENTINELS = tuple(f'<extra_id_{n}>' for n in range(NUM_SENTINELS))

_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


def export_tokenizer(vocabulary_spec: str, out_dir: str, *,
                     model_max_length: int | None = None) -> None:
  """Writes FILES for `vocabulary_spec` (`data.vocabulary`) into the existing folder `out_dir`."""
  vocab = vocabulary.load_vocabulary(vocabulary_spec)
  config = {'tokenizer_class': 'T5Tokenizer', 'extra_ids': NUM_SENTINELS, **SPECIAL_TOKENS,
            'clean_up_tokenization_spaces': False}
  if model_max_length is not None:
    config['model_max_length'] = model_max_length
  out = paths.path(out_dir)
  (out / SPIECE_FILE).write_bytes(vocab.model_proto)
  (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')
  special_tokens = {**SPECIAL_TOKENS, 'additional_special_tokens': SENTINELS}
  (out / SPECIAL_TOKENS_FILE).write_text(json.dumps(special_tokens, indent=2) + '\n')


def import_tokenizer(hf_dir: str) -> bytes | None:
  """The SentencePiece model proto of an HF folder (local or gs://), None if it has no
  spiece.model and no tokenizer.json; ValueError if what it has is not a T5 vocabulary."""
  root = paths.path(hf_dir)
  file = root / SPIECE_FILE
  if file.exists():
    proto = files.read_bytes(file)
  elif (root / TOKENIZER_JSON_FILE).exists():
    file = root / TOKENIZER_JSON_FILE
    proto = _proto_from_tokenizer_json(file)
  else:
    return None
  try:
    vocabulary.Vocabulary(proto, str(file))  # checks T5's ids
  except RuntimeError as error:  # SentencePiece's parse error
    raise ValueError(f'{file} is not a SentencePiece model ({error})') from None
  return proto


def _proto_from_tokenizer_json(file) -> bytes:
  """The SentencePiece model a T5 unigram tokenizer.json was converted from; any part of it of
  another shape than HF writes is one line naming the file."""
  spec = files.read_json(file)
  try:
    return _proto_from_spec(file, spec)
  except (KeyError, TypeError, IndexError, AttributeError, binascii.Error, UnicodeError) as error:
    raise ValueError(f'{file} is not a tokenizer.json ({type(error).__name__}: {error})'
                     ) from None


def _proto_from_spec(file, spec: dict) -> bytes:
  """The SentencePiece model a parsed tokenizer.json was converted from, less the sentinels HF
  appends; added tokens are control pieces if special, else user-defined, as HF reads them."""
  model, normalizer = spec['model'], spec.get('normalizer') or {}
  if model.get('type') != 'Unigram' or model.get('byte_fallback'):
    raise ValueError(f'{file} is not a SentencePiece unigram tokenizer without byte fallback '
                     f'(model type {model.get("type")!r}); t5lite reads no other')
  pieces, unk_id = model['vocab'], model.get('unk_id')  # pieces: [[piece, score], ...]
  if not isinstance(pieces, list) or not all(
      isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
      and isinstance(p[1], (int, float)) for p in pieces):
    raise ValueError(f'{file}: model.vocab is not a list of [piece, score] pairs')
  if tuple(piece for piece, _ in pieces[-NUM_SENTINELS:]) != SENTINELS[::-1]:
    raise ValueError(f'{file} does not end in T5\'s sentinels <extra_id_99> ... <extra_id_0>')
  pieces = pieces[:-NUM_SENTINELS]
  added = {token['id']: token['special'] for token in spec.get('added_tokens', [])}
  proto = sentencepiece_model_pb2.ModelProto()
  for i, (piece, score) in enumerate(pieces):
    entry = proto.pieces.add(piece=piece, score=score)  # type NORMAL unless set here
    if i == unk_id:
      entry.type = _Piece.UNKNOWN
    elif i in added:
      entry.type = _Piece.CONTROL if added[i] else _Piece.USER_DEFINED
  ids = {piece: i for i, (piece, _) in enumerate(pieces)}
  trainer = proto.trainer_spec
  trainer.vocab_size, trainer.unk_id = len(pieces), -1 if unk_id is None else unk_id
  trainer.pad_id, trainer.eos_id = ids.get(trainer.pad_piece, -1), ids.get(trainer.eos_piece, -1)
  trainer.bos_id = ids.get(trainer.bos_piece, -1)
  charsmaps = [n['precompiled_charsmap'] for n in normalizer.get('normalizers', [normalizer])
               if n.get('type') == 'Precompiled']
  proto.normalizer_spec.name = 'nmt_nfkc' if charsmaps else 'identity'
  proto.normalizer_spec.precompiled_charsmap = base64.b64decode(charsmaps[0] if charsmaps else '')
  return proto.SerializeToString()
