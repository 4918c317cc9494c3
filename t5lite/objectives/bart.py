"""BART's denoising (Lewis et al. 2020), for encoder-decoder models.

The sentences of a chunk permuted, then text infilling: 30% of the tokens in Poisson(3) spans,
each span (an empty one too) one mask (`<extra_id_0>`); the decoder reconstructs the original.
  raw A B . C D .  ->  inputs C <M> A B . EOS, targets A B . C D . EOS
The loss is the token cross entropy on the decoder's targets.
"""

import ml_collections

from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base
from t5lite.token_ids import EOS_ID


class Bart(base.EncoderDecoderObjective):
  name = 'bart'
  settings = ('noise_density', 'mean_noise_span_length')

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """targets_length - 1 tokens (the original + EOS); the noised inputs are never longer."""
    targets_length = base.at_least(data, 'targets_length', 2)
    if data.inputs_length < targets_length:
      raise ValueError(f'data.inputs_length={data.inputs_length} is shorter than data.'
                       f'targets_length={targets_length}: bart inputs can be as long as the '
                       'targets')
    return targets_length - 1

  def transform(self, examples, data, vocab):
    return permute_and_infill(examples, vocab.sentinel_id(0), vocab.sentence_end_ids(),
                              data.noise_density, data.mean_noise_span_length)


def permute_and_infill(dataset, mask_id: int, sentence_end_ids, noise_density: float = 0.3,
                       mean_span_length: float = 3.0):
  """BART's denoising: {'targets': raw tokens, 'seed'} -> {'inputs', 'targets'}, each + EOS.

  Inputs: the sentences permuted, then text infilling; targets: the original chunk, which the
  decoder reconstructs. Inputs are never longer than targets.
    targets (raw) A B . C D .  ->  permuted C D . A B .  ->  inputs C <M> A B . EOS
                                                            targets A B . C D . EOS
  """
  def noise(example):
    tokens = example['targets']
    permute_seed, lengths_seed, places_seed = tf.unstack(
        tf.random.experimental.stateless_split(example['seed'], 3))
    inputs = text_infilling(sentence_permutation(tokens, sentence_end_ids, permute_seed),
                            mask_id, noise_density, mean_span_length,
                            tf.stack([lengths_seed, places_seed]))
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {'inputs': tf.concat([inputs, eos], 0), 'targets': tf.concat([tokens, eos], 0)}

  return parallel_map(dataset, noise)


def sentence_permutation(tokens, sentence_end_ids, seed):
  """BART's sentence permutation: the sentences of `tokens` in a random order.

  A sentence ends after any of `sentence_end_ids` (the last may run to the end of the chunk).
    tokens A B . C . D E  ->  sentences [A B .] [C .] [D E]  ->  e.g. C . D E A B .
  """
  ends = tf.constant(sentence_end_ids, tokens.dtype, shape=[len(sentence_end_ids)])
  is_end = tf.reduce_any(tokens[:, None] == ends[None, :], axis=1)  # (n, ends) -> (n,)
  is_end = tf.cast(is_end, tf.int32)
  sentence = tf.cumsum(is_end, exclusive=True)  # (n,) sentence of each token
  # (an end as the last token opens an empty last sentence: harmless anywhere)
  order = tf.random.experimental.stateless_shuffle(tf.range(tf.reduce_sum(is_end) + 1), seed)
  place = tf.math.invert_permutation(order)  # where each sentence goes
  return tf.gather(tokens, tf.argsort(tf.gather(place, sentence), stable=True))


def text_infilling(tokens, mask_id: int, noise_density: float, mean_span_length: float, seeds):
  """BART's text infilling: round(noise_density * n) tokens in `poisson_span_lengths` spans,
  each span (an empty one too) replaced by one `mask_id`; seeds [2, 2]: lengths, then places.

  Spans and the kept tokens are interleaved in a uniformly random order.
    tokens A B C D E F G H I J, spans of 3 and 0 tokens after A and after G
    ->     A <M> E F G <M> H I J
  """
  n = tf.size(tokens)
  num_noise_tokens = tf.cast(tf.round(tf.cast(n, tf.float32) * noise_density), tf.int32)
  span_lengths = poisson_span_lengths(num_noise_tokens, mean_span_length, seeds[0])
  num_spans = tf.size(span_lengths)
  # The output's items: the kept tokens in order, with the spans at random places among them.
  num_items = n - num_noise_tokens + num_spans
  places = tf.sort(tf.random.experimental.stateless_shuffle(tf.range(num_items),
                                                            seeds[1])[:num_spans])
  is_span = tf.scatter_nd(places[:, None], tf.ones_like(places), [num_items]) > 0
  width = tf.tensor_scatter_nd_update(tf.ones([num_items], tf.int32), places[:, None],
                                      span_lengths)  # original tokens each item stands for
  first = tf.minimum(tf.cumsum(width, exclusive=True), n - 1)  # its first original token
  return tf.where(is_span, tf.constant(mask_id, tokens.dtype), tf.gather(tokens, first))


def poisson_span_lengths(num_noise_tokens, mean_span_length: float, seed):
  """Span lengths drawn from Poisson(mean_span_length) until they cover `num_noise_tokens`.

  The last span is cut so that they sum to num_noise_tokens exactly (fairseq's BART), and there
  are at most num_noise_tokens spans (so the infilled text is never longer than the original).
  Spans of length 0 are kept: each inserts a mask. E.g. 8 tokens, draws 3 0 4 2 -> 3 0 4 1.
  """
  draws = tf.random.stateless_poisson([num_noise_tokens], seed, mean_span_length, dtype=tf.int32)
  ends = tf.cumsum(draws)
  num_spans = tf.minimum(tf.reduce_sum(tf.cast(ends < num_noise_tokens, tf.int32)) + 1,
                         num_noise_tokens)
  ends = tf.where(tf.range(num_spans) == num_spans - 1, num_noise_tokens, ends[:num_spans])
  return ends - tf.pad(ends[:-1], [[1, 0]])


OBJECTIVE = Bart()
