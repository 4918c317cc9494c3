"""What the train step minimises: one `Objective` per kind of run, chosen by `make`.

An objective maps (model, batch) to float32 sums over tokens and says how they combine. The
step (step.py) differentiates `loss(sums, denominators)` with `denominators(batch)` taken over
the whole batch, so that gradient accumulation adds up to the big batch for every loss term.
Four objectives share that one step:

- `lm`: the model's cross entropy on its own targets (span corruption, MLM, causal LM, a
  fine-tuning task); `model.arch` names the target features.
- `next_sentence` (BERT, Devlin et al. 2019): the MLM loss plus the next-sentence
  classifier's cross entropy per pair, each a mean, added.
- `electra` (Clark et al. 2020): the generator's MLM loss plus 50 times the discriminator's
  replaced-token detection loss over every real token.
- `distillation` (Hinton et al. 2015): alpha times the hard-label cross entropy plus (1 - alpha)
  times T^2 KL to a frozen teacher's temperature-softened distribution, plus optionally a cosine
  loss between the final hidden states (DistilBERT).

`Objective.frozen` is what an objective reads and never trains (the teacher's parameters). The
step takes it as an argument in its own shardings, outside the train state and the optimizer:
a constant closed over would be copied into the compiled program.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from t5lite import config as config_lib
from t5lite.models import Features
from t5lite.models.config import ModelConfig
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import losses
from t5lite.train import state as state_lib
from t5lite.train import step as step_lib

PAD_ID = 0  # as in data/vocabulary.py (not imported: that loads TensorFlow, and `plan` needs none)
REPLACED_TOKEN_WEIGHT = 50.0  # ELECTRA's lambda: the discriminator's loss is much the smaller


class Objective(NamedTuple):
  """The four functions of a loss, and what it reads besides the model and the batch."""
  sums: Callable  # (model, batch, frozen, key, *, train) -> float32 sums of one (micro)batch
  denominators: Callable  # the whole batch -> what `loss` divides the sums by
  loss: Callable  # (sums, denominators) -> the scalar the step minimises
  metrics: Callable  # sums (one step's, or added over eval batches) -> {'loss', 'accuracy', ..}
  frozen: Any = None  # arrays read, never trained: a teacher's params (nnx.State), or None


class Teacher(NamedTuple):
  """A frozen model for distillation, restored from another workdir."""
  cfg: ModelConfig
  graphdef: Any
  rest: Any
  params: Any  # nnx.State of arrays (or of ShapeDtypeStructs, for planning) in their shardings


def make(config: ml_collections.ConfigDict, model_cfg: ModelConfig,
         teacher: Teacher | None = None, *, exact_match: bool = False) -> Objective:
  """ELECTRA for model.arch='electra', BERT's for model.next_sentence, distillation given a
  teacher, else the token loss; `exact_match` (lm only) makes evaluation count target sequences
  predicted exactly."""
  if config.train.loss_chunks and (model_cfg.arch == 'electra' or model_cfg.next_sentence
                                   or teacher is not None):
    raise ValueError(f'train.loss_chunks={config.train.loss_chunks} chunks the lm objective '
                     'alone; ELECTRA, next-sentence and distillation runs need the full logits: '
                     'set it to 0')
  if model_cfg.arch == 'electra':
    return electra(model_cfg, config.train)
  if model_cfg.next_sentence != (config.data.objective == 'mlm_nsp'):
    raise ValueError(f'model.next_sentence={model_cfg.next_sentence} goes with data.objective='
                     f"'mlm_nsp' and only with it (got {config.data.objective!r})")
  if model_cfg.next_sentence:
    return next_sentence(model_cfg, config.train)
  if teacher is not None:
    return distillation(model_cfg, config.train, teacher)
  return lm(model_cfg, config.train, exact_match=exact_match)


def lm(model_cfg: ModelConfig, train_cfg, *, exact_match: bool = False) -> Objective:
  """Cross entropy (with z-loss, label smoothing) on the targets `model.arch` predicts."""
  weights = step_lib.target_features(model_cfg)[1]

  def sums(model, batch, frozen, key, *, train):
    del frozen
    return step_lib.loss_sums(model, batch, model_cfg, train_cfg,
                              dropout_key=_dropout_key(model_cfg, key, train),
                              sequences=exact_match and not train)

  return Objective(
      sums, lambda batch: losses.loss_denominator(batch[weights], train_cfg.loss_normalizer),
      loss=lambda sums, denominator: sums['loss'] / denominator, metrics=step_lib.summarize)


def next_sentence(model_cfg: ModelConfig, train_cfg) -> Objective:
  """BERT's pretraining loss: MLM cross entropy per masked token plus the next-sentence
  cross entropy per pair, from one pass of the encoder."""
  normalizer = train_cfg.loss_normalizer

  def sums(model, batch, frozen, key, *, train):
    del frozen
    dropout_key = _dropout_key(model_cfg, key, train)
    rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
    x = model.hidden_states(batch, deterministic=rngs is None, rngs=rngs)  # (b, l, d)
    logits = model.lm_logits(x)  # (b, l, v)
    labels = batch['next_sentence_labels']  # (b,)
    return {
        'mlm': losses.token_losses(logits, batch['encoder_target_tokens'],
                                   batch['encoder_loss_weights'], z_loss=train_cfg.z_loss,
                                   label_smoothing=train_cfg.label_smoothing),
        # one "token" per row: (b, 2) -> (b, 1, 2)
        'next_sentence': losses.token_losses(model.next_sentence_logits(x)[:, None],
                                             labels[:, None], jnp.ones_like(labels)[:, None]),
    }

  def denominators(batch):
    return {'mlm': losses.loss_denominator(batch['encoder_loss_weights'], normalizer),
            'next_sentence': jnp.float32(batch['next_sentence_labels'].shape[0])}

  loss = _sum_of_means({'mlm': 1.0, 'next_sentence': 1.0})

  def metrics(sums):
    pairs = sums['next_sentence']
    return {'loss': loss(sums, _weights(sums)), 'accuracy': _per_token(sums['mlm'], 'correct'),
            **_mlm_metrics(sums['mlm']), 'next_sentence_loss': _per_token(pairs, 'loss'),
            'next_sentence_accuracy': _per_token(pairs, 'correct')}

  return Objective(sums, denominators, loss, metrics)


def electra(model_cfg: ModelConfig, train_cfg) -> Objective:
  """The generator's MLM loss on the masked positions of an MLM batch, plus
  REPLACED_TOKEN_WEIGHT times the discriminator's binary cross entropy on every real token of
  the batch with the masked positions filled by the generator's samples."""
  normalizer = train_cfg.loss_normalizer

  def sums(model, batch, frozen, key, *, train):
    del frozen
    sample_key, key = jax.random.split(key)
    dropout_key = _dropout_key(model_cfg, key, train)
    rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
    logits = model.generator_logits(batch, deterministic=rngs is None, rngs=rngs)  # (b, l, v)
    mlm = losses.token_losses(logits, batch['encoder_target_tokens'],
                              batch['encoder_loss_weights'], z_loss=train_cfg.z_loss,
                              label_smoothing=train_cfg.label_smoothing)
    original = original_tokens(batch)
    corrupted, replaced = replace_tokens(original, batch['encoder_loss_weights'] > 0,
                                         sample_tokens(sample_key, logits))
    features = Features(corrupted, batch.get('encoder_segment_ids'),
                        batch.get('encoder_positions'))
    discriminator = losses.binary_losses(
        model.discriminator_logits(features, deterministic=rngs is None, rngs=rngs), replaced,
        original != PAD_ID)
    discriminator['replaced'] = jnp.sum(replaced, dtype=jnp.float32)
    return {'mlm': mlm, 'discriminator': discriminator}

  def denominators(batch):
    return {'mlm': losses.loss_denominator(batch['encoder_loss_weights'], normalizer),
            'discriminator': losses.loss_denominator(original_tokens(batch) != PAD_ID,
                                                     normalizer)}

  loss = _sum_of_means({'mlm': 1.0, 'discriminator': REPLACED_TOKEN_WEIGHT})

  def metrics(sums):
    discriminator = sums['discriminator']
    return {'loss': loss(sums, _weights(sums)), 'accuracy': _per_token(discriminator, 'correct'),
            **_mlm_metrics(sums['mlm']), 'discriminator_loss': _per_token(discriminator, 'loss'),
            'replaced': _per_token(discriminator, 'replaced')}  # fraction of tokens replaced

  return Objective(sums, denominators, loss, metrics)


def original_tokens(batch) -> jax.Array:
  """The text an MLM batch was made from: the targets where masked, the inputs elsewhere."""
  return jnp.where(batch['encoder_loss_weights'] > 0, batch['encoder_target_tokens'],
                   batch['encoder_input_tokens'])


def sample_tokens(key: jax.Array, logits: jax.Array) -> jax.Array:
  """A token per position from softmax(logits) (b, l, v), by the Gumbel-max trick
  (`jax.random.categorical`); never the padding id, and no gradient through the choice."""
  logits = jnp.where(jnp.arange(logits.shape[-1]) == PAD_ID, -jnp.inf,
                     jax.lax.stop_gradient(logits))
  return jax.random.categorical(key, logits, axis=-1)  # (b, l, v) -> (b, l)


def replace_tokens(original: jax.Array, masked: jax.Array,
                   sampled: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The discriminator's input and labels: samples at the masked positions, the original text
  elsewhere; a sample equal to the original token counts as not replaced, as in the paper.

  original [5 6 7 8], masked [0 1 1 0], sampled [9 6 3 9] -> input [5 6 3 8], replaced [0 0 1 0]
  """
  corrupted = jnp.where(masked, sampled, original)
  return corrupted, corrupted != original


def distillation(model_cfg: ModelConfig, train_cfg, teacher: Teacher) -> Objective:
  """alpha * cross entropy on the targets + (1 - alpha) * T^2 KL(teacher || student) at
  temperature T + distill_hidden_weight * (1 - cos) of the final hidden states, per target
  token; the teacher's forward pass sees the same batch and no gradient."""
  targets_name, weights_name = step_lib.target_features(model_cfg)
  alpha, temperature = float(train_cfg.distill_alpha), float(train_cfg.distill_temperature)
  hidden_weight = float(train_cfg.distill_hidden_weight)

  def sums(model, batch, frozen, key, *, train):
    dropout_key = _dropout_key(model_cfg, key, train)
    logits, hidden = _forward(model, batch, hidden_weight > 0,
                              None if dropout_key is None else nnx.Rngs(dropout=dropout_key))
    # copy=True: `frozen`'s Variables belong to the step's trace; under jax.grad's, nnx's
    # scanned layers would refuse them
    teacher_model = nnx.merge(teacher.graphdef, frozen, teacher.rest, copy=True)
    teacher_logits, teacher_hidden = jax.lax.stop_gradient(
        _forward(teacher_model, batch, hidden_weight > 0, None))
    targets, weights = batch[targets_name], batch[weights_name]
    out = {'hard': losses.token_losses(logits, targets, weights, z_loss=train_cfg.z_loss,
                                       label_smoothing=train_cfg.label_smoothing),
           'soft': losses.distillation_losses(logits, teacher_logits, weights, temperature)}
    if hidden_weight:
      out['hidden'] = losses.cosine_losses(hidden, teacher_hidden, weights)
    return out

  def loss(sums, denominator):
    total = alpha * sums['hard']['loss'] + (1 - alpha) * sums['soft']['loss']
    if hidden_weight:
      total += hidden_weight * sums['hidden']['loss']
    return total / denominator

  def metrics(sums):
    hard, soft = sums['hard'], sums['soft']
    out = {'loss': loss(sums, _nonzero(hard['weight'])),
           'accuracy': _per_token(hard, 'correct'),
           'hard_loss': _per_token(hard, 'loss'),
           'z_loss': _per_token(hard, 'z_loss'),
           'soft_loss': _per_token(soft, 'loss'),  # T^2 KL(teacher || student)
           'agreement': _per_token(soft, 'agreement'),  # argmax(student) == argmax(teacher)
           'target_tokens': hard['weight']}
    if hidden_weight:
      out['hidden_loss'] = _per_token(sums['hidden'], 'loss')
    return out

  return Objective(
      sums, lambda batch: losses.loss_denominator(batch[weights_name], train_cfg.loss_normalizer),
      loss, metrics, frozen=teacher.params)


def _forward(model, batch, hidden: bool, rngs: nnx.Rngs | None):
  """(logits, the final hidden states (b, l, d) that feed the lm head, or None).

  The hidden states are the output of the model's last `Stack`, captured by nnx rather than
  returned, so the models keep one call; XLA drops the other captured values unused.
  """
  if not hidden:
    return model(batch, deterministic=rngs is None, rngs=rngs), None
  capture = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)
  logits, intermediates = capture(batch, deterministic=rngs is None, rngs=rngs)
  stack = 'encoder' if model.cfg.arch == 'encoder' else 'decoder'
  return logits, intermediates[stack]['__call__'][0]


def load_teacher(config: ml_collections.ConfigDict, model_cfg: ModelConfig, mesh, rules, *,
                 restore: bool = True) -> Teacher:
  """The latest parameters of `train.teacher_workdir`, read-only, placed on `mesh` by the run's
  rules; restore=False gives their shapes and shardings alone (`t5lite plan`). Checks first that
  the teacher can teach this student, with one line if not."""
  checkpointer = checkpoint_lib.Checkpointer(config.train.teacher_workdir, config.checkpoint,
                                             read_only=True)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise FileNotFoundError(f'train.teacher_workdir: no checkpoint in {checkpointer.directory}')
    saved = ml_collections.ConfigDict(checkpointer.saved_config(step))
    teacher_cfg = config_lib.model_config(saved)
    check_teacher(teacher_cfg, saved.data.vocabulary, model_cfg, config)
    spec = state_lib.state_spec(teacher_cfg, optax.identity(), 0, mesh, rules)
    params = (checkpointer.restore_params(step, spec.abstract.params) if restore
              else spec.abstract.params)
  finally:
    checkpointer.close()
  return Teacher(teacher_cfg, spec.graphdef, spec.rest, params)


def check_teacher(teacher: ModelConfig, teacher_vocabulary: str, student: ModelConfig,
                  config: ml_collections.ConfigDict) -> None:
  """Refuses, in one line, a teacher whose outputs the student cannot be compared with."""
  train, where = config.train, f'train.teacher_workdir={config.train.teacher_workdir}'
  if student.arch == 'electra':
    raise ValueError("distillation trains the lm objective's models, not model.arch='electra'")
  if teacher.arch != student.arch:
    raise ValueError(f'{where} holds a {teacher.arch} model and the student is {student.arch}: '
                     'distillation needs one architecture family')
  if (teacher.vocab_size, teacher_vocabulary) != (student.vocab_size, config.data.vocabulary):
    raise ValueError(f'{where} was trained on vocabulary {teacher_vocabulary!r} '
                     f'({teacher.vocab_size} ids), the student uses {config.data.vocabulary!r} '
                     f'({student.vocab_size} ids): distillation needs one vocabulary')
  if train.distill_hidden_weight and teacher.d_model != student.d_model:
    raise ValueError(f'train.distill_hidden_weight compares hidden states: the teacher has '
                     f'd_model {teacher.d_model}, the student {student.d_model}; set it to 0 '
                     'or give both one width')


def _sum_of_means(factors: dict[str, float]) -> Callable:
  """loss(sums, denominators): each term's summed loss over its denominator, times its factor,
  added up (BERT's MLM + next sentence, ELECTRA's MLM + 50 x replaced-token detection)."""
  def loss(sums, denominators):
    return sum(factor * sums[term]['loss'] / denominators[term]
               for term, factor in factors.items())
  return loss


def _mlm_metrics(mlm: dict) -> dict:
  """The masked-LM term's per-token metrics, beside an objective's own."""
  return {'mlm_loss': _per_token(mlm, 'loss'), 'mlm_accuracy': _per_token(mlm, 'correct'),
          'z_loss': _per_token(mlm, 'z_loss'), 'target_tokens': mlm['weight']}


def _weights(sums: dict) -> dict:
  """Each term's summed weight: the denominators of a step's or an evaluation's metrics."""
  return {term: _nonzero(term_sums['weight']) for term, term_sums in sums.items()}


def _dropout_key(model_cfg: ModelConfig, key: jax.Array, train: bool) -> jax.Array | None:
  return key if train and model_cfg.dropout > 0 else None


def _per_token(sums: dict, name: str) -> jax.Array:
  return sums[name] / _nonzero(sums['weight'])


def _nonzero(weight):
  return jnp.maximum(weight, 1e-8)
