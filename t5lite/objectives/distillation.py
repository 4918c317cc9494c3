"""Distillation (Hinton et al. 2015) of a frozen teacher into the student, around any objective
whose loss is the token cross entropy (`train.teacher_workdir` turns it on).

The data and features are the wrapped objective's. Per target token: alpha times the
hard-label cross entropy, plus (1 - alpha) times T^2 KL(teacher || student) between their
softmaxes at temperature T, plus optionally `distill_hidden_weight` times 1 - cos between the
final hidden states (DistilBERT). The teacher sees the same batch, and no gradient. A mixture's
per-component `loss/NAME` and `accuracy/NAME` are the hard-label term's (compare them with
`hard_loss`).
"""

from typing import Any, NamedTuple

import jax
import ml_collections
from flax import nnx

from t5lite.models.config import ModelConfig
from t5lite.objectives import base
from t5lite.objectives import losses


class Teacher(NamedTuple):
  """A frozen model for distillation, restored from another workdir (`Run.load_teacher`)."""
  cfg: ModelConfig
  graphdef: Any
  non_params: Any
  params: Any  # nnx.State of arrays (or of ShapeDtypeStructs, for planning) in their shardings


def check(config: ml_collections.ConfigDict, objective: base.Objective) -> None:
  """Refuses, in one line, distillation of an objective it cannot wrap."""
  train = config.train
  if train.teacher_workdir and not objective.token_loss:
    raise ValueError(f'train.teacher_workdir distills a token cross entropy; '
                     f'data.objective={objective.name!r} has a loss of its own')
  if train.teacher_workdir and train.loss_chunks:
    raise ValueError(f'train.loss_chunks={train.loss_chunks} chunks a token cross entropy; '
                     'distillation needs the full logits: set it to 0')


def loss(objective: base.Objective, model_cfg: ModelConfig, train_cfg,
         teacher: Teacher) -> base.Loss:
  """`objective`'s targets, learnt from the labels and from `teacher`'s outputs."""
  targets_name, weights_name = objective.targets
  alpha, temperature = float(train_cfg.distill_alpha), float(train_cfg.distill_temperature)
  hidden_weight = float(train_cfg.distill_hidden_weight)
  last_stack = targets_name.split('_')[0]  # the stack whose output feeds the lm head

  def sums(model, batch, frozen_params, key, *, train):
    logits, hidden = _forward(model, batch, last_stack if hidden_weight else None,
                              base.dropout_rngs(model_cfg, key, train))
    # copy=True: `frozen_params`' Variables belong to the step's trace; under jax.grad's, nnx's
    # scanned layers would refuse them
    teacher_model = nnx.merge(teacher.graphdef, frozen_params, teacher.non_params, copy=True)
    teacher_logits, teacher_hidden = jax.lax.stop_gradient(
        _forward(teacher_model, batch, last_stack if hidden_weight else None, None))
    targets, weights = batch[targets_name], batch[weights_name]
    out = {'hard': losses.token_losses(logits, targets, weights, z_loss=train_cfg.z_loss,
                                       label_smoothing=train_cfg.label_smoothing,
                                       groups=base.component_groups(batch)),
           'soft': losses.distillation_losses(logits, teacher_logits, weights, temperature)}
    if hidden_weight:
      out['hidden'] = losses.cosine_losses(hidden, teacher_hidden, weights)
    return out

  def minimised(sums, denominator):
    total = alpha * sums['hard']['loss'] + (1 - alpha) * sums['soft']['loss']
    if hidden_weight:
      total += hidden_weight * sums['hidden']['loss']
    return total / denominator

  def metrics(sums):
    hard, soft = sums['hard'], sums['soft']
    out = {'loss': minimised(sums, base.nonzero(hard['weight'])),
           'accuracy': base.per_token(hard, 'correct'),
           'hard_loss': base.per_token(hard, 'loss'),
           'z_loss': base.per_token(hard, 'z_loss'),
           'soft_loss': base.per_token(soft, 'loss'),  # T^2 KL(teacher || student)
           'agreement': base.per_token(soft, 'agreement'),  # argmax(student) == argmax(teacher)
           'target_tokens': hard['weight'], **base.component_metrics(hard)}
    if hidden_weight:
      out['hidden_loss'] = base.per_token(sums['hidden'], 'loss')
    return out

  return base.Loss(
      sums, lambda batch: losses.loss_denominator(batch[weights_name], train_cfg.loss_normalizer),
      minimised, metrics, frozen_params=teacher.params)


def _forward(model, batch, hidden_stack: str | None, rngs: nnx.Rngs | None):
  """(logits, the final hidden states (b, l, d) of `hidden_stack`, or None without one).

  The hidden states are the output of the model's last stack, captured by nnx rather than
  returned, so the models keep one call; XLA drops the other captured values unused.
  """
  if hidden_stack is None:
    return model(batch, deterministic=rngs is None, rngs=rngs), None
  capture = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)
  logits, intermediates = capture(batch, deterministic=rngs is None, rngs=rngs)
  return logits, intermediates[hidden_stack]['__call__'][0]


def check_teacher(teacher: ModelConfig, teacher_vocabulary: str | None, student: ModelConfig,
                  config: ml_collections.ConfigDict) -> None:
  """Refuses, in one line, a teacher whose outputs the student cannot be compared with;
  `teacher_vocabulary` None: its vocabulary was checked by content."""
  train, where = config.train, f'train.teacher_workdir={config.train.teacher_workdir}'
  if teacher.arch != student.arch:
    raise ValueError(f'{where} holds a {teacher.arch} model and the student is {student.arch}: '
                     'distillation needs one architecture family')
  if teacher.vocab_size != student.vocab_size or teacher_vocabulary not in (
      None, config.data.vocabulary):
    named = '' if teacher_vocabulary is None else f'vocabulary {teacher_vocabulary!r} '
    raise ValueError(f'{where} was trained on {named}({teacher.vocab_size} ids), the student '
                     f'uses {config.data.vocabulary!r} ({student.vocab_size} ids): distillation '
                     'needs one vocabulary')
  if train.distill_hidden_weight and teacher.d_model != student.d_model:
    raise ValueError(f'train.distill_hidden_weight compares hidden states: the teacher has '
                     f'd_model {teacher.d_model}, the student {student.d_model}; set it to 0 '
                     'or give both one width')
