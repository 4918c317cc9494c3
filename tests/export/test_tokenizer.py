"""Tokenizer export: transformers' AutoTokenizer, loaded offline from the exported files, gives
t5lite's ids for every text, with the bundled vocabulary and with one trained here, and around
them the special tokens each family's model read in pretraining; import reads the SentencePiece
model back, from spiece.model or from the tokenizer.json transformers saves.
"""

import json
import pathlib
import re
import shutil

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from t5lite.data import sources, spm_training, vocabulary
from t5lite.export.tokenizer import FILES, export_tokenizer, import_tokenizer
from t5lite.models import hf_mapping
from t5lite.models.registry import FAMILIES
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
               'Ünïcödé café — “quoted” it’s naïve 日本語 ﬁ ① ｆｕｌｌ 😀😀 x',
               '[NLU] UL2\'s modes: [NLG], x[S2S]y and  [S2S]']  # pieces of a trained vocabulary


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
  return spm_training.train_tokenizer([str(folder / 'corpus.txt')], 300, str(folder / 'spm'))


@pytest.fixture(scope='module', params=['bundled', 'trained'])
def exported(request, trained_model, tmp_path_factory):
  """(source .model path, t5lite's Vocabulary, export folder, AutoTokenizer of the folder)."""
  spec = 'bundled' if request.param == 'bundled' else trained_model
  source = BUNDLED_MODEL if spec == 'bundled' else pathlib.Path(trained_model)
  folder = tmp_path_factory.mktemp(f'hf_{request.param}')
  export_tokenizer(spec, str(folder), hf_mapping.T5_TEXT, model_max_length=MAX_LENGTH)
  tok = transformers.AutoTokenizer.from_pretrained(str(folder))
  return source, vocabulary.load_vocabulary(spec), folder, tok


def assert_encodes_as_t5lite(tok, vocab, texts):
  for text in texts:
    assert tok(text, add_special_tokens=False).input_ids == vocab.encode(text), text
    assert tok(text).input_ids == vocab.encode(text) + [EOS_ID], text


def test_export_writes_the_files_hf_reads(exported, tmp_path):
  """spiece.model is the source's bytes, and tokenizer.json what transformers converts it to."""
  source, vocab, folder, tok = exported
  assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
  assert (folder / 'spiece.model').read_bytes() == source.read_bytes()
  shutil.copy(source, tmp_path / 'spiece.model')
  (tmp_path / 'tokenizer_config.json').write_text('{"tokenizer_class": "T5Tokenizer"}')
  transformers.AutoTokenizer.from_pretrained(str(tmp_path)).save_pretrained(str(tmp_path / 'hf'))
  assert (json.loads((folder / 'tokenizer.json').read_text())
          == json.loads((tmp_path / 'hf' / 'tokenizer.json').read_text()))
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


HF_MODELS = {hf.architecture: hf for family in FAMILIES.values() for hf in family.hf}
MASKED = {'BertForMaskedLM', 'RobertaForMaskedLM', 'ElectraForMaskedLM', 'BertForPreTraining',
          'BertForNextSentencePrediction'}  # pretrained on text masked with <extra_id_0>


def pretraining_row(architecture: str, vocab, a: list[int], b: list[int]
                    ) -> tuple[list[int], list[int]]:
  """Texts a and b (ids) as the model's pretraining rows hold them (t5lite/objectives/), and
  the token types: T5's and BART's inputs end in EOS, GPT-2's rows start with the start token 0
  and never end, MLM rows are text alone, BERT's pairs are [CLS] A [SEP] B [SEP] (<extra_id_1>,
  <extra_id_2>), B's of type 1."""
  if architecture.startswith(('T5', 'MT5', 'UMT5', 'Bart')):
    ids = a + [EOS_ID] + (b + [EOS_ID] if b else [])
  elif architecture == 'GPT2LMHeadModel':
    ids = [PAD_ID] + a + b
  elif architecture.startswith('BertFor') and architecture != 'BertForMaskedLM':
    cls, sep = vocab.sentinel_id(1), vocab.sentinel_id(2)
    first = [cls] + a + [sep]
    return first + (b + [sep] if b else []), [0] * len(first) + [1] * (len(b) + 1 if b else 0)
  else:
    ids = a + b
  return ids, [0] * len(ids)


@pytest.mark.parametrize('architecture', sorted(HF_MODELS))
def test_every_family_folder_adds_what_its_model_read(trained_model, texts, tmp_path,
                                                      architecture):
  """AutoTokenizer follows tokenizer_class, not the model_type of the folder's config.json, and
  adds by default what `pretraining_row` says; token types only where the model reads them."""
  hf = HF_MODELS[architecture]
  vocab = vocabulary.load_vocabulary(trained_model)
  export_tokenizer(trained_model, str(tmp_path), hf.text)
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': hf.model_type}))
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  # transformers 5.23 reads a umt5 folder's tokenizer.json with its generic class, whatever
  # tokenizer_class says
  assert type(tok).__name__ == ('T5Tokenizer' if hf.model_type in ('t5', 'mt5', 'bart') else
                                'TokenizersBackend')
  for text in texts:
    ids = vocab.encode(text)
    assert tok(text, add_special_tokens=False).input_ids == ids, text
    assert tok(text).input_ids == pretraining_row(architecture, vocab, ids, [])[0], text
  a, b = texts[0][:200], texts[1][:200]
  ids, types = pretraining_row(architecture, vocab, vocab.encode(a), vocab.encode(b))
  pair = tok(a, b)
  assert pair.input_ids == ids
  assert pair.get('token_type_ids', [0] * len(ids)) == types
  assert ('token_type_ids' in pair) == any(types)  # HF's T5 and GPT-2 take no types
  assert tok.mask_token_id == (vocab.sentinel_id(0) if architecture in MASKED else None)


@pytest.mark.parametrize('text', [hf_mapping.T5_TEXT, hf_mapping.CAUSAL_TEXT])
def test_a_causal_lm_decodes_its_continuation_with_its_space(text, trained_model, tmp_path):
  """HF's text-generation pipeline writes the prompt, then the decoded new tokens: those of a
  causal LM keep their first space; T5's decode as SentencePiece does, without it."""
  export_tokenizer(trained_model, str(tmp_path), text)
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  vocab = vocabulary.load_vocabulary(trained_model)
  prompt, continuation = vocab.encode('The first'), vocab.encode('and the second')
  assert tok.decode(continuation) == (' and the second' if text.continues else 'and the second')
  assert vocab.decode(prompt + continuation) == 'The first and the second'


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
  imported = vocabulary.SentencePieceVocabulary(proto)
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
