"""The jitted train step gives the same losses on every mesh; accumulation equals a big batch; a
mixture's metrics per component are those of its rows."""

import jax
import numpy as np
import pytest
from flax import nnx

from t5lite import config as config_lib
from t5lite import objectives
from t5lite.commands import plan
from t5lite.models import build
from t5lite.train import mesh as mesh_lib
from t5lite.train import run as run_lib
from t5lite.train import step as step_lib

from test_loop import assert_components_make_up

BATCH, INPUTS, TARGETS, VOCAB = 8, 32, 8, 256


def small_config(data=1, fsdp=1, tensor=1, microbatches=1, optimizer='adafactor', dropout=0.0):
  config = config_lib.base_config()
  config.model.update(config_lib.T5_1_1, vocab_size=VOCAB, d_model=64, d_ff=128, num_heads=4,
                      d_kv=16, num_encoder_layers=1, num_decoder_layers=1, dropout=dropout)
  config.data.update(batch_size=BATCH, inputs_length=INPUTS, targets_length=TARGETS)
  config.mesh.update(data=data, fsdp=fsdp, tensor=tensor)
  config.train.microbatches = microbatches
  config.optim.update(name=optimizer, schedule='constant', learning_rate=1e-2)
  return config


def synthetic_batch(seed: int) -> dict:
  """Random tokens, with padding in the last two rows so the loss weights matter."""
  rng = np.random.RandomState(seed)
  targets = rng.randint(2, VOCAB, (BATCH, TARGETS)).astype(np.int32)
  targets[-2:, TARGETS // 2:] = 0
  inputs = rng.randint(2, VOCAB, (BATCH, INPUTS)).astype(np.int32)
  inputs[-2:, INPUTS // 2:] = 0
  return dict(encoder_input_tokens=inputs,
              decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
              decoder_target_tokens=targets,
              decoder_loss_weights=(targets > 0).astype(np.int32))


def small_run(config) -> run_lib.Run:
  """The run of `config` on a mesh of the first devices, as many as config.mesh asks for, fed
  synthetic batches."""
  sizes = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:int(np.prod(sizes))])
  return run_lib.make_run(config, mesh, reads_text=False)


def train(config, num_steps=5):
  """(losses, final params) of `num_steps` steps on the synthetic batches."""
  run = small_run(config)
  with run.sharding():
    step = run.jit_train_step(run.loss())
    state, losses = run.spec.init(), []
    for i in range(num_steps):
      batch = {k: jax.device_put(v, run.batch_sharding) for k, v in synthetic_batch(i).items()}
      state, metrics = step(state, batch, None)
      losses.append(float(metrics['loss']))
  return losses, state.params


def train_losses(config, num_steps=5) -> list[float]:
  return train(config, num_steps)[0]


@pytest.fixture(scope='module')
def one_device_losses():
  return train_losses(small_config())


@pytest.mark.slow  # 8-29 s on 2 cores, most over 20
def test_loss_starts_near_uniform_and_falls(one_device_losses):
  # T5's unscaled embedding (std 1) makes the untrained logits a little peaked: above ln(256)=5.55.
  assert np.log(VOCAB) < one_device_losses[0] < np.log(VOCAB) + 1.0
  assert one_device_losses[-1] < one_device_losses[0] - 0.1


@pytest.mark.slow  # 8-29 s on 2 cores, most over 20
@pytest.mark.parametrize('data, fsdp, tensor', [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)])
def test_every_mesh_gives_the_same_losses(one_device_losses, data, fsdp, tensor):
  losses = train_losses(small_config(data, fsdp, tensor))
  np.testing.assert_allclose(losses, one_device_losses, rtol=1e-5)


@pytest.mark.slow  # 8-29 s on 2 cores, most over 20
@pytest.mark.parametrize('optimizer', ['adafactor', 'adamw'])
def test_four_microbatches_equal_one_big_batch(one_device_losses, optimizer):
  # small_config()'s optimizer is Adafactor: its big batch is the module's one-device run
  big = one_device_losses if optimizer == 'adafactor' else train_losses(
      small_config(optimizer=optimizer))
  accumulated = train_losses(small_config(microbatches=4, optimizer=optimizer))
  np.testing.assert_allclose(accumulated, big, rtol=1e-5)


def test_split_microbatches_keeps_every_row_once():
  batch = {'x': np.arange(8 * 3).reshape(8, 3)}
  split = step_lib.split_microbatches(batch, 4)['x']  # (4, 2, 3)
  assert split.shape == (4, 2, 3)
  np.testing.assert_array_equal(np.sort(np.asarray(split).reshape(-1)), np.arange(24))
  np.testing.assert_array_equal(split[1, :, 0], [3, 15])  # rows 1 and 5 of the original


@pytest.mark.slow  # 8-29 s on 2 cores, most over 20
def test_dropout_training_is_reproducible():
  first, again = (train_losses(small_config(dropout=0.1), num_steps=3) for _ in range(2))
  assert first == again  # the dropout key is fold_in(rng, step): a rerun draws the same masks
  assert all(np.isfinite(first))


@pytest.mark.slow  # 8-29 s on 2 cores, most over 20
def test_chunked_loss_gives_the_same_steps():
  def config(chunks, *mesh):
    config = small_config(*mesh)
    config.train.update(loss_chunks=chunks, label_smoothing=0.1)
    return config

  want_losses, want_params = train(config(0), num_steps=2)
  # On a 2x2x2 mesh: every chunk keeps the batch sharding, its logits split over 'tensor'.
  got_losses, got_params = train(config(4, 2, 2, 2), num_steps=2)
  np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
  jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5),
               got_params, want_params)


@pytest.mark.parametrize('arch, tie_embeddings', [('encoder_decoder', True), ('encoder', True),
                                                  ('decoder', False)])
def test_chunked_loss_sums_and_gradients_for_every_arch(arch, tie_embeddings):
  config = small_config(dropout=0.1)
  config.model.update(arch=arch, tie_embeddings=tie_embeddings)
  config.train.label_smoothing = 0.1
  model_cfg = config_lib.model_config(config)
  graphdef, params, non_params = nnx.split(build(model_cfg, nnx.Rngs(0)), nnx.Param, ...)
  batch = synthetic_batch(0)
  if arch == 'encoder':  # MLM's features: the encoder predicts the decoder's targets here
    batch = dict(encoder_input_tokens=batch['decoder_input_tokens'],
                 encoder_target_tokens=batch['decoder_target_tokens'],
                 encoder_loss_weights=batch['decoder_loss_weights'])

  @jax.jit
  def sums_and_grads(params):  # 3 chunks of the 8 targets: one position of padding per row
    def loss(params, chunks):
      config.train.loss_chunks = chunks
      model = nnx.merge(graphdef, params, non_params)
      side = 'encoder' if arch == 'encoder' else 'decoder'
      sums = objectives.base.token_sums(
          model, batch, (f'{side}_target_tokens', f'{side}_loss_weights'), config.train,
          dropout_key=jax.random.key(1))  # the same masks for both
      return sums['loss'], sums
    return [jax.grad(loss, has_aux=True)(params, chunks) for chunks in (0, 3)]

  (want_grads, want), (got_grads, got) = sums_and_grads(params)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5),
               got_grads, want_grads)


def test_chunked_loss_needs_less_memory():
  # T5's vocabulary with a narrow model: the float32 logits (8, 128, 32768) are 128 MiB.
  config = small_config()
  config.model.vocab_size = 32768
  config.data.targets_length = 128
  run = small_run(config)
  batch = plan.abstract_batch(config.data, run.batch_sharding)

  def compiled(chunks):  # the real step, compiled from shapes: nothing runs
    config.train.loss_chunks = chunks  # the run's config: its loss reads it
    return plan.compile_train_step(run, run.loss(), batch)

  whole, chunked = compiled(0), compiled(4)
  whole_bytes, chunked_bytes = (c.memory_analysis().temp_size_in_bytes for c in (whole, chunked))
  print(f'train step temporaries: {whole_bytes / 2**20:.1f} MiB with all logits, '
        f'{chunked_bytes / 2**20:.1f} MiB in 4 chunks')
  assert chunked_bytes < 0.6 * whole_bytes
  # No buffer of every logit, as (b, l, vocab) or as (b * l, vocab), in the chunked program.
  logits = ('f32[8,128,32768]', 'f32[1024,32768]')
  assert any(shape in whole.as_text() for shape in logits)
  assert not any(shape in chunked.as_text() for shape in logits)


@pytest.mark.parametrize('objective, error', [
    ('electra', "data.objective='electra' needs the full logits"),
    ('next_sentence', "data.objective='mlm_nsp' needs the full logits"),
    ('distillation', 'distillation needs the full logits')])
def test_loss_chunks_are_refused_where_the_objective_needs_all_logits(objective, error):
  config = small_config()
  config.train.loss_chunks = 4
  if objective == 'electra':
    config.model.arch = config.data.objective = 'electra'
    config.model.num_decoder_layers = 0
  if objective == 'next_sentence':
    config.model.update(arch='encoder', next_sentence=True, num_decoder_layers=0)
    config.data.objective = 'mlm_nsp'
  if objective == 'distillation':
    config.train.teacher_workdir = 'runs/teacher'
  with pytest.raises(ValueError, match=error) as error:
    objectives.for_run(config, config_lib.model_config(config))
  assert '\n' not in str(error.value)


@pytest.mark.slow  # 8-29 s on 2 cores, most over 20
def test_a_mixtures_step_reports_each_components_loss_and_accuracy():
  """Per-component metrics of the step (its batch over 2 devices, in 2 microbatches) against the
  loss of each component's rows alone, from the model's own logits."""
  components = ('books', 'web')
  config = small_config(data=2, microbatches=2)
  config.train.update(label_smoothing=0.1, z_loss=1e-2)
  for name in components:
    config.data.mixture[name] = dict(source='bundled', weight=1.0)
  run = small_run(config)
  batch = synthetic_batch(0)
  batch['component'] = np.array([1, 0, 0, 1, 1, 1, 0, 1], np.int32)
  with run.sharding():
    state = run.spec.init()
    # the logits the step sees, before its update
    logits = jax.jit(lambda params: run.model(params)(batch, deterministic=True))(state.params)
    want = [objectives.losses.token_losses(
        logits[batch['component'] == c], batch['decoder_target_tokens'][batch['component'] == c],
        batch['decoder_loss_weights'][batch['component'] == c], z_loss=1e-2, label_smoothing=0.1)
            for c in range(len(components))]
    step = run.jit_train_step(run.loss())
    _, metrics = step(state, {k: jax.device_put(v, run.batch_sharding) for k, v in batch.items()},
                      None)
  got = metrics['components']
  assert {name: value.shape for name, value in got.items()} == dict.fromkeys(
      ('loss', 'accuracy', 'target_tokens'), (len(components),))
  for c, sums in enumerate(want):
    np.testing.assert_allclose(got['loss'][c], sums['loss'] / sums['weight'], rtol=1e-5)
    np.testing.assert_allclose(got['accuracy'][c], sums['correct'] / sums['weight'], rtol=1e-5)
    assert got['target_tokens'][c] == sums['weight']
  assert_components_make_up(got, metrics['target_tokens'],
                            {name: metrics[name] for name in ('loss', 'accuracy')})


def test_a_step_without_a_mixture_has_no_component_metrics():
  run = small_run(small_config())
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in synthetic_batch(0).items()}
  with run.sharding():
    _, metrics = jax.eval_shape(step_lib.make_train_step(
        run.spec.graphdef, run.spec.non_params, run.loss(), run.config.train, run.optimizer,
        run.schedule), run.spec.abstract, batch, None)
  assert sorted(metrics) == ['accuracy', 'grad_norm', 'learning_rate', 'loss', 'target_tokens',
                             'z_loss']


@pytest.mark.slow  # two runs of 5 steps (and the module's dense one): 292 s at a load of 15
def test_long_t5_encoders_give_the_same_losses_on_a_2x2x2_mesh(one_device_losses):
  """A transient-global encoder (radius 7, 8 global tokens over the 32 inputs), its blocks and
  global tokens sharded over data, fsdp and tensor, trains as on one device."""
  def long_config(data=1, fsdp=1, tensor=1):
    config = small_config(data, fsdp, tensor)
    config.model.update(encoder_attention='transient_global', local_radius=7,
                        global_block_size=4)
    return config

  one_device = train_losses(long_config())
  np.testing.assert_allclose(train_losses(long_config(2, 2, 2)), one_device, rtol=1e-5)
  assert one_device != one_device_losses  # not the dense encoder's
