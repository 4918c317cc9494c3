"""The vocabulary has T5's ids and sentinels; train_tokenizer makes such vocabularies."""

import re

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from t5lite import cli
from t5lite.data import spm_training, vocabulary
from t5lite.objectives import ul2


@pytest.fixture(scope='module')
def vocab():
  return vocabulary.load_vocabulary('bundled')


def test_bundled_vocabulary_has_t5_ids(vocab):
  assert (vocab.num_pieces, vocab.vocab_size) == (8000, 8100)
  assert vocab.sentinel_id(0) == 8099 and vocab.sentinel_id(99) == 8000
  assert vocab.decode([0, 0]) == '' and vocab.encode('') == []
  with pytest.raises(ValueError, match='sentinels 0..99'):
    vocab.sentinel_id(100)


def test_encode_decode_with_sentinels(vocab):
  text = 'The captain <extra_id_0> the whale in <extra_id_1> sea.'
  ids = vocab.encode(text)
  assert ids.count(8099) == 1 and ids.count(8098) == 1 and 1 not in ids and 0 not in ids
  assert vocab.decode(ids) == text
  assert vocab.decode(ids + [1, 50, 60]) == text  # stops at EOS
  assert vocab.decode([8150]) == vocab.decode([2])  # the model's padding rows read as unk


def test_encode_documents_matches_encode(vocab):
  docs = ['Call me Ishmael.', 'It is a truth universally acknowledged.']
  assert [d.tolist() for d in vocab.encode_documents(docs)] == [vocab.encode(d) for d in docs]


def test_train_tokenizer_on_a_text_file(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n\n'.join(f'Document {i} speaks of ships, whales and {i * 7} sailors.'
                                for i in range(300)))
  path = spm_training.train_tokenizer([str(corpus)], 60, str(tmp_path / 'spm'))
  vocab = vocabulary.load_vocabulary(path)
  assert (vocab.num_pieces, vocab.vocab_size, vocab.sentinel_id(0)) == (60, 160, 159)
  assert vocab.decode(vocab.encode('ships and whales')) == 'ships and whales'
  with pytest.raises(ValueError, match=r'^--vocab_size=50000 does not fit --input .*: '
                     r'Vocabulary size too high \(50000\)'):
    spm_training.train_tokenizer(str(corpus), 50000, str(tmp_path / 'big'))


def test_tokenizer_reserves_ul2_modes_as_one_id_each(tmp_path, capsys):
  """`t5lite tokenizer` gives each mode an id of its own (3, 4, 5 after pad, eos and unk), as a
  prompt's first text or after a space, as the bundled vocabulary does; 'bundled-v1', trained
  before, reads any bracket it lacks as unk."""
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n\n'.join(f'Document {i} speaks of ships, whales and {i * 7} sailors.'
                                  for i in range(300)))
  assert cli.main(['tokenizer', f'--input={corpus}', '--vocab_size=60',
                   f'--out={tmp_path / "spm"}']) == 0
  assert capsys.readouterr().out == f'wrote {tmp_path / "spm" / "vocab.model"}\n'
  vocab = vocabulary.load_vocabulary(str(tmp_path / 'spm' / 'vocab.model'))
  modes = {mode: vocab.encode(mode) for mode in ul2.MODES.values()}
  assert modes == {'[NLU]': [3], '[NLG]': [4], '[S2S]': [5]}
  for mode, ids in modes.items():
    assert vocab.decode(ids) == mode
    assert vocab.encode(f'{mode} ships') == ids + vocab.encode('ships')
    assert vocab.encode(f'ships {mode}') == vocab.encode('ships') + ids
  assert 3 not in vocab.encode('{NLU} (NLU) NLU')
  bundled, v1 = vocabulary.load_vocabulary('bundled'), vocabulary.load_vocabulary('bundled-v1')
  assert [bundled.encode(mode) for mode in modes] == [[3], [4], [5]]
  assert v1.encode('[NLU]') == v1.encode('{NLU}') == [39, 2, 1294, 1057, 1288, 2]
  assert vocab.num_pieces == 60 and bundled.num_pieces == v1.num_pieces == 8000


def test_the_bundled_vocabulary_is_the_tokenizer_s_on_the_bundled_corpus_and_v1_the_one_before():
  """The digests the docs give (t5lite/data/vocabulary.py); the same pieces, v1's 3 ids lower."""
  bundled, v1 = vocabulary.load_vocabulary('bundled'), vocabulary.load_vocabulary('bundled-v1')
  assert bundled.digest[:12] == '0d31e49c9b56' and v1.digest[:12] == '356521ec85a9'
  text = 'The captain walks in the park.'
  assert bundled.encode(text) == [i + 3 for i in v1.encode(text)] == [33, 2497, 1103, 12, 13, 6,
                                                                       2912, 9]


def cut_at_piece(model: bytes, pieces: int) -> bytes:
  """The first bytes of `model`, up to the end of its first `pieces` pieces (a valid protobuf)."""
  proto = sentencepiece_model_pb2.ModelProto()
  proto.pieces.extend(sentencepiece_model_pb2.ModelProto.FromString(model).pieces[:pieces])
  size = len(proto.SerializeToString())
  assert model[:size] == proto.SerializeToString()
  return model[:size]


def test_bad_vocabularies_fail_with_one_line_naming_the_flag(vocab, tmp_path):
  model = vocab.model_proto
  # protobuf reads a model cut after its 100th piece as a model of 100 pieces, with T5's ids
  assert spm.SentencePieceProcessor(model_proto=cut_at_piece(model, 100)).get_piece_size() == 100
  broken = {'garbage.model': b'not a model', **{
      f'short{size}.model': model[:size]
      for size in (0, 100, len(cut_at_piece(model, 100)), len(model) // 2, len(model) - 1)}}
  for name, content in broken.items():
    (tmp_path / name).write_bytes(content)
    for flag in ('data.vocabulary', '--vocabulary'):
      with pytest.raises(ValueError, match=re.escape(
          f'{flag}: {tmp_path / name} is not a SentencePiece model '
          '(cut short, or another kind of file)') + '$'):
        vocabulary.load_vocabulary(str(tmp_path / name), flag)
  with pytest.raises(ValueError, match='^--vocabulary: no such file'):
    vocabulary.load_vocabulary(str(tmp_path / 'missing.model'), '--vocabulary')
  corpus = tmp_path / 'c.txt'
  corpus.write_text('some words here and there,\n' * 200)
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / 'bos'),
                                 vocab_size=17, minloglevel=2)  # SentencePiece's ids: unk 0 bos 1
  with pytest.raises(ValueError, match=re.escape(
      f"data.vocabulary: {tmp_path / 'bos.model'} has (pad, eos, unk, bos) ids (-1, 2, 0, 1), "
      "not T5's (0, 1, 2, -1)")):
    vocabulary.load_vocabulary(str(tmp_path / 'bos.model'))


def test_mixture_counts_follow_each_corpus_size_to_the_alpha():
  """mT5's sampling: corpus i's share is n_i ** alpha / sum_j n_j ** alpha of all sentences."""
  assert spm_training.mixture_counts([900, 100], 0.5) == [750, 250]  # 30:10
  assert spm_training.mixture_counts([900, 100], 1.0) == [900, 100]
  sizes = [8000, 1000, 125]
  counts = spm_training.mixture_counts(sizes, 0.3)
  shares = np.power(sizes, 0.3) / np.power(sizes, 0.3).sum()
  np.testing.assert_allclose(np.array(counts) / sum(sizes), shares, atol=1 / sum(sizes))


def test_a_multilingual_vocabulary_keeps_a_small_language_s_characters(tmp_path, capsys):
  """Two corpora of 3,000 sentences and one of 5: read once at T5's character coverage
  (0.9999), the small one's rarest letters are unk; sampled at alpha 0.3 with mT5's coverage
  (0.99999) they are pieces, and `t5lite tokenizer` writes that vocabulary."""
  rng = np.random.default_rng(0)
  letters = {'en': 'abcdefghijklmnoprstuvw', 'ru': 'абвгдежзиклмнопрстуф',
             'hi': 'कखगचजतदनपबमयरलवसह'}
  for language, count in (('en', 3000), ('ru', 3000), ('hi', 5)):
    words = [''.join(rng.choice(list(letters[language]), rng.integers(3, 7))) for _ in range(30)]
    (tmp_path / f'{language}.txt').write_text('\n\n'.join(
        ' '.join(rng.choice(words, 8)) + '.' for _ in range(count)), encoding='utf-8')
  inputs = [str(tmp_path / f'{language}.txt') for language in ('en', 'ru', 'hi')]
  hindi = (tmp_path / 'hi.txt').read_text(encoding='utf-8')

  def unknown_in_hindi(**settings) -> int:
    path = spm_training.train_tokenizer(inputs, 100, str(tmp_path / str(settings)), **settings)
    return vocabulary.load_vocabulary(path).encode(hindi).count(2)

  once, sampled = unknown_in_hindi(), unknown_in_hindi(alpha=0.3, character_coverage=0.99999)
  print(f'unk ids in the Hindi corpus: {once} read once, {sampled} sampled at alpha 0.3')
  assert once > 0 and sampled == 0
  assert cli.main(['tokenizer', *(f'--input={i}' for i in inputs), '--vocab_size=100',
                   '--alpha=0.3', '--character_coverage=0.99999', f'--out={tmp_path / "cli"}']
                  ) == 0
  assert (tmp_path / 'cli' / 'vocab.model').read_bytes() == (
      tmp_path / str({'alpha': 0.3, 'character_coverage': 0.99999}) / 'vocab.model').read_bytes()
