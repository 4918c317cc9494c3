"""What an objective is, and the token cross entropy most objectives train with.

An objective is everything between text and the loss, in one module per objective:
- its data: how long a raw chunk of text is (`raw_length`, which checks the lengths in
  `config.data`), the tf.data transform that noises chunks into examples (`transform`, written
  in the objective's module), the lengths of the packed rows (`row_lengths`) and the feature
  converter that names them for the model (`convert`, from `t5lite/data/packing.py`);
- its features (`features`): the names and lengths of what a batch holds, written once and read
  by the pipeline (which checks its batches against it), `t5lite plan`'s abstract batch and the
  train step; the model reads the same names through `Features.from_batch`;
- the models it can train (`sides`, `arch`) and the settings it needs (`check`), refused in one
  line before a run starts;
- its loss (`loss`): summed losses, their denominators, the scalar minimised and the metrics.

A transform maps raw chunks {'targets': tokens, 'seed': int64[2]} to examples, one op per
example. Its randomness is stateless: each example carries its own `seed`, so an example is a
function of (seed, tokens) wherever and whenever it is computed, and the pipeline seeds example i
of the stream, so a chunk seen again in a later epoch is noised anew (dynamic masking). The
transforms and converters are tf.data code; TensorFlow loads at their first use
(`t5lite/data/tf_setup.py`), so a run fed synthetic batches (`data.source='synthetic'`) never
loads it.

Losses are sums over tokens, divided once by denominators of the whole batch, so that gradient
accumulation adds up to exactly the big batch for every term (see `t5lite/train/step.py`).

A mixture's batch also holds each row's component (`component`, an index into the components
sorted by name), which the step turns into `component_groups` one-hot [b, G]
(`with_component_groups`). The token losses then come summed per component too, and the metrics
hold them as arrays [G] under `components` (`component_metrics`), which the train loop names
`loss/NAME`, `accuracy/NAME` and `target_tokens/NAME`. An objective whose loss has more terms
than the token cross entropy gives its token term's (mlm_nsp and electra: the masked LM's;
distillation: the student's hard-label cross entropy).
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from t5lite import models
from t5lite.data import packing
from t5lite.models.config import ModelConfig
from t5lite.objectives import losses

SIDE_FEATURES = ('input_tokens', 'segment_ids', 'positions')
TARGET_FEATURES = ('target_tokens', 'loss_weights')
COMPONENT = 'component'  # a mixture's batch: each row's component, int32 [b]
COMPONENT_GROUPS = 'component_groups'  # the same one-hot, float32 [b, G], made by the step


class Loss(NamedTuple):
  """An objective's loss for one run: the four functions the train and eval steps call."""
  sums: Callable  # (model, batch, frozen_params, key, *, train) -> float32 sums of a microbatch
  denominators: Callable  # the whole batch -> what `minimised` divides the sums by
  minimised: Callable  # (sums, denominators) -> the scalar the train step minimises
  metrics: Callable  # sums (one step's, or added over eval batches) -> {'loss', 'accuracy', ..}
  # Arrays the loss reads and never trains (a distillation teacher's parameters), or None: the
  # step takes them as an argument, in their own shardings; closed over, they would be copied
  # into the compiled program.
  frozen_params: Any = None


class Objective:
  """One objective, from text to loss; a module per objective subclasses it."""
  name: str
  sides: tuple[str, ...]  # the model sides its features feed: ('encoder', 'decoder'), ...
  arch: str | None = None  # the one model.arch it trains, for an objective made for one model
  # Next-sentence pairs: each chunk comes with an 'other' chunk of random text, and every
  # example fills its own row (never packed: the label and [CLS] are the row's)
  pairs: bool = False
  # The settings of config.data its transform reads besides the lengths (of
  # t5lite/objectives/__init__.py's SETTINGS): what a mixture component may set for it, each
  # range-checked once (`objectives.check_settings`); a component setting another is refused
  settings: tuple[str, ...] = ()
  # Those of `settings` that may differ from one raw chunk to the next of a tf.data chain: each
  # chunk carries its own values (`row_values`), so a mixture's components that differ only in
  # these are read together (UL2's six span-corruption denoisers in one chain, not six)
  row_settings: tuple[str, ...] = ()
  token_loss = True  # the loss is `token_loss`: it can be chunked, distilled and exact-matched

  def raw_length(self, data: ml_collections.ConfigDict) -> int:
    """Raw tokens per chunk of text; ValueError naming the setting if the lengths cannot work."""
    raise NotImplementedError

  def row_lengths(self, data: ml_collections.ConfigDict) -> dict[str, int]:
    """{feature: length} of the packed rows the transform's examples go into."""
    raise NotImplementedError

  def row_values(self, data: ml_collections.ConfigDict) -> dict[str, float | list[int]]:
    """What each raw chunk of `data` carries of `row_settings`: numbers, and `mode`'s ids."""
    return {name: mode_tokens(data) if name == 'mode' else data[name]
            for name in self.row_settings}

  def transform(self, examples, data: ml_collections.ConfigDict, vocab):
    """tf.data: raw chunks {'targets', 'seed'} (and 'other' with `pairs`, and `row_settings`'
    values, `mode`'s ids padded with PAD_ID) -> examples."""
    raise NotImplementedError

  def convert(self, row: dict) -> dict:
    """A batch of packed rows -> the model's features (a seqio feature converter)."""
    raise NotImplementedError

  def features(self, data: ml_collections.ConfigDict) -> dict[str, int | None]:
    """{feature: length per row} of a batch, None for one value per row."""
    raise NotImplementedError

  @property
  def targets(self) -> tuple[str, str]:
    """The features the loss reads: the target tokens and their loss weights."""
    side = 'decoder' if 'decoder' in self.sides else 'encoder'
    return f'{side}_target_tokens', f'{side}_loss_weights'

  def check(self, config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> None:
    """Refuses, in one line, a model this objective cannot train or a setting it cannot use."""
    family = models.family(model_cfg.arch)
    arch = f'model.arch={model_cfg.arch!r}'
    if family.objective not in (None, self.name):
      raise ValueError(f'{arch} trains with data.objective={family.objective!r}, not '
                       f'{self.name!r}')
    if self.arch not in (None, model_cfg.arch):
      raise ValueError(f'data.objective={self.name!r} trains model.arch={self.arch!r}, not '
                       f'{model_cfg.arch!r}')
    if family.sides != self.sides:
      raise ValueError(f'data.objective={self.name!r} feeds {" and ".join(self.sides)} '
                       f'features; {arch} reads {" and ".join(family.sides)} ones')
    if config.train.loss_chunks and not self.token_loss:
      raise ValueError(f'train.loss_chunks={config.train.loss_chunks} chunks a token cross '
                       f'entropy; data.objective={self.name!r} needs the full logits: set it '
                       'to 0')

  def loss(self, model_cfg: ModelConfig, train_cfg, *, exact_match: bool = False) -> Loss:
    """The token cross entropy; `exact_match` makes evaluation count exact target sequences."""
    return token_loss(self.targets, model_cfg, train_cfg, exact_match=exact_match)


class EncoderDecoderObjective(Objective):
  """An objective of noised inputs for the encoder and targets for the decoder, each its own
  row length (span corruption, BART)."""
  sides = ('encoder', 'decoder')

  def row_lengths(self, data):
    return {'inputs': data.inputs_length, 'targets': data.targets_length}

  def convert(self, row):
    return packing.encoder_decoder_features(row)

  def features(self, data):
    return {**side_features('encoder', data.inputs_length),
            **side_features('decoder', data.targets_length, targets=True)}


def side_features(side: str, length: int, *, targets: bool = False) -> dict[str, int]:
  """The features of one side of a packed batch: tokens, segment ids, positions, and with
  `targets` the target tokens and loss weights. side_features('encoder', 8) ->
  {'encoder_input_tokens': 8, 'encoder_segment_ids': 8, 'encoder_positions': 8}."""
  names = SIDE_FEATURES + (TARGET_FEATURES if targets else ())
  return {f'{side}_{name}': length for name in names}


def at_least(data: ml_collections.ConfigDict, name: str, minimum: int) -> int:
  if data[name] < minimum:
    raise ValueError(f'data.{name}={data[name]} must be at least {minimum} for '
                     f'{data.objective}')
  return data[name]


def mode_tokens(data: ml_collections.ConfigDict) -> list[int]:
  """The ids of the text `data.mode` as the run's vocabulary encodes it ('[NLU]' -> 1 id of one
  `t5lite tokenizer` trains, 6 of the bundled one, which has no [ or ]: ▁ <unk> N L U <unk>);
  [] without a mode."""
  if not data.get('mode'):
    return []
  from t5lite.data import vocabulary
  return vocabulary.load_vocabulary(data.vocabulary).encode_ids([data.mode])[0]


def check_unused_length(data: ml_collections.ConfigDict, name: str) -> None:
  if data[name]:
    raise ValueError(f'data.{name}={data[name]}: the {data.objective} objective has no such '
                     f'feature; set data.{name}=0')


def token_loss(targets: tuple[str, str], model_cfg: ModelConfig, train_cfg, *,
               exact_match: bool = False) -> Loss:
  """Cross entropy (with z-loss and label smoothing) on the `targets` features."""
  weights = targets[1]

  def sums(model, batch, frozen_params, key, *, train):
    del frozen_params
    return token_sums(model, batch, targets, train_cfg,
                      dropout_key=dropout_key(model_cfg, key, train),
                      sequences=exact_match and not train)

  return Loss(sums,
              lambda batch: losses.loss_denominator(batch[weights], train_cfg.loss_normalizer),
              minimised=lambda sums, denominator: sums['loss'] / denominator,
              metrics=token_metrics)


def token_sums(model, batch, targets: tuple[str, str], train_cfg, *, dropout_key=None,
               sequences: bool = False) -> dict:
  """Summed loss, z-loss, weight and correct predictions of one (micro)batch, and per component
  for a mixture's; dropout iff a key; with `sequences`, also the counts of target sequences and
  exact ones.

  With `train.loss_chunks` the logits are projected and reduced chunk by chunk
  (`losses.chunked_token_losses`), except for counting exact sequences, which reads every
  position's argmax: that is evaluation, without gradients, on short fine-tuning targets.
  """
  rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
  target_tokens, weights = batch[targets[0]], batch[targets[1]]
  options = dict(z_loss=train_cfg.z_loss, label_smoothing=train_cfg.label_smoothing,
                 groups=component_groups(batch))
  if train_cfg.loss_chunks and not sequences:
    x = model.hidden_states(batch, deterministic=rngs is None, rngs=rngs)  # (batch, length, d)
    return losses.chunked_token_losses(x, model.lm_logits, target_tokens, weights,
                                       train_cfg.loss_chunks, **options)
  logits = model(batch, deterministic=rngs is None, rngs=rngs)  # (batch, length, vocab) float32
  sums = losses.token_losses(logits, target_tokens, weights, **options)
  if sequences:
    side = targets[0].split('_')[0]  # decoder_target_tokens -> decoder
    segment_ids = batch.get(f'{side}_segment_ids', (weights > 0).astype(jnp.int32))
    sums.update(losses.sequence_sums(logits, target_tokens, weights, segment_ids))
  return sums


def token_metrics(sums) -> dict:
  """Per-token metrics from summed ones (for one step, or added over many eval batches)."""
  weight = nonzero(sums['weight'])
  metrics = {
      'loss': sums['loss'] / weight,
      'z_loss': sums['z_loss'] / weight,
      'accuracy': sums['correct'] / weight,
      'target_tokens': sums['weight'],
      **component_metrics(sums),
  }
  if 'sequences' in sums:
    metrics.update(exact_match=sums['exact'] / jnp.maximum(sums['sequences'], 1e-8),
                   sequences=sums['sequences'])
  return metrics


def sum_of_means(factors: dict[str, float]) -> Callable:
  """minimised(sums, denominators): each term's summed loss over its denominator, times its
  factor, added up (BERT's MLM + next sentence, ELECTRA's MLM + 50 x replaced-token detection)."""
  def minimised(sums, denominators):
    return sum(factor * sums[term]['loss'] / denominators[term]
               for term, factor in factors.items())
  return minimised


def mlm_metrics(mlm: dict) -> dict:
  """The masked-LM term's per-token metrics, beside an objective's own."""
  return {'mlm_loss': per_token(mlm, 'loss'), 'mlm_accuracy': per_token(mlm, 'correct'),
          'z_loss': per_token(mlm, 'z_loss'), 'target_tokens': mlm['weight'],
          **component_metrics(mlm)}


def with_component_groups(batch: dict, num_components: int) -> dict:
  """A mixture's batch with its rows' components one-hot as well, float32 [b, G] under
  COMPONENT_GROUPS: what the token losses sum per component. A batch without a mixture
  (num_components 0) as it is. component [1 0], 2 components -> component_groups [[0 1] [1 0]]."""
  if not num_components:
    return batch
  return {**batch, COMPONENT_GROUPS: jax.nn.one_hot(batch[COMPONENT], num_components,
                                                    dtype=jnp.float32)}


def component_groups(batch: dict) -> jax.Array | None:
  """The rows' components one-hot [b, G] (`with_component_groups`), or None without a mixture."""
  return batch.get(COMPONENT_GROUPS)


def component_metrics(sums: dict) -> dict:
  """A mixture's per-component metrics from token sums with groups (`losses.token_losses`):
  {'components': {'loss', 'accuracy', 'target_tokens'}}, each float32 [G]; {} without."""
  if 'group_weight' not in sums:
    return {}
  weight = nonzero(sums['group_weight'])
  return {'components': {'loss': sums['group_loss'] / weight,
                         'accuracy': sums['group_correct'] / weight,
                         'target_tokens': sums['group_weight']}}


def term_weights(sums: dict) -> dict:
  """Each term's summed weight: the denominators of a step's or an evaluation's metrics."""
  return {term: nonzero(term_sums['weight']) for term, term_sums in sums.items()}


def dropout_key(model_cfg: ModelConfig, key: jax.Array, train: bool) -> jax.Array | None:
  return key if train and model_cfg.differs_in_training else None


def dropout_rngs(model_cfg: ModelConfig, key: jax.Array, train: bool) -> nnx.Rngs | None:
  key = dropout_key(model_cfg, key, train)
  return None if key is None else nnx.Rngs(dropout=key)


def per_token(sums: dict, name: str) -> jax.Array:
  return sums[name] / nonzero(sums['weight'])


def nonzero(weight):
  return jnp.maximum(weight, 1e-8)
