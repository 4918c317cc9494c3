"""A model's parameters as plain trees: logical axes, get/load, and the scanned <-> unrolled layout.

`get_params(model)` gives the nested dict of arrays that checkpoints and the Hugging Face export
exchange (`{'encoder': {'layers': {0: {'self_attention': {'q': {'kernel': ...}}}}}}`); with
`scan_layers` the per-layer dicts become one dict whose arrays have a leading 'layers' axis, or
with experts, one per position in the scanned groups of layers (`stack_layers` / `unstack_layers`
convert, for every layer stack a registered family names).
"""

from collections.abc import Mapping
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from t5lite.models import registry

Params = dict[str, Any]


def logical_axes(model: nnx.Module) -> nnx.State:
  """PartitionSpecs of logical axis names, in the structure of `nnx.state(model, nnx.Param)`.

  Always the logical names (never mapped through rules in context), so the trainer can apply its
  own table, e.g. `flax.linen.logical_to_mesh_axes(tuple(spec), rules)` per leaf.
  """
  def spec(variable: nnx.Variable) -> nnx.Variable:
    return variable.replace(PartitionSpec(*variable.get_metadata()['out_sharding']))

  return jax.tree.map(spec, nnx.state(model, nnx.Param),
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def get_params(model: nnx.Module) -> Params:
  """The model's parameters as a nested dict of arrays (integer keys index unrolled layers)."""
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def load_params(model: nnx.Module, params: Mapping[str, Any]) -> None:
  """Writes `params` (the structure `get_params` gives) into `model`, cast to its param dtype."""
  state = nnx.state(model, nnx.Param)
  expected, given = dict(flatten(nnx.to_pure_dict(state))), dict(flatten(params))
  if expected.keys() != given.keys():
    missing = sorted('/'.join(map(str, k)) for k in expected.keys() - given.keys())
    extra = sorted('/'.join(map(str, k)) for k in given.keys() - expected.keys())
    raise ValueError(f'params do not match the model (was scan_layers changed?): '
                     f'missing {missing[:3]}, unexpected {extra[:3]}')
  for path, ref in expected.items():
    if jnp.shape(given[path]) != ref.shape:
      raise ValueError(f'param {"/".join(map(str, path))} has shape {jnp.shape(given[path])}, '
                       f'the model has {ref.shape}')
  nnx.replace_by_pure_dict(state, jax.tree.map(lambda x, ref: jnp.asarray(x, ref.dtype),
                                               dict(params), nnx.to_pure_dict(state)))
  nnx.update(model, state)


def flatten(tree: Mapping[Any, Any], prefix: tuple = ()):
  """Yields (path, leaf) of a nested dict, path a tuple of keys."""
  for key, value in tree.items():
    if isinstance(value, Mapping):
      yield from flatten(value, (*prefix, key))
    else:
      yield (*prefix, key), value


def unstack_layers(params: Mapping[str, Any]) -> Params:
  """Scanned layout -> unrolled: stack['layers'][name] (n, ...) -> stack['layers'][i][name]; a
  stack with experts scans groups of sparse_step layers, stack['layers']['block_j'][name]
  (n / sparse_step, ...), whose layer i * sparse_step + j is unrolled layer j of group i."""
  out = dict(params)
  for stack in registry.stack_names():
    if 'layers' in out.get(stack, {}):
      layers = out[stack]['layers']
      group = [layers[f'block_{j}'] for j in range(len(layers)) if f'block_{j}' in layers]
      groups = group or [layers]
      count = jax.tree.leaves(groups)[0].shape[0]
      out[stack] = {**out[stack], 'layers': {
          i * len(groups) + j: jax.tree.map(lambda x, i=i: x[i], block)
          for i in range(count) for j, block in enumerate(groups)}}
  return out


def stack_layers(params: Mapping[str, Any]) -> Params:
  """Unrolled layout -> scanned: stack['layers'][i][name] -> stack['layers'][name] (n, ...), or
  with experts (a sparse MLP has a 'router'), groups stack['layers']['block_j'][name]."""
  out = dict(params)
  for stack in registry.stack_names():
    if 'layers' in out.get(stack, {}):  # an import may lack a stack's layers
      layers = out[stack]['layers']
      ordered = [layers[i] for i in sorted(layers)]
      sparse = sum('router' in layer.get('mlp', {}) for layer in ordered)
      step = len(ordered) // sparse if sparse else 0  # the group: sparse_step layers

      def stacked(blocks):
        return jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)

      out[stack] = {**out[stack], 'layers': stacked(ordered) if not step else {
          f'block_{j}': stacked(ordered[j::step]) for j in range(step)}}
  return out
