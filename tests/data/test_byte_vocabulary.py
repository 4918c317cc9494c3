"""The byte vocabulary (data.vocabulary='bytes') gives transformers' ByT5Tokenizer's ids exactly,
decodes as it does (a cut character dropped), and is known by its digest."""

import hashlib

import numpy as np
import pytest

from t5lite.data import vocabulary
from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID

transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

BYTES = vocabulary.load_vocabulary('bytes')
# Latin, Cyrillic, Greek, Devanagari, Arabic, CJK, Hangul, emoji (with a joiner and a modifier),
# combining marks, the special tokens ByT5Tokenizer reads in text, and odd whitespace
HAND_PICKED = [
    'The whale, Ahab said.', 'Ёжик в тумане', 'Ἐν ἀρχῇ ἦν ὁ λόγος', 'नमस्ते दुनिया',
    'مرحبا بالعالم', '鲸鱼在海里游泳。', '고래가 바다에서 헤엄친다', '🐋 👨\u200d👩\u200d👧 👍🏽',
    'e\u0301 n\u0303', 'a<extra_id_0>b <extra_id_1> c </s> d <pad>e<unk> f', '<extra_id_124>',
    '<extra_id_125> <extra_id_07> <extra_id_-1>', ' \t lead and trail \n', '', '\x00\x7f',
]


@pytest.fixture(scope='module')
def byt5():
  return transformers.ByT5Tokenizer()


def test_ids_are_byt5_tokenizer_s(byt5):
  assert (BYTES.num_pieces, BYTES.vocab_size, len(byt5)) == (259, 384, 384)
  assert [BYTES.sentinel_id(n) for n in (0, 1, 124)] == byt5.convert_tokens_to_ids(
      ['<extra_id_0>', '<extra_id_1>', '<extra_id_124>']) == [259, 260, 383]
  assert (byt5.pad_token_id, byt5.eos_token_id, byt5.unk_token_id) == (PAD_ID, EOS_ID, UNK_ID)
  with pytest.raises(ValueError, match=r'sentinels 0\.\.124'):
    BYTES.sentinel_id(125)
  for text in HAND_PICKED:
    assert BYTES.encode(text) == byt5(text, add_special_tokens=False).input_ids, text


def test_text_of_every_plane_encodes_and_decodes_as_byt5_tokenizer(byt5):
  """Random characters of each of the 17 Unicode planes (surrogates left out: UTF-8 cannot hold
  them), mixed with ASCII and sentinels."""
  rng = np.random.default_rng(0)
  for plane in range(17):
    points = rng.integers(plane << 16, (plane + 1) << 16, 200)
    points = points[(points < 0xD800) | (points > 0xDFFF)]
    text = ''.join(chr(p) for p in points) + ' x <extra_id_3> ' + ''.join(
        chr(p) for p in rng.integers(32, 127, 20))
    ids = BYTES.encode(text)
    assert ids == byt5(text, add_special_tokens=False).input_ids
    assert BYTES.decode(ids) == byt5.decode(ids) == text


def test_encode_ids_reads_no_special_tokens():
  text = 'a <extra_id_0> é'
  assert BYTES.encode_ids([text])[0] == [b + 3 for b in text.encode('utf-8')]
  assert BYTES.stored([text, 'ü']).tolist() == list((text + 'ü').encode('utf-8'))
  assert BYTES.stored([]).dtype == np.uint8 and BYTES.stored([]).size == 0
  assert BYTES.encode_ids(['\ud800']) == [[ord('?') + 3]]  # a lone surrogate, which UTF-8 lacks


def test_cut_characters_decode_as_byt5_tokenizer(byt5):
  """Every way a multi-byte character can be cut short, alone, between text, before a sentinel
  or unk, and random id sequences over the whole vocabulary."""
  for text in ('鲸', 'ж', '🐋', 'न'):
    whole = list(text.encode('utf-8'))
    for cut in range(1, len(whole)):
      for ids in ([b + 3 for b in whole[:cut]],
                  [100] + [b + 3 for b in whole[:cut]] + [101],
                  [b + 3 for b in whole[:cut]] + [259, 2, 100],
                  [b + 3 for b in whole[cut:]] + [101]):
        assert BYTES.decode(ids) == byt5.decode(ids), ids
  rng = np.random.default_rng(1)
  for _ in range(300):
    ids = rng.integers(UNK_ID, BYTES.vocab_size, rng.integers(1, 30)).tolist()
    assert BYTES.decode(ids) == byt5.decode(ids), ids


def test_decode_stops_at_eos_and_drops_pads(byt5):
  ids = BYTES.encode('hé')
  assert BYTES.decode([PAD_ID, *ids, PAD_ID, EOS_ID, 100]) == 'hé'
  assert BYTES.decode([*ids, 400]) == 'hé<unk>'  # past the vocabulary: unk
  assert BYTES.sentence_end_ids() == BYTES.encode('.!?')


def test_the_byte_vocabulary_is_known_by_its_description():
  assert BYTES.digest == hashlib.sha256(vocabulary.BYTES_DESCRIPTION.encode()).hexdigest()
  assert BYTES.identity('bytes') == {'name': 'bytes', 'sha256': BYTES.digest, 'size': 384}
  bundled = vocabulary.load_vocabulary('bundled')
  with pytest.raises(ValueError, match=r'made with the vocabulary .bytes. \(sha256 '
                     f'{BYTES.digest[:12]}\\), and x is another .* '
                     r'\(--config.data.vocabulary=bytes\)$'):
    bundled.check_same(BYTES.identity('bytes'), 'x', 'the store')
  BYTES.check_same(BYTES.identity('anything'), 'x', 'the store')  # the same by content
