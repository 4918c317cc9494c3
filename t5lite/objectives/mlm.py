"""BERT's masked LM (Devlin et al. 2019), for encoder-only models (BERT, RoBERTa).

15% of the tokens selected, each replaced by a mask (`<extra_id_0>`) 80% of the time, a random
piece 10%, kept 10%; the loss is the token cross entropy at the selected positions alone.
  raw A B C D E  ->  inputs A <M> C D E, targets 0 B 0 0 0 (0: no loss)

The vocabulary has no [MASK] piece: the mask is `<extra_id_0>` (vocab_size - 1), so any T5
vocabulary serves.
"""

import ml_collections

from t5lite.data import packing
from t5lite.data.tf_setup import parallel_map, tf
from t5lite.objectives import base
from t5lite.token_ids import PAD_ID, UNK_ID


class MaskedLM(base.Objective):
  name = 'mlm'
  sides = ('encoder',)
  settings = ('noise_density',)

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """A chunk of inputs_length tokens, masked in place; the targets have the same length."""
    base.check_unused_length(data, 'targets_length')
    return base.at_least(data, 'inputs_length', 1)

  def row_lengths(self, data):
    return {'inputs': data.inputs_length, 'targets': data.inputs_length}

  def transform(self, examples, data, vocab):
    return mask_tokens(examples, vocab.sentinel_id(0), vocab.num_pieces, data.noise_density)

  def convert(self, row):
    return packing.encoder_features(row)

  def features(self, data):
    return base.side_features('encoder', data.inputs_length, targets=True)

  def check(self, config, model_cfg):
    super().check(config, model_cfg)
    if model_cfg.next_sentence:
      raise ValueError(f"model.next_sentence=True trains with data.objective='mlm_nsp', not "
                       f'{self.name!r}')


def mask_tokens(dataset, mask_id: int, num_pieces: int, noise_density: float = 0.15,
                mask_rate: float = 0.8, random_rate: float = 0.1):
  """BERT's masked LM: {'targets': raw tokens, 'seed'} -> {'inputs', 'targets'} by `bert_mask`.

  Inputs and targets have the raw length; ELECTRA's generator reads the same.
    {'targets': A B C D E, 'seed'}  ->  {'inputs': A <M> C D E, 'targets': 0 B 0 0 0}
  """
  def mask(example):
    inputs, targets = bert_mask(example['targets'], example['seed'], mask_id, num_pieces,
                                noise_density, mask_rate, random_rate)
    return {'inputs': inputs, 'targets': targets}

  return parallel_map(dataset, mask)


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


OBJECTIVE = MaskedLM()
