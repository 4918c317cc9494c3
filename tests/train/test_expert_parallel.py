"""Expert parallelism on 8 fake CPU devices: the experts split over the `expert` mesh axis give the
losses and gradients of one device, the tokens reach their experts by all-to-all, and a
checkpoint saved on one expert layout restores on another bit for bit."""

import types

import jax
import numpy as np
import pytest
from flax import nnx

from t5lite import cli
from t5lite import config as config_lib
from t5lite.train import mesh as mesh_lib
from t5lite.train import run as run_lib
from test_loop import SMALL, saved_params

BATCH, INPUTS, TARGETS, VOCAB = 8, 16, 8, 128


def moe_config(data=1, expert=1, fsdp=1, top_k=1):
  config = config_lib.base_config()
  config.model.update(config_lib.T5_1_1, vocab_size=VOCAB, d_model=32, d_ff=64, num_heads=2,
                      d_kv=16, num_encoder_layers=2, num_decoder_layers=2, num_experts=8,
                      expert_top_k=top_k, train_capacity_factor=1.0)
  config.data.update(batch_size=BATCH, inputs_length=INPUTS, targets_length=TARGETS)
  config.mesh.update(data=data, fsdp=fsdp, expert=expert, tensor=1)
  return config


def mesh_run(config) -> run_lib.Run:
  size = config.mesh.data * config.mesh.fsdp * config.mesh.expert
  return run_lib.make_run(config, mesh_lib.make_mesh(config.mesh, jax.devices()[:size]),
                          reads_text=False)


def synthetic_batch(seed: int = 0) -> dict:
  rng = np.random.RandomState(seed)
  targets = rng.randint(2, VOCAB, (BATCH, TARGETS)).astype(np.int32)
  targets[-2:, TARGETS // 2:] = 0
  return dict(encoder_input_tokens=rng.randint(2, VOCAB, (BATCH, INPUTS)).astype(np.int32),
              decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
              decoder_target_tokens=targets,
              decoder_loss_weights=(targets > 0).astype(np.int32))


def loss_and_grads(run: run_lib.Run, params=None):
  """(minimised loss, its metrics, gradients, the compiled HLO) of one training batch."""
  loss = run.loss()
  spec = run.spec

  def minimised(params, batch):
    model = nnx.merge(spec.graphdef, params, spec.non_params)
    sums = loss.sums(model, batch, None, jax.random.key(1), train=True)
    return loss.minimised(sums, loss.denominators(batch)), loss.metrics(sums)

  with run.sharding():
    params = spec.init().params if params is None else jax.device_put(params,
                                                                      spec.shardings.params)
    batch = {k: jax.device_put(v, run.batch_sharding) for k, v in synthetic_batch().items()}
    step = jax.jit(jax.value_and_grad(minimised, has_aux=True))
    (value, metrics), grads = step(params, batch)
    hlo = step.lower(params, batch).compile().as_text()
  return value, metrics, grads, hlo, params


@pytest.fixture(scope='module')
def one_device():
  return loss_and_grads(mesh_run(moe_config()))


@pytest.mark.slow  # 17-24 s on 2 cores, and 32 s for the one-device fixture
@pytest.mark.parametrize('data, expert', [(2, 4), (1, 8)])
def test_expert_axis_gives_one_devices_losses_and_gradients(one_device, data, expert):
  value, metrics, grads, _, params = one_device
  run = mesh_run(moe_config(data=data, expert=expert))
  wi = run.spec.shardings.params['encoder']['layers'][1]['mlp']['wi_0']
  assert wi.get_value().spec[0] == 'expert'  # (experts, d_model, d_ff): experts split
  split_value, split_metrics, split_grads, hlo, _ = loss_and_grads(
      run, jax.tree.map(np.asarray, params))
  np.testing.assert_allclose(split_value, value, rtol=1e-5)
  for name in ('loss', 'router_z_loss', 'load_balance_loss', 'expert_dropped'):
    np.testing.assert_allclose(split_metrics[name], metrics[name], rtol=1e-5, atol=1e-7)
  assert 0 < metrics['expert_dropped'] < 0.5  # capacity 1.0 drops a few
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.tree.map(np.asarray, split_grads), jax.tree.map(np.asarray, grads))
  assert 'all-to-all' in hlo
  assert 'all-to-all' not in one_device[3]


@pytest.mark.slow  # 53 s on 2 cores
def test_a_checkpoint_restores_on_other_expert_layouts_bit_for_bit(tmp_path):
  """Trained 2 steps with the experts over 4 devices (data 2); restored with them over 2 (data
  4), and on one device: the same bits, each expert's weights whole on the devices holding it."""
  workdir = str(tmp_path / 'run')
  flags = [*SMALL, '--config.data.source=synthetic', '--config.model.num_experts=8',
           '--config.model.encoder_sparse_step=1', '--config.model.decoder_sparse_step=1',
           '--config.train.steps=2', '--config.checkpoint.every_steps=2']
  assert cli.main(['train', f'--workdir={workdir}', *flags, '--config.mesh.data=2',
                   '--config.mesh.expert=4']) == 0
  saved = saved_params(workdir, 2)
  for mesh, devices in ((dict(data=4, expert=2), 8), (dict(data=1, expert=1), 1)):
    config = cli.load_run_config(types.SimpleNamespace(workdir=workdir),
                                 [f'--config.mesh.{k}={v}' for k, v in mesh.items()])
    run = run_lib.make_run(config, mesh_lib.make_mesh(config.mesh, jax.devices()[:devices]))
    _, params = run.restore_params(workdir, step=2)
    wi = params['encoder']['layers'][0]['mlp']['wi_0'].get_value()
    assert wi.sharding.shard_shape(wi.shape)[0] == 8 // mesh['expert']
    restored = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))[0]
    assert len(restored) == len(saved)
    for path, leaf in restored:
      name = '/' + '/'.join(str(key.key) for key in path) + '/value'
      np.testing.assert_array_equal(np.asarray(leaf), saved[name], err_msg=name)
