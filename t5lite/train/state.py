"""TrainState and where it lives on the mesh: created sharded, never materialised on one device.

Parameters are placed by their logical axis names through the rule table; optimizer state follows
the parameter it belongs to (a factored Adafactor row or column drops the matching axis), so
sharding a model over `fsdp` shards its Adam moments the same way.
"""

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from t5lite import models
from t5lite.models.config import ModelConfig
from t5lite.models.params import flatten
from t5lite.train import mesh as mesh_lib
from t5lite.train import optim
from t5lite.train import spikes as spikes_lib


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Any  # nnx.State of float32 parameters
  opt_state: Any
  rng: jax.Array  # base key; step k uses fold_in(rng, k), so a resumed run draws the same numbers
  spikes: spikes_lib.SpikeStats  # the loss's running statistics: a resume goes on with them


@dataclasses.dataclass(frozen=True)
class StateSpec:
  """Everything needed to create, restore and step a TrainState on one mesh."""
  graphdef: Any  # the model's structure; merged with params inside the step
  non_params: Any  # the model's state other than parameters: dropout RNG streams, tiny
  shardings: TrainState  # a NamedSharding per leaf
  abstract: TrainState  # ShapeDtypeStructs carrying those shardings (a restore target)
  init: Callable[[], TrainState]  # jitted: builds the state directly in its shardings


def _split(model_cfg: ModelConfig, seed: int):
  return nnx.split(models.build(model_cfg, nnx.Rngs(seed)), nnx.Param, ...)


def _abstract_model(model_cfg: ModelConfig, seed: int = 0) -> nnx.Module:
  return nnx.eval_shape(lambda: models.build(model_cfg, nnx.Rngs(seed)))


def param_axes(model_cfg: ModelConfig) -> nnx.State:
  """Each parameter's logical axis names, from shapes alone: what `optim.make_optimizer` needs to
  factor Adafactor's statistics as T5 does, before `state_spec` is built."""
  return models.logical_axes(_abstract_model(model_cfg))


def state_spec(model_cfg: ModelConfig, optimizer: optax.GradientTransformation, seed: int,
               mesh, rules) -> StateSpec:
  def init() -> TrainState:
    _, params, _ = _split(model_cfg, seed)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), rng=jax.random.PRNGKey(seed),
                      spikes=spikes_lib.init_stats())

  abstract_model = _abstract_model(model_cfg, seed)
  graphdef, _, _ = nnx.split(abstract_model, nnx.Param, ...)
  abstract = jax.eval_shape(init)
  replicated = NamedSharding(mesh, PartitionSpec())
  axes = models.logical_axes(abstract_model)
  param_shardings = mesh_lib.logical_to_sharding(
      axes, mesh, rules, shapes=nnx.state(abstract_model, nnx.Param))
  shardings = TrainState(
      step=replicated, params=param_shardings, rng=replicated,
      spikes=jax.tree.map(lambda _: replicated, spikes_lib.init_stats()),
      opt_state=opt_state_shardings(optimizer, abstract.params, param_shardings,
                                    abstract.opt_state, replicated, axes))
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  # Only the RNG streams survive dead-code elimination: no parameter is computed here. Made on
  # the default device, not the mesh: the step closes over it as a constant, and the mesh may be
  # compile-only (a TPU topology) or abstract (`t5lite plan`).
  non_params = jax.jit(lambda: _split(model_cfg, seed)[2])()
  return StateSpec(graphdef, non_params, shardings, abstract,
                   jax.jit(init, out_shardings=shardings))


def from_params(spec: StateSpec, optimizer: optax.GradientTransformation, params,
                seed: int) -> TrainState:
  """Step 0 of a run that starts from given parameters (pretrained or imported, any layout):
  a fresh optimizer state, everything placed in `spec`'s shardings. Nested arrays, as
  hf.import_hf gives them, may lack parameters (an ELECTRA discriminator's generator): those
  start as the run's initialiser makes them."""
  if isinstance(params, dict):
    arrays = params
    complete = (dict(flatten(arrays)).keys()
                == dict(flatten(nnx.to_pure_dict(spec.abstract.params))).keys())
    params = jax.tree.map(lambda leaf: leaf, (spec.abstract if complete else spec.init()).params)
    nnx.replace_by_pure_dict(params, arrays)
  params = jax.device_put(params, spec.shardings.params)
  opt_state = jax.jit(optimizer.init, out_shardings=spec.shardings.opt_state)(params)
  return jax.device_put(TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                   opt_state=opt_state, rng=jax.random.PRNGKey(seed),
                                   spikes=spikes_lib.init_stats()),
                        spec.shardings)


def opt_state_shardings(optimizer, abstract_params, param_shardings, abstract_opt_state,
                        replicated: NamedSharding, logical_axes=None):
  """Each optimizer-state leaf takes the sharding of its parameter, minus any factored-out axis.

  With `logical_axes`, a leaf may also have the shape of the param's Adafactor view
  (`optim.view_shape`) or that minus an axis: a view dim made of several param dims is replicated.
  """
  def follow(leaf, param, sharding, axes=()):
    if leaf.shape == param.shape:
      return sharding
    spec = tuple(sharding.spec) + (None,) * (len(param.shape) - len(sharding.spec))
    view_spec = tuple(spec[dims[0]] if len(dims) == 1 else None
                      for dims in optim.view_dims(axes, len(param.shape)))
    for shape, dims in ((param.shape, spec), (optim.view_shape(param.shape, axes), view_spec)):
      if leaf.shape == shape:
        return NamedSharding(sharding.mesh, PartitionSpec(*dims))
      # Adafactor's v_row and v_col drop a dim; a square's, which could drop either, stay whole.
      kept = {dims[:i] + dims[i + 1:] for i in range(len(shape))
              if shape[:i] + shape[i + 1:] == leaf.shape}
      if len(kept) == 1:
        return NamedSharding(sharding.mesh, PartitionSpec(*kept.pop()))
    return replicated

  trees = (abstract_params, param_shardings) + (() if logical_axes is None else (logical_axes,))
  return optax.tree_map_params(optimizer, follow, abstract_opt_state, *trees,
                               transform_non_params=lambda _: replicated)
