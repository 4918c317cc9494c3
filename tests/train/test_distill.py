"""Distillation: T^2 KL and the cosine loss against numpy, Hinton's high-temperature limit,
accumulation with a teacher, a mixture's metrics per component, a student moving toward a tiny
trained teacher, and teachers it cannot learn from refused in one line."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax import nnx

from t5lite import config as config_lib
from t5lite import objectives
from t5lite.models import build
from t5lite.objectives import base, distillation, losses
from t5lite.commands import plan
from t5lite.train import state as state_lib

from test_loop import SMALL, assert_components_make_up, metrics, train
from test_step import small_config, small_run, synthetic_batch


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_kl_times_t_squared_matches_numpy():
  rng = np.random.RandomState(0)
  student, teacher = 2 * rng.randn(2, 2, 3, 7)
  weights = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
  t = 2.5
  sums = losses.distillation_losses(jnp.asarray(student), jnp.asarray(teacher), weights, t)
  p, q = softmax(teacher / t), softmax(student / t)
  kl = np.sum(p * (np.log(p) - np.log(q)), axis=-1)
  np.testing.assert_allclose(sums['loss'], t**2 * np.sum(kl * weights), rtol=1e-5)
  agree = student.argmax(-1) == teacher.argmax(-1)
  assert float(sums['agreement']) == np.sum(agree * weights) and float(sums['weight']) == 4


def test_at_high_temperature_the_gradient_matches_logits():
  # Hinton et al. (2015), section 2.1: for T large against zero-mean logits, the gradient of
  # T^2 KL with respect to the student's logit z_i is (z_i - v_i) / N, logit matching.
  rng = np.random.RandomState(1)
  z, v = rng.randn(2, 10)
  z, v = z - z.mean(), v - v.mean()
  grad = jax.grad(lambda z: losses.distillation_losses(
      z[None], jnp.asarray(v)[None], jnp.ones(1), 100.0)['loss'])(jnp.asarray(z))
  np.testing.assert_allclose(grad, (z - v) / 10, atol=0.002)


def test_cosine_losses_match_numpy():
  rng = np.random.RandomState(2)
  x, y = rng.randn(2, 2, 3, 5)
  weights = np.array([[1, 0, 1], [1, 1, 1]], np.float32)
  cosine = np.sum(x * y, -1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))
  sums = losses.cosine_losses(jnp.asarray(x), jnp.asarray(y), weights)
  np.testing.assert_allclose(sums['loss'], np.sum((1 - cosine) * weights), rtol=1e-5)
  assert abs(float(losses.cosine_losses(x, 3 * x, np.ones((2, 3)))['loss'])) < 1e-5


@pytest.mark.slow  # two compiles of a student and its teacher: about 40 s of CPU
def test_two_microbatches_with_a_teacher_equal_one_big_batch():
  def distilled_losses(microbatches):
    config = small_config(microbatches=microbatches)
    config.model.update(num_encoder_layers=1, num_decoder_layers=1)
    config.train.distill_hidden_weight = 1.0
    run = small_run(config)
    teacher_spec = state_lib.state_spec(run.model_cfg, optax.identity(), 1, run.mesh, run.rules)
    with run.sharding():
      teacher = distillation.Teacher(run.model_cfg, teacher_spec.graphdef,
                                     teacher_spec.non_params, teacher_spec.init().params)
      loss = run.loss(teacher)
      step = run.jit_train_step(loss)
      state, out = run.spec.init(), []
      for i in range(2):
        state, metrics = step(state, synthetic_batch(i), loss.frozen_params)
        out.append([float(metrics[k]) for k in ('loss', 'soft_loss', 'hidden_loss')])
    return np.array(out)

  np.testing.assert_allclose(distilled_losses(2), distilled_losses(1), rtol=1e-5)


def test_a_mixtures_loss_per_component_is_the_students_hard_label_loss():
  config = small_config()
  config.model.update(num_encoder_layers=1, num_decoder_layers=1)
  model_cfg = config_lib.model_config(config)
  student = build(model_cfg, nnx.Rngs(0))
  graphdef, params, non_params = nnx.split(build(model_cfg, nnx.Rngs(1)), nnx.Param, ...)
  loss = distillation.loss(objectives.get('span_corruption'), model_cfg, config.train,
                           distillation.Teacher(model_cfg, graphdef, non_params, params))
  batch = synthetic_batch(0)
  batch = base.with_component_groups({**batch, 'component': np.arange(8) % 3 // 2}, 2)
  metrics = loss.metrics(jax.jit(lambda batch, frozen: loss.sums(
      student, batch, frozen, jax.random.PRNGKey(0), train=False))(batch, params))
  assert_components_make_up(metrics['components'], metrics['target_tokens'],
                            {'loss': metrics['hard_loss'], 'accuracy': metrics['accuracy']})
  assert metrics['hard_loss'] != metrics['loss']  # the soft term counts in `loss` alone


@pytest.fixture(scope='module')
def teacher(tmp_path_factory):
  """A tiny t5_tiny trained for 8 steps: the teacher of the tests below."""
  workdir = tmp_path_factory.mktemp('teacher')
  assert train(workdir, '--config.train.steps=8', '--config.optim.learning_rate=0.03') == 0
  return workdir


@pytest.mark.slow  # a student and its teacher trained: 27-29 s on 2 cores
def test_student_moves_toward_its_teacher(tmp_path, teacher):
  # Half the teacher's FFN width; hidden states compared as DistilBERT does (same d_model).
  assert train(tmp_path, '--config.train.steps=20', f'--config.train.teacher_workdir={teacher}',
               '--config.model.d_ff=64', '--config.train.distill_hidden_weight=1.0') == 0
  rows = metrics(tmp_path)
  assert sorted(rows) == list(range(1, 21))
  loss, soft, hidden, agreement = (np.array([rows[s][k] for s in sorted(rows)]) for k in (
      'loss', 'soft_loss', 'hidden_loss', 'agreement'))
  print(f'distillation: loss {loss[0]:.3f} -> {loss[-1]:.3f}, T^2 KL {soft[0]:.3f} -> '
        f'{soft[-1]:.3f}, 1 - cos {hidden[0]:.3f} -> {hidden[-1]:.3f}, agreement '
        f'{agreement[0]:.2f} -> {agreement[-1]:.2f}')
  assert np.mean(loss[-3:]) < np.mean(loss[:3]) - 0.5, loss
  assert np.mean(soft[-3:]) < 0.5 * np.mean(soft[:3]), soft
  assert np.mean(hidden[-3:]) < 0.5 * np.mean(hidden[:3]), hidden
  assert np.mean(agreement[-3:]) > np.mean(agreement[:3]) + 0.2, agreement


def test_plan_counts_the_teachers_parameters(teacher):
  config = config_lib.load(SMALL[0].removeprefix('--config='))
  config_lib.override(config, SMALL[1:] + [f'--config.train.teacher_workdir={teacher}',
                                           '--config.model.d_ff=64'])
  result = plan.plan(config, 'cpu:8', compile_step=False)
  # embedding and lm head, each stack's relative bias table and final norm
  teacher_params = (8192 * 64 * 2 + 2 * 32 * 2 + 2 * 64
                    + 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64  # encoder layer
                    + 8 * 64 * 64 + 3 * 64 * 128 + 3 * 64)  # decoder layer
  assert result['analytic']['teacher'] == 4 * teacher_params  # float32, replicated on data=8


@pytest.mark.parametrize('flags, message', [
    (['--config.model.vocab_size=8320'], 'distillation needs one vocabulary'),
    (['--config.model.d_model=32', '--config.model.d_kv=16',
      '--config.train.distill_hidden_weight=1'], 'the teacher has d_model 64, the student 32'),
    (['--config.model.arch=decoder', '--config.data.objective=causal_lm',
      '--config.data.inputs_length=0'], 'holds a encoder_decoder model and the student is decoder'),
    (['--config.train.distill_alpha=2'], 'config.train.distill_alpha=2.0 must be in [0, 1]'),
])
def test_a_teacher_the_student_cannot_learn_from_is_refused(tmp_path, capsys, teacher, flags,
                                                            message):
  workdir = tmp_path / 'student'
  assert train(workdir, f'--config.train.teacher_workdir={teacher}', *flags) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0], error
  assert not workdir.exists()  # refused before anything was written


def test_a_teacher_workdir_without_checkpoints_is_refused(tmp_path, capsys):
  assert train(tmp_path / 'student', f'--config.train.teacher_workdir={tmp_path}/none') == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and 'train.teacher_workdir: no checkpoint in' in error[0], error
  assert not os.path.exists(tmp_path / 'none')
