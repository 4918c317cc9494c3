"""BERT's pretraining (Devlin et al. 2019): masked LM plus next-sentence prediction, for an
encoder with `model.next_sentence`.

Each row is one pair [CLS] A [SEP] B [SEP], B the text after A or from elsewhere, half and half
(`noise.mlm_nsp`), masked as `mlm` over A and B; never packed. The loss is the MLM cross entropy
per masked token plus the next-sentence cross entropy per pair, each a mean, added. A mixture's
per-component `loss/NAME` and `accuracy/NAME` are the masked LM's (compare them with `mlm_loss`).
"""

import jax.numpy as jnp
import ml_collections

from t5lite.objectives import base
from t5lite.objectives import losses


class MaskedLMNextSentence(base.Objective):
  name = 'mlm_nsp'
  sides = ('encoder',)
  pairs = True
  token_loss = False

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """inputs_length less [CLS] and two [SEP]s, at least 2 (one token for each sentence)."""
    base.check_unused_length(data, 'targets_length')
    return base.at_least(data, 'inputs_length', 5) - 3

  def row_lengths(self, data):
    return dict.fromkeys(('inputs', 'targets', 'token_types'), data.inputs_length)

  def transform(self, examples, data, vocab):
    from t5lite.data import noise
    return noise.mlm_nsp(examples, vocab.sentinel_id(1), vocab.sentinel_id(2),
                         vocab.sentinel_id(0), vocab.num_pieces, vocab.sentence_end_ids(),
                         data.noise_density)

  def convert(self, row):
    from t5lite.data import packing
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


OBJECTIVE = MaskedLMNextSentence()
