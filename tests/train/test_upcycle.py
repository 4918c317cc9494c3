"""Sparse upcycling: a run with experts started from a dense workdir computes, before its first
step, what the dense model computes; `t5lite train` then trains it on."""

import types

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import cli
from t5lite.train import run as run_lib
from t5lite.train import upcycle
from test_loop import SMALL, metrics

TWO_LAYERS = ['--config.model.num_encoder_layers=2', '--config.model.num_decoder_layers=2',
              '--config.data.source=synthetic']
# top-2 of 4, weighed to 1, every token within capacity: each token's experts are two copies
UPCYCLED = ['--config.model.num_experts=4', '--config.model.expert_top_k=2',
            '--config.model.expert_weights=normalized', '--config.model.eval_capacity_factor=2',
            '--config.model.scan_layers=true', '--config.model.decoder_sparse_step=1']


@pytest.fixture(scope='module')
def dense(tmp_path_factory) -> str:
  workdir = str(tmp_path_factory.mktemp('dense'))
  assert cli.main(['train', f'--workdir={workdir}', *SMALL, *TWO_LAYERS,
                   '--config.train.steps=2']) == 0
  return workdir


def batch() -> dict:
  rng = np.random.RandomState(0)
  return {'encoder_input_tokens': jnp.asarray(rng.randint(2, 8000, (8, 32)), jnp.int32),
          'decoder_input_tokens': jnp.asarray(rng.randint(2, 8000, (8, 8)), jnp.int32)}


def logits(run: run_lib.Run, params) -> np.ndarray:
  with run.sharding():
    model = nnx.merge(run.spec.graphdef, params, run.spec.non_params)
    return np.asarray(jax.jit(lambda m, b: m(b))(model, batch()))


@pytest.mark.slow  # 37 s on 2 cores, and 44 s for the dense run
def test_upcycled_model_computes_what_the_dense_one_did(dense, tmp_path):
  config = cli.load_run_config(types.SimpleNamespace(workdir=dense), [])
  dense_run = run_lib.make_run(config)
  _, dense_params = dense_run.restore_params(dense)
  config.model.update(num_experts=4, expert_top_k=2, expert_weights='normalized',
                      eval_capacity_factor=2.0, scan_layers=True, decoder_sparse_step=1)
  config.train.upcycle_workdir = dense
  run = run_lib.make_run(config)
  params = upcycle.start(run)()
  layers = params['encoder']['layers']  # scanned in groups of 2, layer 1 of each sparse
  np.testing.assert_array_equal(layers['block_1']['mlp']['wi_0'][0, 3],
                                dense_params['encoder']['layers'][1]['mlp']['wi_0']['kernel'])
  state = run_lib.state_lib.from_params(run.spec, run.optimizer, params, 0)
  np.testing.assert_allclose(logits(run, state.params), logits(dense_run, dense_params),
                             atol=2e-5)


@pytest.mark.slow  # 85 s on 2 cores
def test_train_starts_from_the_dense_run_and_trains_on(dense, tmp_path):
  workdir = str(tmp_path / 'upcycled')
  assert cli.main(['train', f'--workdir={workdir}', *SMALL, *TWO_LAYERS, *UPCYCLED,
                   f'--config.train.upcycle_workdir={dense}', '--config.train.steps=1']) == 0
  # batch 0 again: the dense run's first loss was a fresh model's (9.38), this one starts from
  # the dense run's 2 steps (8.39)
  assert metrics(workdir)[1]['loss'] < metrics(dense)[1]['loss'] - 0.5
  # resumed, it reads its own checkpoint: the dense workdir is not needed any more
  assert cli.main(['train', f'--workdir={workdir}', '--config.train.steps=2',
                   '--config.train.upcycle_workdir=/no/such/workdir']) == 0
