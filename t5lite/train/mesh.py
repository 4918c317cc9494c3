"""The device mesh and the rules that map logical axis names onto it.

One mesh with axes ('data', 'fsdp', 'tensor'), GSPMD-style (`AxisType.Auto`): parameters and
batches carry logical names (`embed`, `mlp`, `heads`, ...), a short rule table says which mesh
axes each name is split over, and XLA inserts the collectives. Same layout idea as MaxText and
T5X; the rule table is `config.mesh.rules`, so a run can change it from the command line
(`--config.mesh.rules.embed=` replicates the embedding dimension).
"""

import logging
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

MESH_AXES = ('data', 'fsdp', 'tensor')


def rule_table(rules_cfg: Mapping[str, str]) -> tuple:
  """`config.mesh.rules` (logical name -> 'fsdp', 'data,fsdp' or '' for replicated) as the
  (name, mesh axes) pairs flax and `logical_to_mesh_spec` read; one line for a bad rule."""
  table = []
  for logical, text in rules_cfg.items():
    axes = tuple(a.strip() for a in str(text).split(',') if a.strip())
    if not set(axes) <= set(MESH_AXES) or len(set(axes)) != len(axes):
      raise ValueError(f'config.mesh.rules.{logical}={text!r}: give mesh axes of '
                       f'{", ".join(MESH_AXES)} separated by commas, each once, or \'\' to '
                       'replicate')
    table.append((logical, axes[0] if len(axes) == 1 else axes or None))
  return tuple(table)


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
  """Axis sizes in MESH_AXES order, with a single -1 resolved to the devices the others leave."""
  sizes = [int(mesh_cfg[name]) for name in MESH_AXES]
  described = ' '.join(f'mesh.{n}={s}' for n, s in zip(MESH_AXES, sizes))
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'{described}: sizes must be positive, with at most one -1 (the rest)')
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes and num_devices % fixed == 0:
    sizes[sizes.index(-1)] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(f'{described} does not fit {num_devices} devices; make the product of the '
                     f'mesh sizes {num_devices} (or leave one at -1)')
  return tuple(sizes)


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The ('data', 'fsdp', 'tensor') mesh over `devices` (default: all), sized by `mesh_cfg`."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def _mesh_axes(logical: str, rules: Mapping) -> tuple[str, ...]:
  """The mesh axes one logical name is split over, as a tuple (empty: replicated)."""
  if logical not in rules:
    raise ValueError(f'logical axis {logical!r} has no sharding rule; add it to the rules '
                     f'(known: {", ".join(rules)})')
  axes = rules[logical] or ()
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  if not set(axes) <= set(MESH_AXES):
    raise ValueError(f'the rule for {logical!r} names mesh axes {axes}; use only '
                     f'{", ".join(MESH_AXES)}')
  return axes


def logical_to_mesh_spec(spec: PartitionSpec, mesh: Mesh, rules,
                         shape: Sequence[int] | None = None) -> PartitionSpec:
  """A PartitionSpec of mesh axes for one PartitionSpec of logical names.

  Each mesh axis is used at most once: a later dimension that maps to an axis an earlier one
  took stays replicated (so activations `('batch', 'length', 'embed')` shard over batch only).
  With `shape`, a dimension whose size does not divide its mesh axes is replicated instead of
  failing, with a warning: it costs memory, never correctness. Configs that would hit this on
  heads or d_ff are refused earlier by `check_divisibility`.
  """
  rules = dict(rules)
  used = set()
  out = []
  for dim, entry in enumerate(spec):
    names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    axes = tuple(a for n in names for a in _mesh_axes(n, rules) if a not in used)
    split = math.prod(mesh.shape[a] for a in axes)
    if shape is not None and shape[dim] % split:
      log.warning('replicating logical axes %s of shape %s: size %d does not divide mesh '
                  'axes %s (%d)', names, tuple(shape), shape[dim], axes, split)
      axes = ()
    used.update(axes)
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*out)


def logical_to_sharding(logical_specs, mesh: Mesh, rules, shapes=None):
  """NamedShardings for a pytree of logical PartitionSpecs (e.g. `t5lite.models.logical_axes`).

  Pass `shapes` (the matching tree of arrays or ShapeDtypeStructs, e.g. from `nnx.eval_shape`)
  to replicate dimensions that do not divide their mesh axes rather than fail at placement.
  """
  def to_sharding(spec, x=None):
    shape = None if x is None else np.shape(x)
    return NamedSharding(mesh, logical_to_mesh_spec(spec, mesh, rules, shape))

  trees = (logical_specs,) if shapes is None else (logical_specs, shapes)
  return jax.tree.map(to_sharding, *trees, is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Sharding of input batches: the leading (example) dimension over the `batch` rule's axes."""
  return NamedSharding(mesh, logical_to_mesh_spec(PartitionSpec('batch'), mesh, rules))


def batch_shards(mesh: Mesh, rules) -> int:
  """How many ways the `batch` rule splits a global batch on this mesh."""
  return math.prod(mesh.shape[a] for a in _mesh_axes('batch', dict(rules)))


def check_divisibility(model_cfg, data_cfg, mesh: Mesh, rules,
                       microbatches: int = 1) -> None:
  """Refuse, with one line, a batch or model that the mesh cannot split evenly.

  Only the sizes whose split the rules make a hard requirement: the batch (every step, and each
  of its `microbatches`) and the attention heads and FFN width (tensor parallelism); anything
  else that does not divide is replicated by `logical_to_mesh_spec`.
  """
  rules = dict(rules)
  for setting, size, logical in (('data.batch_size', data_cfg.batch_size, 'batch'),
                                 ('model.num_heads', model_cfg.num_heads, 'heads'),
                                 ('model.d_ff', model_cfg.d_ff, 'mlp')):
    axes = _mesh_axes(logical, rules)
    split = math.prod(mesh.shape[a] for a in axes)
    if size % split:
      where = '*'.join(f'mesh.{a}' for a in axes)
      raise ValueError(f'{setting}={size} is not divisible by {where}={split}; change '
                       f'{setting} or pick {where} dividing {size}')
  shards = batch_shards(mesh, rules)
  if microbatches < 1 or data_cfg.batch_size % (microbatches * shards):
    raise ValueError(f'train.microbatches={microbatches} must divide data.batch_size='
                     f'{data_cfg.batch_size} into microbatches that split evenly over the '
                     f'{shards} batch shards of the mesh')
