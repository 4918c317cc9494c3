"""The vocabulary has T5's ids and sentinels; train_tokenizer makes such vocabularies."""

import pytest
import sentencepiece as spm

from t5lite.data import vocabulary


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
  path = vocabulary.train_tokenizer([str(corpus)], 60, str(tmp_path / 'spm'))
  vocab = vocabulary.load_vocabulary(path)
  assert (vocab.num_pieces, vocab.vocab_size, vocab.sentinel_id(0)) == (60, 160, 159)
  assert vocab.decode(vocab.encode('ships and whales')) == 'ships and whales'
  with pytest.raises(ValueError, match=r'^--vocab_size=50000 does not fit --input .*: '
                     r'Vocabulary size too high \(50000\)'):
    vocabulary.train_tokenizer(str(corpus), 50000, str(tmp_path / 'big'))


def test_bad_vocabularies_fail_with_one_line(tmp_path):
  with pytest.raises(ValueError, match='no such file'):
    vocabulary.load_vocabulary(str(tmp_path / 'missing.model'))
  garbage = tmp_path / 'garbage.model'
  garbage.write_bytes(b'not a model')
  with pytest.raises(ValueError, match='not a SentencePiece model'):
    vocabulary.load_vocabulary(str(garbage))
  corpus = tmp_path / 'c.txt'
  corpus.write_text('some words here and there,\n' * 200)
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / 'bos'),
                                 vocab_size=17, minloglevel=2)  # SentencePiece's ids: unk 0 bos 1
  with pytest.raises(ValueError, match="not T5's"):
    vocabulary.load_vocabulary(str(tmp_path / 'bos.model'))
