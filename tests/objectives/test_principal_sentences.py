"""PEGASUS's principal sentences as LongT5's parser sets them: ROUGE-1 against a plain count, the
number of sentences chosen, the top-scoring ones chosen, 90% of them masked, and inputs and
targets that give back the chunk; each op eagerly and inside tf.data alike."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from t5lite.data import vocabulary
from t5lite.objectives import principal_sentences as ps

VOCAB = vocabulary.load_vocabulary('bundled')
MASK = VOCAB.sentinel_id(0)
ENDS = VOCAB.sentence_end_ids()
PERIOD = VOCAB.encode('.')[-1]


def seed(i):
  return tf.random.experimental.stateless_fold_in(tf.constant([5, 0], tf.int64), i)


def rouge1_by_counting(words, sentence):
  """ROUGE-1 F of each sentence against the rest, with Counters (PEGASUS's rouge.cc)."""
  text = collections.Counter(w for w in words if w)
  scores = []
  for s in range(max(sentence) + 1):
    own = collections.Counter(w for w, t in zip(words, sentence) if t == s and w)
    rest = text - own
    overlap = sum(min(count, rest[w]) for w, count in own.items())
    precision = overlap / max(1, sum(own.values()))
    recall = overlap / max(1, sum(rest.values()))
    scores.append(2 * precision * recall / (precision + recall) if overlap else 0.0)
  return np.array(scores)


def text_of(sentences: int, rng) -> np.ndarray:
  """Token ids of `sentences` random sentences of 2 to 12 words from 40 pieces (no end piece
  among them), each ending '.' (and now and then '. .': one end, a run)."""
  pieces = rng.choice(np.setdiff1d(np.arange(100, 140), ENDS), 200)
  ids = []
  for _ in range(sentences):
    ids += list(rng.choice(pieces, rng.randint(2, 13))) + [PERIOD] * rng.choice([1, 1, 1, 2])
  return np.asarray(ids, np.int32)


def test_words_are_lowercased_letters_and_digits():
  words = VOCAB.unigram_ids()
  the, upper, period = VOCAB.encode('the')[-1], VOCAB.encode('The')[-1], PERIOD
  assert words[the] == words[upper] > 0
  assert words[period] == words[MASK] == words[0] == words[1] == words[2] == 0


def test_sentences_end_after_a_run_of_end_pieces():
  tokens = tf.constant([10, 11, PERIOD, 12, PERIOD, PERIOD, 13], tf.int32)
  np.testing.assert_array_equal(ps.sentence_ids(tokens, ENDS), [0, 0, 0, 1, 1, 1, 2])


@pytest.mark.parametrize('case', range(3))
def test_rouge1_against_the_rest_is_pegasus_count(case):
  rng = np.random.RandomState(case)
  tokens = text_of(12, rng)
  words = VOCAB.unigram_ids()[tokens]
  sentence = ps.sentence_ids(tf.constant(tokens), ENDS).numpy()
  scores = ps.rouge1_against_rest(tf.constant(words), tf.constant(sentence), sentence[-1] + 1)
  np.testing.assert_allclose(scores, rouge1_by_counting(list(words), list(sentence)), rtol=1e-6)


def mask_many(tokens: np.ndarray, count: int, ratio: float = 0.2, targets_length: int = 512):
  dataset = tf.data.Dataset.range(count).map(lambda i: {'targets': tf.constant(tokens),
                                                        'seed': seed(i)})
  return list(ps.mask_principal_sentences(dataset, MASK, ENDS, VOCAB.unigram_ids(), ratio,
                                          targets_length).as_numpy_iterator())


def sentences_of(tokens: np.ndarray) -> list[list[int]]:
  sentence = ps.sentence_ids(tf.constant(tokens), ENDS).numpy()
  return [tokens[sentence == s].tolist() for s in range(sentence[-1] + 1)]


def test_inputs_and_targets_give_back_the_chunk():
  """Each target sentence stands in the inputs as one mask (90%) or as itself (10%); the rest
  are as they were, in order; the counts are LongT5's: int(40 * 0.2 * U(0.33, 1)), 2 to 7."""
  tokens = text_of(40, np.random.RandomState(7))
  sentences = sentences_of(tokens)
  counts, masked, chosen = [], 0, 0
  for example in mask_many(tokens, 300):
    assert example['inputs'][-1] == example['targets'][-1] == 1  # EOS
    inputs, targets = example['inputs'][:-1].tolist(), example['targets'][:-1].tolist()
    rebuilt, position, number = [], 0, 0
    for sentence in sentences:
      at = len(rebuilt)
      if inputs[at:at + 1] == [MASK]:  # chosen and masked
        assert targets[position:position + len(sentence)] == sentence
        position, number, masked = position + len(sentence), number + 1, masked + 1
        rebuilt.append(MASK)
        continue
      assert inputs[at:at + len(sentence)] == sentence
      if targets[position:position + len(sentence)] == sentence:  # chosen, left in the inputs
        position, number = position + len(sentence), number + 1
      rebuilt += sentence
    assert rebuilt == inputs and position == len(targets)
    counts.append(number)
    chosen += number
  assert min(counts) == 2 and max(counts) == 7
  assert abs(masked / chosen - 0.9) < 0.03, masked / chosen


def test_the_top_scoring_sentence_is_always_chosen():
  """Sentences of words seen nowhere else, and one of a word of each of them: it scores 1.5
  times the next, and the 4% noise never reorders them."""
  rng = np.random.RandomState(3)
  words = rng.choice(np.setdiff1d(np.arange(100, 4000), ENDS), 19 * 8, replace=False)
  others = [list(words[i * 8:(i + 1) * 8]) + [PERIOD] for i in range(19)]
  summary = [sentence[0] for sentence in others] + [PERIOD]
  tokens = np.asarray(sum(others[:9], []) + summary + sum(others[9:], []), np.int32)
  sentences = sentences_of(tokens)
  scores = rouge1_by_counting(list(VOCAB.unigram_ids()[tokens]),
                              [s for s, sentence in enumerate(sentences) for _ in sentence])
  best, second = np.argsort(-scores)[:2]
  assert scores[best] > 1.5 * scores[second]
  for example in mask_many(tokens, 50):
    targets = example['targets'][:-1].tolist()
    assert any(targets[i:i + len(sentences[best])] == sentences[best]
               for i in range(len(targets)))


def test_targets_are_cut_to_their_length_with_eos():
  tokens = text_of(40, np.random.RandomState(7))
  for example in mask_many(tokens, 20, ratio=0.9, targets_length=16):
    assert len(example['targets']) == 16 and example['targets'][-1] == 1


def test_same_eagerly_and_in_tf_data():
  tokens = tf.constant(text_of(10, np.random.RandomState(1)))
  eager = next(iter(ps.mask_principal_sentences(
      tf.data.Dataset.from_tensors({'targets': tokens, 'seed': seed(0)}), MASK, ENDS,
      VOCAB.unigram_ids(), 0.2, 64)))
  words = tf.gather(tf.constant(VOCAB.unigram_ids()), tokens)
  sentence = ps.sentence_ids(tokens, ENDS)
  scores = ps.rouge1_against_rest(words, sentence, sentence[-1] + 1)
  in_dataset = next(iter(tf.data.Dataset.from_tensors((words, sentence)).map(
      lambda w, s: ps.rouge1_against_rest(w, s, s[-1] + 1))))
  np.testing.assert_array_equal(scores.numpy(), in_dataset.numpy())
  assert eager['inputs'].shape[0] <= 64 and MASK in eager['inputs'].numpy()
