"""PEGASUS's principal sentences (Zhang et al. 2020; gap sentences), as LongT5 pretrained with
them (Guo et al. 2022: its "PSG"), for encoder-decoder models.

The sentences of a chunk most like the rest of it are taken out of the inputs, each replaced by
one mask (`<extra_id_0>`), and the decoder generates them in order:
  raw     S1 S2 S3 S4 S5        S2 and S4 score highest
  inputs  S1 <M> S3 <M> S5 EOS
  targets S2 S4 EOS
Settings of LongT5's parser (google-research/longt5, preprocessors.py: PEGASUS's
`dynamic_rouge`): each sentence is scored by ROUGE-1 F against the rest of the text ("Ind-Orig":
independently, counting repeated words), the score times 1 + 0.2 * N(0, 0.2) noise; the number
chosen is the sentence count times `data.noise_density` (LongT5's 0.2) times U(0.33, 1),
truncated, at least 1; a chosen sentence is masked with probability 0.9 and left in the inputs
otherwise (it is still a target). Targets longer than `data.targets_length` are cut there, EOS
kept; the inputs are never longer than the raw chunk and EOS (`data.inputs_length`).

What differs from LongT5's parser: the document is the chunk (t5lite concatenates documents
and cuts chunks, as T5 does for span corruption); sentences end after a run of '.', '!', '?'
pieces (PEGASUS splits the text after such a run and a space); a word is a piece's letters and
digits (`Vocabulary.unigram_ids`), so a word of two pieces counts twice; the mask is the first
sentinel, where LongT5's wrote id 2 (PEGASUS's sentence mask, T5's <unk>); and the noise is drawn
from each example's seed (PEGASUS's C++ op drew the same noise for every document).
"""

import ml_collections

from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base
from t5lite.token_ids import EOS_ID

ROUGE_NOISE = 0.2  # score * (1 + ROUGE_NOISE * N(0, ROUGE_NOISE))
MIN_RATIO = 0.33  # of noise_density: the sentence ratio is U(MIN_RATIO, 1) * noise_density
MASKED = 0.9  # a chosen sentence is masked; left in the inputs otherwise


class PrincipalSentences(base.EncoderDecoderObjective):
  name = 'principal_sentences'
  settings = ('noise_density',)

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """inputs_length - 1: masking only shortens the chunk, and EOS ends it."""
    base.at_least(data, 'targets_length', 2)
    return base.at_least(data, 'inputs_length', 2) - 1

  def transform(self, examples, data, vocab):
    return mask_principal_sentences(examples, vocab.sentinel_id(0), vocab.sentence_end_ids(),
                                    vocab.unigram_ids(), data.noise_density, data.targets_length)


def mask_principal_sentences(dataset, mask_id: int, sentence_end_ids, unigram_ids,
                             sentence_ratio: float, targets_length: int):
  """{'targets': raw tokens, 'seed'} -> {'inputs', 'targets'}, each ending in EOS.
    raw A B . C D . E F .  (C D . chosen and masked)  ->  inputs A B . <M> E F . EOS
                                                          targets C D . EOS
  """
  words = tf.constant(unigram_ids, tf.int32)

  def mask(example):
    tokens = example['targets']
    score_seed, ratio_seed, masked_seed = tf.unstack(
        tf.random.experimental.stateless_split(example['seed'], 3))
    sentence = sentence_ids(tokens, sentence_end_ids)
    num_sentences = sentence[-1] + 1
    scores = rouge1_against_rest(tf.gather(words, tokens), sentence, num_sentences)
    chosen = principal(scores, sentence_ratio, score_seed, ratio_seed)  # (sentences,) bool
    masked = chosen & (tf.random.stateless_uniform([num_sentences], masked_seed) < MASKED)
    token_chosen, token_masked = tf.gather(chosen, sentence), tf.gather(masked, sentence)
    first = tf.concat([[True], sentence[1:] != sentence[:-1]], 0)  # a sentence's first token
    inputs = tf.where(token_masked & first, tf.constant(mask_id, tokens.dtype), tokens)
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {'inputs': tf.concat([tf.boolean_mask(inputs, ~token_masked | first), eos], 0),
            'targets': tf.concat([tf.boolean_mask(tokens, token_chosen)[:targets_length - 1],
                                  eos], 0)}

  return parallel_map(dataset, mask)


def sentence_ids(tokens, sentence_end_ids):
  """Each token's sentence, counted from 0: a sentence ends after a run of end pieces.
    tokens A B . C ? ! D  ->  0 0 0 1 1 1 2
  """
  ends = tf.constant(sentence_end_ids, tokens.dtype, shape=[len(sentence_end_ids)])
  is_end = tf.reduce_any(tokens[:, None] == ends[None, :], axis=1)  # (n, ends) -> (n,)
  last = is_end & ~tf.concat([is_end[1:], [False]], 0)  # the last end piece of a run
  return tf.cumsum(tf.cast(last, tf.int32), exclusive=True)


def rouge1_against_rest(words, sentence, num_sentences):
  """ROUGE-1 F of each sentence against the rest of the text, as PEGASUS computes it: words
  (n,) each token's word (0: none, not counted), sentence (n,) -> (num_sentences,) float32.

  A sentence's overlap is the sum over its words w of min(its count of w, the rest's), the rest's
  count being the text's less the sentence's; precision divides it by the sentence's words,
  recall by the rest's. E.g. sentences [a b] [a c] [a]: the first overlaps the rest [a c a] in
  one word (P 1/2, R 1/3, F 0.4).
  """
  real = words > 0
  words, sentence = tf.boolean_mask(words, real), tf.boolean_mask(sentence, real)
  in_text = _count_of_each(words)  # (m,) each token's word's count in the text
  pair = tf.cast(sentence, tf.int64) * (tf.cast(tf.reduce_max(words), tf.int64) + 1) + tf.cast(
      words, tf.int64)
  in_sentence = _count_of_each(pair)  # ... and in its own sentence
  # one term per (sentence, word) pair: at the pair's first token
  _, pair_index = tf.unique(pair)
  position = tf.range(tf.size(pair))
  first = tf.gather(tf.math.unsorted_segment_min(position, pair_index, tf.size(pair)),
                    pair_index) == position
  overlap = tf.math.unsorted_segment_sum(
      tf.where(first, tf.minimum(in_sentence, in_text - in_sentence), 0), sentence,
      num_sentences)
  length = tf.math.unsorted_segment_sum(tf.ones_like(sentence), sentence, num_sentences)
  overlap, length = tf.cast(overlap, tf.float32), tf.cast(length, tf.float32)
  precision = overlap / tf.maximum(length, 1.0)
  recall = overlap / tf.maximum(tf.cast(tf.size(words), tf.float32) - length, 1.0)
  both = (precision > 0) & (recall > 0)
  return tf.where(both, 2 * precision * recall / tf.where(both, precision + recall, 1.0), 0.0)


def _count_of_each(keys):
  """(m,) -> (m,) int32: how many of `keys` equal each one."""
  _, index, counts = tf.unique_with_counts(keys)
  return tf.gather(counts, index)


def principal(scores, sentence_ratio: float, score_seed, ratio_seed):
  """(sentences,) bool: the sentences with the top noisy scores, as many as LongT5's parser
  chooses: int(count * sentence_ratio * U(MIN_RATIO, 1)), at least 1."""
  count = tf.size(scores)
  noise = tf.random.stateless_normal([count], score_seed, stddev=ROUGE_NOISE)
  ratio = sentence_ratio * tf.random.stateless_uniform([], ratio_seed, MIN_RATIO, 1.0)
  number = tf.minimum(tf.maximum(tf.cast(tf.cast(count, tf.float32) * ratio, tf.int32), 1),
                      count)
  top = tf.math.top_k(scores * (1 + ROUGE_NOISE * noise), number).indices
  return tf.scatter_nd(top[:, None], tf.ones_like(top, tf.bool), [count])


OBJECTIVE = PrincipalSentences()
