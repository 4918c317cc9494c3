"""Hugging Face tokenizer files for an export folder, and t5lite's vocabulary back from one.

Export writes what `transformers.AutoTokenizer.from_pretrained(folder)` needs to encode every
text to the ids the folder's model read in pretraining, special tokens included (`TextTemplate`,
models/hf_mapping.py: T5's and BART's EOS after the text, GPT-2's start token before it, BERT's
[CLS] and [SEP], nothing around MLM text), with no network:
- spiece.model: the SentencePiece model, byte for byte, which import reads back;
- tokenizer.json: the same vocabulary as HF's T5 conversion writes it (unigram pieces and scores,
  T5's 100 sentinels `<extra_id_99>` ... `<extra_id_0>` after them, T5's ids exactly, the
  normalizer's precompiled charsmap) with the model's template as its post-processor;
- tokenizer_config.json: the template's tokenizer_class (named because every family exports
  this vocabulary, and AutoTokenizer would otherwise pick the class of config.json's model_type:
  BERT's WordPiece, GPT-2's byte-level BPE, ...), the special tokens, the inputs the model takes
  (token types only for BERT's pairs), clean_up_tokenization_spaces off, so that decoding does
  not glue punctuation where SentencePiece would not;
- special_tokens_map.json: the special tokens and the sentinels, as HF's own T5 folders have them.

The byte vocabulary (`data.vocabulary='bytes'`) is transformers' ByT5Tokenizer, which has no
vocabulary file: its tokenizer_config.json alone (BYTE_FILES) names the class and its 125 extra
ids, and AutoTokenizer builds it. ByT5Tokenizer ends a text in EOS, as T5 reads it; a model
whose text has another template (GPT-2's start token, BERT's [CLS]) is refused.

Import reads a folder's spiece.model or, failing that, rebuilds the SentencePiece model from a
unigram tokenizer.json (what HF saves), which encodes the same: same pieces, scores, types and
normalization, though not the same bytes (the training options are lost). A folder whose
tokenizer_class (in tokenizer_config.json or config.json, as Google's ByT5 folders have it) is
ByT5Tokenizer imports as the byte vocabulary.
"""

import base64
import binascii
import json

from sentencepiece import sentencepiece_model_pb2

from t5lite import files
from t5lite import paths
from t5lite.data import vocabulary
from t5lite.data.vocabulary import NUM_SENTINELS
from t5lite.models.hf_mapping import T5_TEXT, TextTemplate
from t5lite.token_ids import UNK_ID

SPIECE_FILE = 'spiece.model'
TOKENIZER_JSON_FILE = 'tokenizer.json'
CONFIG_FILE = 'tokenizer_config.json'
SPECIAL_TOKENS_FILE = 'special_tokens_map.json'
FILES = (SPIECE_FILE, TOKENIZER_JSON_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE)  # export writes
BYTE_FILES = (CONFIG_FILE,)  # export writes for the byte vocabulary
BYTE_TOKENIZER = 'ByT5Tokenizer'

SPECIAL_TOKENS = {'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}
SENTINELS = tuple(f'<extra_id_{n}>' for n in range(NUM_SENTINELS))
METASPACE = {'type': 'Metaspace', 'replacement': '\u2581', 'prepend_scheme': 'always',
             'split': True}  # SentencePiece's dummy prefix: '▁' before each word

_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


def files_written(vocabulary_spec: str, text: TextTemplate) -> tuple[str, ...]:
  """The files `export_tokenizer` writes for `vocabulary_spec`; refuses in one line a byte
  vocabulary of a model ByT5Tokenizer does not read text for."""
  if vocabulary_spec != vocabulary.BYTES:
    return FILES
  if (text.single, text.pair) != (T5_TEXT.single, T5_TEXT.pair) or text.special_tokens:
    raise ValueError(f"data.vocabulary='bytes' exports as ByT5Tokenizer, which reads a text as "
                     f"T5 does ('{T5_TEXT.single}'), not as this model ('{text.single}')")
  return BYTE_FILES


def export_tokenizer(vocabulary_spec: str, out_dir: str, text: TextTemplate, *,
                     model_max_length: int | None = None) -> None:
  """Writes `files_written` for `vocabulary_spec` (`data.vocabulary`) into the existing folder
  `out_dir`, adding by default what `text` says the model read around a text."""
  if files_written(vocabulary_spec, text) == BYTE_FILES:
    _export_byte_tokenizer(out_dir, model_max_length)
    return
  vocab = vocabulary.load_vocabulary(vocabulary_spec)
  special_tokens = {**SPECIAL_TOKENS, **text.special_tokens}
  inputs = ['input_ids', 'token_type_ids', 'attention_mask'] if ':1' in text.pair else [
      'input_ids', 'attention_mask']  # HF's T5 and GPT-2 take no token types
  config = {'tokenizer_class': text.tokenizer_class, 'extra_ids': NUM_SENTINELS, **special_tokens,
            'model_input_names': inputs, 'clean_up_tokenization_spaces': False}
  if model_max_length is not None:
    config['model_max_length'] = model_max_length
  out = paths.path(out_dir)
  (out / SPIECE_FILE).write_bytes(vocab.model_proto)
  (out / TOKENIZER_JSON_FILE).write_text(json.dumps(_tokenizer_json(vocab, text)) + '\n')
  (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')
  special_tokens['additional_special_tokens'] = SENTINELS
  (out / SPECIAL_TOKENS_FILE).write_text(json.dumps(special_tokens, indent=2) + '\n')


def _export_byte_tokenizer(out_dir: str, model_max_length: int | None) -> None:
  """ByT5Tokenizer's tokenizer_config.json, all it reads: the class, its special tokens and its
  125 extra ids, which it numbers 259 ... 383 as the byte vocabulary does."""
  config = {'tokenizer_class': BYTE_TOKENIZER, 'extra_ids': vocabulary.NUM_BYTE_SENTINELS,
            **SPECIAL_TOKENS}
  if model_max_length is not None:
    config['model_max_length'] = model_max_length
  (paths.path(out_dir) / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')


def _tokenizer_json(vocab: vocabulary.Vocabulary, text: TextTemplate) -> dict:
  """The tokenizer.json of `vocab` with `text`'s post-processor: what `_proto_from_spec` reads
  back. Control pieces and sentinels are special added tokens, user-defined pieces plain ones."""
  proto = sentencepiece_model_pb2.ModelProto.FromString(vocab.model_proto)
  pieces = [[p.piece, p.score] for p in proto.pieces] + [[s, 0.0] for s in SENTINELS[::-1]]
  types = [p.type for p in proto.pieces] + [_Piece.CONTROL] * NUM_SENTINELS
  added = [{'id': i, 'content': piece, 'single_word': False, 'lstrip': False, 'rstrip': False,
            'normalized': False, 'special': kind != _Piece.USER_DEFINED}
           for i, ((piece, _), kind) in enumerate(zip(pieces, types))
           if kind in (_Piece.CONTROL, _Piece.UNKNOWN, _Piece.USER_DEFINED)]
  charsmap = proto.normalizer_spec.precompiled_charsmap
  return {
      'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': added,
      'normalizer': {'type': 'Precompiled',
                     'precompiled_charsmap': base64.b64encode(charsmap).decode()
                     } if charsmap else None,
      'pre_tokenizer': {'type': 'Sequence',
                        'pretokenizers': [{'type': 'WhitespaceSplit'}, METASPACE]},
      'post_processor': _template_processing(text, {piece: i for i, (piece, _) in
                                                    enumerate(pieces)}),
      'decoder': {**METASPACE, 'prepend_scheme': 'never'} if text.continues else METASPACE,
      'model': {'type': 'Unigram', 'unk_id': UNK_ID, 'vocab': pieces, 'byte_fallback': False},
  }


def _template_processing(text: TextTemplate, ids: dict[str, int]) -> dict:
  """HF's TemplateProcessing of `text`, its special tokens' ids from `ids` (piece -> id)."""
  def parts(template: str) -> list[dict]:
    """'<pad> $A $B:1' -> a SpecialToken, then Sequences A and B (B of type id 1)."""
    items = [item.partition(':')[::2] for item in template.split()]
    return [{'Sequence': {'id': name[1:], 'type_id': int(type_id or 0)}} if name[0] == '$' else
            {'SpecialToken': {'id': name, 'type_id': int(type_id or 0)}}
            for name, type_id in items]

  special = {part['SpecialToken']['id'] for part in parts(f'{text.single} {text.pair}')
             if 'SpecialToken' in part}
  return {'type': 'TemplateProcessing', 'single': parts(text.single), 'pair': parts(text.pair),
          'special_tokens': {name: {'id': name, 'ids': [ids[name]], 'tokens': [name]}
                             for name in sorted(special)}}


def import_tokenizer(hf_dir: str) -> bytes | str | None:
  """The SentencePiece model proto of an HF folder (local or gs://), 'bytes' for a ByT5
  folder, None if it has no spiece.model and no tokenizer.json; ValueError if what it has is not
  a T5 vocabulary."""
  root = paths.path(hf_dir)
  if _tokenizer_class(root) == BYTE_TOKENIZER:
    return vocabulary.BYTES
  file = root / SPIECE_FILE
  if file.exists():
    proto = files.read_bytes(file)
  elif (root / TOKENIZER_JSON_FILE).exists():
    file = root / TOKENIZER_JSON_FILE
    proto = _proto_from_tokenizer_json(file)
  else:
    return None
  vocabulary.SentencePieceVocabulary(proto, str(file))  # a whole model with T5's ids
  return proto


def _tokenizer_class(root) -> str | None:
  """The tokenizer_class a folder's tokenizer_config.json names, else its config.json's."""
  for name in (CONFIG_FILE, 'config.json'):
    if (root / name).exists():
      named = files.read_json(root / name).get('tokenizer_class')
      if named:
        return named
  return None


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
