"""Tokenizer export: transformers' AutoTokenizer, loaded offline from the exported files, gives
t5lite's ids for every text, with the bundled vocabulary and with one trained here; import reads
the SentencePiece model back, from spiece.model or from the tokenizer.json transformers saves.
"""

import json
import pathlib
import re
import shutil

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from t5lite.data import sources, vocabulary
from t5lite.export.tokenizer import FILES, export_tokenizer, import_tokenizer
from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID

transformers = pytest.importorskip('transformers')
tokenizers = pytest.importorskip('tokenizers')
transformers.logging.set_verbosity_error()

MAX_LENGTH = 512
BUNDLED_MODEL = pathlib.Path(vocabulary.__file__).parent / 'bundled' / vocabulary.VOCAB_FILE
SENTINEL_TEXTS = ['The <extra_id_0> walks in <extra_id_99>.', 'a<extra_id_5>b',
                  '<extra_id_0> <extra_id_1>', '  <extra_id_7>  trailing  ',
                  ' '.join(f'word{n} <extra_id_{n}>' for n in range(100))]
OTHER_TEXTS = ['', '   ', '  leading, trailing and  multiple   spaces  ', 'tabs\tand\t\ttabs',
               'lines\nof\n\ntext\r\nend\n', '12,345.67 + 8 = 9.0; (x) [y] {z}!? $%& #1 2nd',
               'Ünïcödé café — “quoted” it’s naïve 日本語 ﬁ ① ｆｕｌｌ 😀😀 x']


@pytest.fixture(scope='module')
def texts() -> list[str]:
  """Passages of the bundled corpus, then sentinels, whitespace, digits and unicode."""
  documents, _ = sources.read_documents('bundled')
  return [documents[i][start:start + 1500] for i, start in ((0, 0), (200, 700), (-1, 3000))
          ] + SENTINEL_TEXTS + OTHER_TEXTS


@pytest.fixture(scope='module')
def trained_model(tmp_path_factory) -> str:
  """A 300-piece vocabulary trained on 6 KB of the corpus: nothing is special to the bundled one."""
  folder = tmp_path_factory.mktemp('trained')
  documents, _ = sources.read_documents('bundled')
  sentences = documents[100][:6000].replace('. ', '.\n')  # SentencePiece skips long lines
  (folder / 'corpus.txt').write_text(sentences, encoding='utf-8')
  return vocabulary.train_tokenizer([str(folder / 'corpus.txt')], 300, str(folder / 'spm'))


@pytest.fixture(scope='module', params=['bundled', 'trained'])
def exported(request, trained_model, tmp_path_factory):
  """(source .model path, t5lite's Vocabulary, export folder, AutoTokenizer of the folder)."""
  spec = 'bundled' if request.param == 'bundled' else trained_model
  source = BUNDLED_MODEL if spec == 'bundled' else pathlib.Path(trained_model)
  folder = tmp_path_factory.mktemp(f'hf_{request.param}')
  export_tokenizer(spec, str(folder), model_max_length=MAX_LENGTH)
  tok = transformers.AutoTokenizer.from_pretrained(str(folder))
  return source, vocabulary.load_vocabulary(spec), folder, tok


def assert_encodes_as_t5lite(tok, vocab, texts):
  for text in texts:
    assert tok(text, add_special_tokens=False).input_ids == vocab.encode(text), text
    assert tok(text).input_ids == vocab.encode(text) + [EOS_ID], text


def test_export_writes_the_files_hf_reads(exported):
  source, vocab, folder, tok = exported
  assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
  assert (folder / 'spiece.model').read_bytes() == source.read_bytes()
  config = json.loads((folder / 'tokenizer_config.json').read_text())
  assert (config['tokenizer_class'], config['extra_ids']) == ('T5Tokenizer', 100)
  assert type(tok).__name__ == 'T5Tokenizer' and tok.model_max_length == MAX_LENGTH
  assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, EOS_ID, UNK_ID)
  assert len(tok) == vocab.vocab_size


def test_hf_encodes_every_text_to_t5lite_ids(exported, texts):
  _, vocab, _, tok = exported
  assert_encodes_as_t5lite(tok, vocab, texts)
  assert tok(texts).input_ids == [vocab.encode(text) + [EOS_ID] for text in texts]
  sentinels = [i for i in vocab.encode(SENTINEL_TEXTS[-1]) if i >= vocab.num_pieces]
  assert sentinels == [vocab.sentinel_id(n) for n in range(100)]  # the texts have all of them
  assert UNK_ID in vocab.encode(OTHER_TEXTS[-1])  # unknown characters are covered too


def test_sentinels_have_t5lite_ids(exported):
  _, vocab, _, tok = exported
  for n in range(100):
    assert tok.convert_tokens_to_ids(f'<extra_id_{n}>') == vocab.sentinel_id(n)
    assert tok.convert_ids_to_tokens(vocab.sentinel_id(n)) == f'<extra_id_{n}>'


def test_hf_decodes_as_t5lite(exported, texts):
  """Model output, ids then EOS then pads, decodes alike. Unk differs (SentencePiece writes ' ⁇ ',
  HF skips it as special), and so do leading spaces: from ids that start with pieces '▁', '▁'
  (which encode never gives), SentencePiece drops every leading space, HF only the first."""
  _, vocab, _, tok = exported
  encoded = [vocab.encode(text) for text in texts if text not in SENTINEL_TEXTS]
  for ids in [ids + [EOS_ID, PAD_ID, PAD_ID] for ids in encoded if UNK_ID not in ids]:
    assert tok.decode(ids, skip_special_tokens=True) == vocab.decode(ids)
  rng = np.random.default_rng(0)
  for size in range(1, 100):
    ids = rng.integers(UNK_ID + 1, vocab.num_pieces, size).tolist() + [EOS_ID, PAD_ID]
    assert tok.decode(ids, skip_special_tokens=True).lstrip(' ') == vocab.decode(ids)


@pytest.mark.parametrize('name', ['T5Tokenizer', 'T5TokenizerFast'])
def test_explicit_classes_load_the_folder(exported, texts, name):
  if not hasattr(transformers, name):
    pytest.skip(f'transformers {transformers.__version__} has no {name}')
  _, vocab, folder, _ = exported
  tok = getattr(transformers, name).from_pretrained(str(folder))
  assert_encodes_as_t5lite(tok, vocab, texts)
  assert tok.convert_tokens_to_ids('<extra_id_0>') == vocab.sentinel_id(0)


@pytest.mark.parametrize('model_type', ['t5', 'bert', 'roberta', 'gpt2', 'bart', 'electra'])
def test_every_family_folder_loads_t5_tokenizer(trained_model, texts, tmp_path, model_type):
  """AutoTokenizer follows tokenizer_class, not the model_type of the folder's config.json."""
  export_tokenizer(trained_model, str(tmp_path))
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': model_type}))
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert type(tok).__name__ == 'T5Tokenizer'
  assert_encodes_as_t5lite(tok, vocabulary.load_vocabulary(trained_model), texts)


def test_import_gives_the_exported_bytes(exported):
  source, _, folder, _ = exported
  assert import_tokenizer(str(folder)) == source.read_bytes()


def test_import_rebuilds_the_model_from_tokenizer_json(exported, texts, tmp_path):
  """What transformers saves (tokenizer.json, no spiece.model) imports as the same vocabulary:
  same pieces and normalization, so the same ids."""
  source, vocab, _, tok = exported
  tok.save_pretrained(str(tmp_path))
  (tmp_path / 'spiece.model').unlink(missing_ok=True)
  proto = import_tokenizer(str(tmp_path))
  imported = vocabulary.Vocabulary(proto)
  assert imported.vocab_size == vocab.vocab_size
  assert [imported.encode(text) for text in texts] == [vocab.encode(text) for text in texts]
  original, rebuilt = (sentencepiece_model_pb2.ModelProto() for _ in range(2))
  original.ParseFromString(source.read_bytes())
  rebuilt.ParseFromString(proto)
  assert rebuilt.pieces == original.pieces
  assert rebuilt.normalizer_spec == original.normalizer_spec
  saved = json.loads((tmp_path / 'tokenizer.json').read_text())  # as transformers 4 writes it:
  saved['normalizer'] = {'type': 'Sequence', 'normalizers': [
      saved['normalizer'], {'type': 'Replace', 'pattern': {'Regex': ' {2,}'}, 'content': '▁'}]}
  (tmp_path / 'tokenizer.json').write_text(json.dumps(saved))
  assert import_tokenizer(str(tmp_path)) == proto


def test_import_finds_no_tokenizer(tmp_path):
  assert import_tokenizer(str(tmp_path)) is None
  (tmp_path / 'config.json').write_text('{"model_type": "t5"}')
  assert import_tokenizer(str(tmp_path)) is None


def test_import_rejects_what_is_not_a_t5_vocabulary(trained_model, tmp_path):
  spiece, tokenizer_json = tmp_path / 'spiece.model', tmp_path / 'tokenizer.json'
  spiece.write_bytes(b'not a model')
  with pytest.raises(ValueError, match=f'^{re.escape(str(spiece))} is not a Sentence') as error:
    import_tokenizer(str(tmp_path))
  assert '\n' not in str(error.value)
  corpus = pathlib.Path(trained_model).parent.parent / 'corpus.txt'
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / 'own'),
                                 vocab_size=100, minloglevel=2)  # its own ids: unk 0, bos 1, eos 2
  shutil.copy(tmp_path / 'own.model', spiece)
  with pytest.raises(ValueError, match=f"^{re.escape(str(spiece))} has .* not T5's"):
    import_tokenizer(str(tmp_path))
  spiece.unlink()
  tokenizer_json.write_text('{"model": ')
  with pytest.raises(ValueError, match=f'^{re.escape(str(tokenizer_json))} is not JSON'):
    import_tokenizer(str(tmp_path))
  tokenizers.Tokenizer(tokenizers.models.BPE()).save(str(tokenizer_json))
  with pytest.raises(ValueError, match="not a SentencePiece unigram .* type 'BPE'"):
    import_tokenizer(str(tmp_path))
  tokenizers.Tokenizer(tokenizers.models.Unigram([('<unk>', 0.0), ('a', -1.0)], 0)).save(
      str(tokenizer_json))
  with pytest.raises(ValueError, match="does not end in T5's sentinels"):
    import_tokenizer(str(tmp_path))
