"""The family's pretraining objectives as tf.data transforms, peers in one module.

Each objective is a Dataset -> Dataset function from raw chunks {'targets': tokens, 'seed':
int64[2]} to the features its model family trains on; per-example ops work on tensors (eagerly
or traced). Randomness is stateless: each example carries its own `seed`, so an example is a
function of (seed, tokens) wherever and whenever it is computed. The pipeline seeds example i of
the stream, so a chunk seen again in a later epoch is corrupted anew (dynamic masking).

- `span_corruption` (T5; Raffel et al. 2020, section 3.1.4), named as `t5.data.preprocessors`.
- `mlm` (BERT, RoBERTa; the inputs of ELECTRA): 15% of tokens selected, 80/10/10.
- `mlm_nsp` (BERT with next-sentence prediction): [CLS] A [SEP] B [SEP], B the text after A
  or from elsewhere, half and half; MLM over A and B.
- `causal_lm` (GPT) and `prefix_lm` (T5's prefix LM for a decoder-only model).
- `prefix_to_targets` (T5's prefix LM for an encoder-decoder: UL2's S-denoiser). Its and span
  corruption's inputs start with the example's `mode` ids if it has them (UL2's mode tokens).
- `bart` (Lewis et al. 2020): sentence permutation, then text infilling with Poisson(3) spans.

The vocabulary has no [MASK], [CLS] or [SEP] piece: MLM and BART mask with `<extra_id_0>`
(vocab_size - 1) and next-sentence prediction marks with `<extra_id_1>` as [CLS] and
`<extra_id_2>` as [SEP], so any T5 vocabulary serves.

Span corruption of one example, 10 tokens, noise spans [C D] and [I J] (T5's masks start with
non-noise and end with noise):
  targets (raw)  A B C D E F G H I J     noise_mask 0 0 1 1 0 0 0 0 1 1
  inputs  ->     A B <X0> E F G H <X1> EOS
  targets ->     <X0> C D <X1> I J EOS
where <X0> = <extra_id_0> = vocab_size - 1, <X1> = vocab_size - 2.
"""

from t5lite.data.tf_setup import plain, tf

from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID


def _random_segmentation(num_items, num_segments, seed):
  """Lengths of `num_segments` non-empty segments that partition `num_items`, all equally likely.

  Chooses num_segments - 1 distinct cut points among the num_items - 1 gaps.
  """
  gaps = tf.random.experimental.stateless_shuffle(tf.range(1, num_items), seed)
  bounds = tf.concat([[0], tf.sort(gaps[:num_segments - 1]), [num_items]], axis=0)
  return bounds[1:] - bounds[:-1]


def random_spans_noise_mask(length, noise_density, mean_noise_span_length, seeds):
  """Boolean mask of `length` made of alternating non-noise/noise spans, non-noise first.
  (`noise_density` and `mean_noise_span_length`: floats, or an example's float32 scalars.)

  round(length * noise_density) noise tokens in round(noise / mean_noise_span_length) spans;
  span lengths are a uniformly random segmentation (seeds: two stateless seeds, shape [2, 2]).
  E.g. length 10, density 0.3, mean 2 -> 3 noise tokens in 2 spans: [0 0 1 1 0 0 0 1 0 0].
  """
  orig_length = length
  length = tf.maximum(length, 2)  # degenerate lengths still get one noise and one clean token
  num_noise_tokens = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
  num_noise_tokens = tf.clip_by_value(num_noise_tokens, 1, length - 1)
  num_noise_spans = tf.cast(
      tf.round(tf.cast(num_noise_tokens, tf.float32) / mean_noise_span_length), tf.int32)
  num_noise_spans = tf.maximum(num_noise_spans, 1)
  noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans, seeds[0])
  nonnoise_span_lengths = _random_segmentation(length - num_noise_tokens, num_noise_spans,
                                               seeds[1])
  span_lengths = tf.reshape(tf.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [-1])
  is_noise_span = tf.tile([False, True], [num_noise_spans])
  return tf.repeat(is_noise_span, span_lengths)[:orig_length]


def noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id: int):
  """Replaces each noise span with one sentinel, counting down from `sentinel_id` (<extra_id_0>).

  tokens [A B C D E], noise_mask [0 1 1 0 1] -> [A <X0> D <X1>].
  """
  previous_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
  span_start = noise_mask & ~previous_is_noise
  sentinels = sentinel_id + 1 - tf.cumsum(tf.cast(span_start, tokens.dtype))
  tokens = tf.where(span_start, sentinels, tokens)
  return tf.boolean_mask(tokens, ~(noise_mask & previous_is_noise))


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id: int):
  """The targets side: each non-noise span becomes a sentinel, noise tokens stay.

  tokens [A B C D E], noise_mask [0 1 1 0 1] -> [<X0> B C <X1> E].
  """
  return noise_span_to_unique_sentinel(tokens, ~noise_mask, sentinel_id)


def _map(dataset: tf.data.Dataset, fn) -> tf.data.Dataset:
  return dataset.map(plain(fn), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def span_corruption(dataset: tf.data.Dataset, sentinel_id: int) -> tf.data.Dataset:
  """{'targets': raw tokens, 'seed': int64[2], 'noise_density', 'mean_noise_span_length', and
  optionally 'mode'} -> {'inputs', 'targets'}, each ending in EOS, the inputs starting with
  the mode's ids. Each example carries its own noise: a mixture's differ row by row.

  Split the text into chunks of `random_spans_helper(inputs_length)[0]` tokens first (in
  t5lite/objectives/span_corruption.py), as T5 does, and the outputs have exactly
  inputs_length and targets_length tokens.
  """
  def corrupt(example):
    tokens = example['targets']
    seeds = tf.random.experimental.stateless_split(example['seed'], 2)
    noise_mask = random_spans_noise_mask(tf.size(tokens), example['noise_density'],
                                         example['mean_noise_span_length'], seeds)
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {
        'inputs': tf.concat([*_mode(example, tokens.dtype),
                             noise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id), eos],
                            axis=0),
        'targets': tf.concat(
            [nonnoise_span_to_unique_sentinel(tokens, noise_mask, sentinel_id), eos], axis=0),
    }

  return _map(dataset, corrupt)


def _mode(example: dict, dtype) -> list:
  """The ids an example's inputs start with (UL2's mode token, e.g. the encoded text [NLU]),
  as a list of one tensor: its 'mode', padded with PAD_ID to the longest of its chain's; []
  without one (no op on a mode-less chain's examples)."""
  if 'mode' not in example:
    return []
  mode = tf.cast(example['mode'], dtype)
  return [tf.boolean_mask(mode, mode != PAD_ID)]


def bert_mask(tokens, seed, mask_id: int, num_pieces: int, noise_density: float = 0.15,
              mask_rate: float = 0.8, random_rate: float = 0.1):
  """BERT's masking of one example: tokens (n,) -> (inputs, targets), both (n,).

  round(noise_density * n) positions (at least one) are selected, as BERT's
  create_pretraining_data does; each becomes `mask_id` with probability `mask_rate`, a random
  piece of [UNK_ID + 1, num_pieces) (never pad, eos, unk or a sentinel) with probability
  `random_rate`, else stays. Targets hold the original token where selected and 0 (padding,
  no loss) elsewhere, so the original text is where(targets > 0, targets, inputs).
    tokens  A B C D E F G H I J    selected C F I: C masked, F random, I kept
    inputs  A B <M> D E R G H I J
    targets 0 0 C 0 0 F 0 0 I 0
  where <M> = mask_id (the pipeline's <extra_id_0>) and R a random piece.
  """
  select_seed, action_seed, random_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 3))
  n = tf.size(tokens)
  num_selected = tf.cast(tf.round(tf.cast(n, tf.float32) * noise_density), tf.int32)
  num_selected = tf.clip_by_value(num_selected, tf.minimum(n, 1), n)
  # a random rank for every position; the num_selected lowest are selected
  rank = tf.math.invert_permutation(
      tf.random.experimental.stateless_shuffle(tf.range(n), select_seed))
  selected = rank < num_selected
  action = tf.random.stateless_uniform([n], action_seed)
  random_tokens = tf.random.stateless_uniform([n], random_seed, UNK_ID + 1, num_pieces,
                                              dtype=tokens.dtype)
  inputs = tf.where(selected & (action < mask_rate), tf.constant(mask_id, tokens.dtype), tokens)
  inputs = tf.where(selected & (action >= mask_rate) & (action < mask_rate + random_rate),
                    random_tokens, inputs)
  return inputs, tf.where(selected, tokens, PAD_ID)


def mlm(dataset: tf.data.Dataset, mask_id: int, num_pieces: int, noise_density: float = 0.15,
        mask_rate: float = 0.8, random_rate: float = 0.1) -> tf.data.Dataset:
  """BERT's masked LM: {'targets': raw tokens, 'seed'} -> {'inputs', 'targets'} by `bert_mask`.

  Inputs and targets have the raw length; ELECTRA's generator reads the same.
    {'targets': A B C D E, 'seed'}  ->  {'inputs': A <M> C D E, 'targets': 0 B 0 0 0}
  """
  def mask(example):
    inputs, targets = bert_mask(example['targets'], example['seed'], mask_id, num_pieces,
                                noise_density, mask_rate, random_rate)
    return {'inputs': inputs, 'targets': targets}

  return _map(dataset, mask)


def mlm_nsp(dataset: tf.data.Dataset, cls_id: int, sep_id: int, mask_id: int, num_pieces: int,
            sentence_end_ids, noise_density: float = 0.15) -> tf.data.Dataset:
  """BERT's pretraining pairs: {'targets': n raw tokens, 'other': n tokens from elsewhere,
  'seed'} -> {'inputs', 'targets', 'token_types'} of n + 3 tokens, and 'next_sentence': 0 if B
  follows A, 1 if B is random, each half the time.

  A is the chunk up to a sentence end chosen uniformly (a random cut if there is none); B is the
  rest of the chunk, or as many tokens of `other` from its first sentence start (its first token
  if that leaves too few). `bert_mask` masks A and B together; [CLS] and [SEP] are never masked.
    targets A1 A2 . B1 B2,  other X . Y1 Y2 Y3
    next    ->  inputs [CLS] A1 A2 . [SEP] B1 B2 [SEP]   token_types 0 0 0 0 0 1 1 1
    random  ->  inputs [CLS] A1 A2 . [SEP] Y1 Y2 [SEP]   token_types 0 0 0 0 0 1 1 1
  """
  ends = tf.constant(sentence_end_ids, tf.int32, shape=[len(sentence_end_ids)])

  def sentence_starts(tokens):
    """Positions 1..n-1 that follow a sentence end."""
    is_end = tf.reduce_any(tokens[:-1, None] == ends[None, :], axis=1)  # (n - 1,)
    return tf.cast(tf.where(is_end)[:, 0], tf.int32) + 1

  def pair(example):
    tokens, other = example['targets'], example['other']
    cut_seed, next_seed, mask_seed = tf.unstack(
        tf.random.experimental.stateless_split(example['seed'], 3))
    n = tf.size(tokens)
    cuts = sentence_starts(tokens)
    cuts = tf.cond(tf.size(cuts) > 0, lambda: cuts, lambda: tf.range(1, tf.maximum(n, 2)))
    cut = tf.gather(cuts, tf.random.stateless_uniform([], cut_seed, 0, tf.size(cuts),
                                                      dtype=tf.int32))
    is_random = tf.random.stateless_uniform([], next_seed) < 0.5
    start = tf.concat([sentence_starts(other), [0]], 0)[0]  # 0 if other has no sentence end
    start = tf.where(tf.size(other) - start >= n - cut, start, 0)
    second = tf.cond(is_random, lambda: other[start:start + n - cut], lambda: tokens[cut:])
    inputs, targets = bert_mask(tf.concat([tokens[:cut], second], 0), mask_seed, mask_id,
                                num_pieces, noise_density)

    def with_specials(ids, cls, sep):
      cls, sep = tf.constant([cls], ids.dtype), tf.constant([sep], ids.dtype)
      return tf.concat([cls, ids[:cut], sep, ids[cut:], sep], 0)

    return {
        'inputs': with_specials(inputs, cls_id, sep_id),
        'targets': with_specials(targets, PAD_ID, PAD_ID),
        'token_types': tf.cast(tf.range(n + 3) > cut + 1, tokens.dtype),
        'next_sentence': tf.cast(is_random, tokens.dtype),
    }

  return _map(dataset, pair)


def causal_lm(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """GPT's language modelling: {'targets': raw tokens, 'seed'} -> {'targets'}, every token
  predicted from those before it (the feature converter shifts the decoder inputs right):
    targets (raw) A B C D  ->  decoder inputs 0 A B C, targets A B C D, loss on all four.
  Chunks are cut from the concatenated text, so nothing ends: no EOS is appended.
  """
  return _map(dataset, lambda example: {'targets': example['targets']})


def random_prefix_mask(length, seed):
  """int32 (length,): 1 on a prefix of p tokens, p uniform in [1, length - 1] (T5's
  random_prefix_noise_mask, inverted); the whole of a 1-token example. E.g. 5, p = 2 -> 1 1 0 0 0.
  """
  p = tf.random.stateless_uniform([], seed, 1, tf.maximum(length, 2), dtype=tf.int32)
  return tf.cast(tf.range(length) < p, tf.int32)


def prefix_lm(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """T5's prefix LM for a decoder-only model: {'targets', 'seed'} -> {'targets', 'prefix'}.

  The `random_prefix_mask` prefix is read bidirectionally, without loss; the model predicts the
  rest (see packing.prefix_lm_features).
    targets (raw) A B C D E  ->  targets A B C D E, prefix 1 1 0 0 0
  """
  def split(example):
    tokens = example['targets']
    return {'targets': tokens, 'prefix': random_prefix_mask(tf.size(tokens), example['seed'])}

  return _map(dataset, split)


def prefix_to_targets(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """T5's prefix LM for an encoder-decoder (its `prefix_lm` preprocessor, UL2's S-denoiser):
  {'targets': n raw tokens, 'seed', and optionally 'mode'} -> {'inputs': the mode's ids, a
  `random_prefix_mask` prefix of p tokens and EOS, 'targets': the other n - p + EOS}, p uniform
  in [1, n - 1].
    targets (raw) A B C D E, p = 2  ->  inputs A B EOS, targets C D E EOS
  """
  def split(example):
    tokens = example['targets']
    p = tf.reduce_sum(random_prefix_mask(tf.size(tokens), example['seed']))
    eos = tf.constant([EOS_ID], tokens.dtype)
    return {'inputs': tf.concat([*_mode(example, tokens.dtype), tokens[:p], eos], 0),
            'targets': tf.concat([tokens[p:], eos], 0)}

  return _map(dataset, split)


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


def bart(dataset: tf.data.Dataset, mask_id: int, sentence_end_ids, noise_density: float = 0.3,
         mean_span_length: float = 3.0) -> tf.data.Dataset:
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

  return _map(dataset, noise)
