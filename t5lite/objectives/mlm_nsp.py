"""BERT's pretraining (Devlin et al. 2019): masked LM plus next-sentence prediction, for an
encoder with `model.next_sentence`.

Each row is one pair [CLS] A [SEP] B [SEP], B the text after A or from elsewhere, half and half
(`sentence_pairs`), masked as `mlm` over A and B; never packed. The loss is the MLM cross entropy
per masked token plus the next-sentence cross entropy per pair, each a mean, added. A mixture's
per-component `loss/NAME` and `accuracy/NAME` are the masked LM's (compare them with `mlm_loss`).
The vocabulary has no [CLS] or [SEP] piece: `<extra_id_1>` marks [CLS], `<extra_id_2>` [SEP].
"""

import jax.numpy as jnp
import ml_collections

from t5lite.data import packing
from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base
from t5lite.objectives import losses
from t5lite.objectives import mlm
from t5lite.token_ids import PAD_ID


class MaskedLMNextSentence(base.Objective):
  name = 'mlm_nsp'
  sides = ('encoder',)
  settings = ('noise_density',)
  pairs = True
  token_loss = False

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """inputs_length less [CLS] and two [SEP]s, at least 2 (one token for each sentence)."""
    base.check_unused_length(data, 'targets_length')
    return base.at_least(data, 'inputs_length', 5) - 3

  def row_lengths(self, data):
    return dict.fromkeys(('inputs', 'targets', 'token_types'), data.inputs_length)

  def transform(self, examples, data, vocab):
    return sentence_pairs(examples, vocab.sentinel_id(1), vocab.sentinel_id(2),
                          vocab.sentinel_id(0), vocab.num_pieces, vocab.sentence_end_ids(),
                          data.noise_density)

  def convert(self, row):
    return packing.encoder_pair_features(row)

  def features(self, data):
    # BERT's segment A (0) or B (1) of each token, and one label per row
    return {**base.side_features('encoder', data.inputs_length, targets=True),
            'encoder_token_types': data.inputs_length, 'next_sentence_labels': None}

  def check(self, config, model_cfg):
    super().check(config, model_cfg)
    if not model_cfg.next_sentence:
      raise ValueError(f"data.objective={self.name!r} needs model.next_sentence=True (BERT's "
                       'next-sentence classifier)')

  def loss(self, model_cfg, train_cfg, *, exact_match=False) -> base.Loss:
    del exact_match  # evaluation reports both heads' accuracies
    normalizer = train_cfg.loss_normalizer

    def sums(model, batch, frozen_params, key, *, train):
      del frozen_params
      rngs = base.dropout_rngs(model_cfg, key, train)
      x = model.hidden_states(batch, deterministic=rngs is None, rngs=rngs)  # (b, l, d)
      labels = batch['next_sentence_labels']  # (b,)
      return {
          'mlm': losses.token_losses(model.lm_logits(x), batch['encoder_target_tokens'],
                                     batch['encoder_loss_weights'], z_loss=train_cfg.z_loss,
                                     label_smoothing=train_cfg.label_smoothing,
                                     groups=base.component_groups(batch)),
          # one "token" per row: (b, 2) -> (b, 1, 2)
          'next_sentence': losses.token_losses(model.next_sentence_logits(x)[:, None],
                                               labels[:, None], jnp.ones_like(labels)[:, None]),
      }

    def denominators(batch):
      return {'mlm': losses.loss_denominator(batch['encoder_loss_weights'], normalizer),
              'next_sentence': jnp.float32(batch['next_sentence_labels'].shape[0])}

    minimised = base.sum_of_means({'mlm': 1.0, 'next_sentence': 1.0})

    def metrics(sums):
      pairs = sums['next_sentence']
      return {'loss': minimised(sums, base.term_weights(sums)),
              'accuracy': base.per_token(sums['mlm'], 'correct'), **base.mlm_metrics(sums['mlm']),
              'next_sentence_loss': base.per_token(pairs, 'loss'),
              'next_sentence_accuracy': base.per_token(pairs, 'correct')}

    return base.Loss(sums, denominators, minimised, metrics)


def sentence_pairs(dataset, cls_id: int, sep_id: int, mask_id: int, num_pieces: int,
                   sentence_end_ids, noise_density: float = 0.15):
  """BERT's pretraining pairs: {'targets': n raw tokens, 'other': n tokens from elsewhere,
  'seed'} -> {'inputs', 'targets', 'token_types'} of n + 3 tokens, and 'next_sentence': 0 if B
  follows A, 1 if B is random, each half the time.

  A is the chunk up to a sentence end chosen uniformly (a random cut if there is none); B is the
  rest of the chunk, or as many tokens of `other` from its first sentence start (its first token
  if that leaves too few). `mlm.bert_mask` masks A and B together; [CLS] and [SEP] are never masked.
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
    inputs, targets = mlm.bert_mask(tf.concat([tokens[:cut], second], 0), mask_seed,
                                    mask_id, num_pieces, noise_density)

    def with_specials(ids, cls, sep):
      cls, sep = tf.constant([cls], ids.dtype), tf.constant([sep], ids.dtype)
      return tf.concat([cls, ids[:cut], sep, ids[cut:], sep], 0)

    return {
        'inputs': with_specials(inputs, cls_id, sep_id),
        'targets': with_specials(targets, PAD_ID, PAD_ID),
        'token_types': tf.cast(tf.range(n + 3) > cut + 1, tokens.dtype),
        'next_sentence': tf.cast(is_random, tokens.dtype),
    }

  return parallel_map(dataset, pair)


OBJECTIVE = MaskedLMNextSentence()
