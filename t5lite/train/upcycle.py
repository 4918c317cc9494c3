"""Sparse upcycling (Komatsuzaki et al. 2022; T5X's `sparse_upcycle`): a model with experts that
starts from a dense run's parameters (`train.upcycle_workdir`), each expert of a sparse layer a
copy of that layer's MLP, the routers new (the run's initialisation), the rest as they were.

The dense run's model must be this one without experts: every parameter the same shape, each
MLP one expert's. With `model.expert_weights=normalized` and no token over capacity, the
upcycled model computes what the dense one did (a token's chosen copies, weighed to 1); with
Switch's probability weights, its MLPs' outputs come scaled by the router's probability.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from t5lite import models
from t5lite.models.params import Params, flatten, stack_layers, unstack_layers
from t5lite.train import run as run_lib


def start(run: run_lib.Run):
  """A function returning the parameters the run starts from, from train.upcycle_workdir, once
  that workdir's model is checked to be this one's without experts; None where it is not set."""
  config = run.config
  if not config.train.upcycle_workdir:
    return None
  where = f'train.upcycle_workdir={config.train.upcycle_workdir}'
  if not run.model_cfg.num_experts:
    raise ValueError(f'{where} upcycles a dense run into experts; set model.num_experts')

  def check(dense_cfg, vocabulary_name):
    if vocabulary_name not in (None, config.data.vocabulary):
      raise ValueError(f'{where} was trained on vocabulary {vocabulary_name!r}, this run '
                       f'reads {config.data.vocabulary!r}')
    if dense_cfg.num_experts:
      raise ValueError(f'{where} holds a model with experts already; upcycle a dense one')
    check_shapes(params_of(dense_cfg), params_of(run.model_cfg), where)

  dense_cfg, _, _ = run.load_other('upcycle_workdir', check, restore=False)
  return lambda: upcycled(run.load_other('upcycle_workdir', lambda *_: None)[2], dense_cfg,
                          run.spec.init().params, run.model_cfg)


def params_of(cfg) -> dict:
  """Each parameter's shape, unrolled: {path: shape}."""
  unrolled_cfg = dataclasses.replace(cfg, scan_layers=False)
  model = nnx.eval_shape(lambda: models.build(unrolled_cfg, nnx.Rngs(0)))
  return {path: x.shape for path, x in flatten(nnx.to_pure_dict(nnx.state(model, nnx.Param)))}


def dense_path(path: tuple) -> tuple:
  """An expert weight's path (..., 'mlp', 'wi') -> its dense MLP's (..., 'mlp', 'wi', 'kernel')."""
  return (*path, 'kernel') if path[-2] == 'mlp' else path


def check_shapes(dense: dict, sparse: dict, where: str) -> None:
  """One line for a parameter of the model with experts that the dense one lacks or holds in
  another shape (an expert: the shape of the dense MLP's weight)."""
  for path, shape in sparse.items():
    if path[-1] == 'router':
      continue
    expected = dense.get(dense_path(path))
    if expected not in (shape, shape[1:]):
      raise ValueError(f'{where} holds another model: {"/".join(map(str, path))} is '
                       f'{expected} there, {shape} here; upcycle a run of this model without '
                       'experts')


def unrolled(params, cfg) -> dict:
  """{path: array} of params (an nnx.State in cfg's layout), unrolled."""
  params = nnx.to_pure_dict(params)
  return dict(flatten(unstack_layers(params) if cfg.scan_layers else params))


def upcycled(dense_params, dense_cfg, fresh_params, cfg) -> Params:
  """The dense parameters (an nnx.State, in its layout) as those of `cfg`'s model with each
  sparse layer's experts copies of its MLP, and its router `fresh_params`' (the run's own
  initialisation, in cfg's layout)."""
  dense, fresh = unrolled(dense_params, dense_cfg), unrolled(fresh_params, cfg)
  out: Params = {}
  for path, shape in params_of(cfg).items():
    value = fresh[path] if path[-1] == 'router' else dense[dense_path(path)]
    if value.shape != shape:  # an expert: (d_in, d_out) -> (experts, d_in, d_out)
      value = jax.jit(lambda x, s=shape: jnp.broadcast_to(x, s))(value)
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return stack_layers(out) if cfg.scan_layers else out
