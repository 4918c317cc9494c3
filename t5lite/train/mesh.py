"""The device mesh and the rules that map logical axis names onto it.

One mesh with axes ('data', 'fsdp', 'expert', 'tensor'), GSPMD-style (`AxisType.Auto`): parameters and
batches carry logical names (`embed`, `mlp`, `heads`, ...), a short rule table says which mesh
axes each name is split over, and XLA inserts the collectives. Same layout idea as MaxText and
T5X; the rule table is `config.mesh.rules`, so a run can change it from the command line
(`--config.mesh.rules.embed=` replicates the embedding dimension).

Past one slice (or one GPU node) the mesh is hybrid, as MaxText's: `mesh.data`, `mesh.fsdp` and
`mesh.tensor` lay out the devices of each slice over its fast interconnect (ICI, NVLink), and
`mesh.dcn_data`, `mesh.dcn_fsdp` repeat that layout across slices over the data-center network
(DCN). The axes keep their names, data = dcn_data * data and fsdp = dcn_fsdp * fsdp, so the rules
do not change; tensor parallelism, the chattiest, never crosses a slice.

`mesh.expert` splits sparse experts (models/experts.py) over its devices and, like data, the
batch: the dense layers see it as data parallelism, and each sparse layer sends every token to
its expert's device and back, two all-to-alls. Like tensor, it stays inside a slice.
"""

import logging
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from t5lite import config as config_lib

log = logging.getLogger(__name__)

MESH_AXES = ('data', 'fsdp', 'expert', 'tensor')
# Chips whose mesh may cut a physical torus axis in two, as jax.make_mesh allows for them.
SPLIT_PHYSICAL_AXES_KINDS = ('TPU v5 lite', 'TPU v5e')


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


def _with_the_rest(sizes: list[int], total: int, described: str) -> list[int]:
  """`sizes` with a single -1 resolved to what the others leave of `total`, where they divide
  it; one line for a size below 1 (-1 aside) or two -1s."""
  config_lib.check_mesh_sizes(sizes, described)
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes and total % fixed == 0:
    sizes[sizes.index(-1)] = total // fixed
  return sizes


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
  """Axis sizes in MESH_AXES order, with a single -1 resolved to the devices the others leave
  (expert: 1 where mesh_cfg has none, as configs made before experts)."""
  sizes = [int(mesh_cfg.get(name, 1) if name == 'expert' else mesh_cfg[name])
           for name in MESH_AXES]
  described = ' '.join(f'mesh.{n}={s}' for n, s in zip(MESH_AXES, sizes))
  sizes = _with_the_rest(sizes, num_devices, described)
  if math.prod(sizes) != num_devices:
    raise ValueError(f'{described} does not fit {num_devices} devices; make the product of the '
                     f'mesh sizes {num_devices} (or leave one at -1)')
  return tuple(sizes)


def device_slice(device: jax.Device) -> int:
  """The group of devices one fast interconnect joins: a TPU's slice, a GPU's process (one per
  node, as launch/slurm_gpu.sbatch runs them); the CPU devices of a test are one slice."""
  if device.platform == 'tpu':
    return getattr(device, 'slice_index', 0)
  return device.process_index if device.platform == 'gpu' else 0


def slices_of(devices: Sequence[jax.Device], slice_of=device_slice) -> list[list[jax.Device]]:
  """`devices` grouped by `slice_of(device)`, in the order of the slice keys."""
  groups = {}
  for device in devices:
    groups.setdefault(slice_of(device), []).append(device)
  return [groups[key] for key in sorted(groups)]


def describe_devices(kind: str, platform: str, slice_sizes: Sequence[int]) -> str:
  """'16 TPU v4 devices in 2 slices of 8': what a DCN mistake is measured against."""
  unit = 'node' if platform == 'gpu' else 'slice'
  sizes = '/'.join(map(str, sorted(set(slice_sizes))))
  return (f'{sum(slice_sizes)} {kind} devices in {len(slice_sizes)} {unit}'
          f'{"s" if len(slice_sizes) > 1 else ""} of {sizes}')


def dcn_shape(mesh_cfg, num_slices: int, devices: str) -> tuple[int, ...]:
  """Axis sizes across slices in MESH_AXES order (expert and tensor: 1), a -1 (dcn_data's default) resolved
  to the slices the other leaves; one line unless they multiply to `num_slices` (`devices` says
  what the devices are)."""
  if 'dcn_tensor' in mesh_cfg:
    raise ValueError('mesh.dcn_tensor: tensor parallelism stays inside a slice (its '
                     'collectives run every layer); split over DCN with mesh.dcn_data or '
                     'mesh.dcn_fsdp')
  given = [int(mesh_cfg.get('dcn_data', -1)), int(mesh_cfg.get('dcn_fsdp', 1))]
  described = f'mesh.dcn_data={given[0]} mesh.dcn_fsdp={given[1]}'
  sizes = [*_with_the_rest(given, num_slices, described), 1, 1]
  if math.prod(sizes) != num_slices:
    raise ValueError(f'{described} must multiply to the number of slices (nodes), and the '
                     f'devices are {devices}; set mesh.dcn_data * mesh.dcn_fsdp = {num_slices}')
  return tuple(sizes)


def hybrid_shape(mesh_cfg, num_slices: int, per_slice: int,
                 devices: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """The axis sizes across slices and inside one (MESH_AXES order); one line for either
  mistake, the second saying that past one slice mesh.data, fsdp and tensor count a slice's
  devices."""
  dcn = dcn_shape(mesh_cfg, num_slices, devices)
  try:
    return dcn, mesh_shape(mesh_cfg, per_slice)
  except ValueError as error:
    if num_slices == 1:
      raise
    raise ValueError(f'{error}: past one slice they lay out the {per_slice} devices of each '
                     f'slice (the devices are {devices})') from None


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None, *,
              slice_of=device_slice) -> Mesh:
  """The ('data', 'fsdp', 'expert', 'tensor') mesh over `devices` (default: all), sized by `mesh_cfg`.

  Built as `mesh_utils.create_hybrid_device_mesh` builds it: each slice's devices laid out by
  `create_device_mesh` (by their physical torus on TPUs), the slices tiled along the DCN axes,
  so an axis' index is slice-major. The slice of a device is `slice_of(device)`
  (`device_slice`); tests pass another to make slices of CPU devices.
  """
  slices = slices_of(list(jax.devices() if devices is None else devices), slice_of)
  first = slices[0][0]
  described = describe_devices(first.device_kind if first.platform != 'cpu' else 'cpu',
                               first.platform, [len(s) for s in slices])
  if len({len(s) for s in slices}) > 1:
    raise ValueError(f'the devices are {described}: slices of different sizes cannot share '
                     'one mesh')
  dcn, ici = hybrid_shape(mesh_cfg, len(slices), len(slices[0]), described)
  split = first.device_kind in SPLIT_PHYSICAL_AXES_KINDS
  blocks = np.empty(dcn, dtype=object)
  for index, devices_of_slice in zip(np.ndindex(*dcn), slices):
    blocks[index] = mesh_utils.create_device_mesh(ici, devices_of_slice,
                                                  allow_split_physical_axes=split)
  return Mesh(np.block(blocks.tolist()), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))


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
  of its `microbatches`), the attention heads and FFN width (tensor parallelism) and the experts
  (an expert axis needs them); anything else that does not divide is replicated by
  `logical_to_mesh_spec`.
  """
  rules = dict(rules)
  if mesh.shape['expert'] > 1 and not model_cfg.num_experts:
    raise ValueError(f'mesh.expert={mesh.shape["expert"]} splits sparse experts and the model '
                     'has none; set mesh.expert=1 or model.num_experts')
  sizes = [('data.batch_size', data_cfg.batch_size, 'batch'),
           ('model.num_heads', model_cfg.num_heads, 'heads'),
           ('model.d_ff', model_cfg.d_ff, 'mlp')]
  for setting, size, logical in sizes + [('model.num_experts', model_cfg.num_experts, 'expert')
                                         ] * bool(model_cfg.num_experts):
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
