"""The bytes a train step sends over the data-center network (DCN) and over ICI, for `t5lite plan`.

Two ways, which the plan shows side by side where it compiles:
- analytic, from the parameter bytes and the mesh, counting the collectives a sharded step
  needs as ring algorithms do (an all-reduce of B bytes among n sends 2(n-1)/n * B per member;
  an all-gather or reduce-scatter (n-1)/n * B);
- from the compiled HLO: every collective whose replica groups span slices, counted as XLA's
  hierarchical collectives send it (inside each slice over ICI first, so only each slice's
  share crosses DCN).

Worked example, data parallelism over 2 slices of 4 devices, 100 MB of float32 gradients: each
slice sends 2 * (2-1)/2 * 100 MB = 100 MB over DCN a step, 25 MB from each device; the HLO's
all-reduce of the gradients over all 8 devices (2 slices) counts 2 * 1/2 * 100 MB / 4 = 25 MB
per device too.
"""

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from t5lite.models import experts, family
from t5lite.models.config import ModelConfig


def all_reduce(nbytes: float, members: int) -> float:
  """Bytes each member of a ring all-reduce of `nbytes` sends."""
  return 2 * (members - 1) / members * nbytes


def all_gather(nbytes: float, members: int) -> float:
  """Bytes each member sends in a ring all-gather of `nbytes` (or a reduce-scatter of them)."""
  return (members - 1) / members * nbytes


def dcn_bytes_per_slice(param_bytes: float, dcn_data: int, dcn_fsdp: int) -> float:
  """Bytes one slice sends over DCN in a step: the all-reduce of its gradients across the
  dcn_data replicas (of the 1/dcn_fsdp it keeps) and, across dcn_fsdp, the reduce-scatter of the
  gradients and one all-gather of the parameters. One: XLA keeps the gathered weights for the
  backward pass, with or without remat, in the steps compiled on CPU (unscanned); a scanned
  stack may gather them again in its backward loop, which a compiled plan's count shows."""
  return all_reduce(param_bytes / dcn_fsdp, dcn_data) + 2 * all_gather(param_bytes, dcn_fsdp)


def tensor_parallel_bytes(cfg: ModelConfig, inputs_length: int, targets_length: int,
                          rows: float, tensor: int) -> float:
  """Bytes a device sends over ICI for tensor parallelism in a step: Megatron's two all-reduces
  of each sublayer (self-attention, cross-attention, MLP) of its (rows, length, d_model) output,
  one forward and one of its gradient backward."""
  shapes = family(cfg.arch).shapes(cfg, inputs_length, targets_length)
  itemsize = np.dtype(cfg.dtype).itemsize
  sublayer_bytes = sum(
      stack.layers * (2 + bool(stack.cross_length)) * rows * stack.length * cfg.d_model
      for stack in shapes.stacks) * itemsize
  return 2 * all_reduce(sublayer_bytes, tensor)


def expert_all_to_all_bytes(cfg: ModelConfig, data_cfg, rows: float, expert: int) -> float:
  """Bytes a device sends in a step's all-to-alls among the `expert` devices, (expert - 1) /
  expert of its share each time: each sparse layer sends its (groups, experts, capacity,
  d_model) slots to the experts' devices and their outputs back, and the backward pass the
  gradients of both, and that of the float32 combine weights (groups, tokens, experts, capacity)
  on their way to the router. `rows`: the device's rows of the batch. (Dropless experts are not
  all-to-all'd: their ragged matmuls run where the experts' weights are gathered.)"""
  if expert == 1 or not cfg.num_experts or cfg.expert_dropless:
    return 0.0
  shapes = family(cfg.arch).shapes(cfg, data_cfg.inputs_length, data_cfg.targets_length)
  total = 0.0
  for stack in shapes.stacks:
    groups, group_tokens = experts.group_shape(data_cfg.batch_size, stack.length,
                                               cfg.expert_group_size)
    slots = (groups * rows / data_cfg.batch_size  # the device's share of the slots
             * cfg.num_experts * experts.capacity(cfg, group_tokens, train=True))
    total += stack.sparse_layers * all_gather(
        slots * (4 * cfg.d_model * np.dtype(cfg.dtype).itemsize + group_tokens * 4), expert)
  return total


def analytic_traffic(cfg: ModelConfig, data_cfg, param_bytes: float,
                     ici: Mapping[str, int], dcn: Mapping[str, int],
                     expert_bytes: float = 0.0) -> dict[str, float]:
  """DCN bytes per slice and per device, and ICI bytes per device, of one step.

  `ici` and `dcn` are the mesh's sizes inside a slice and across slices ('data', 'fsdp',
  'expert', 'tensor'). Inside a slice, as the hierarchical collectives run: a device
  reduce-scatters the gradients of its tensor shard over the slice's batch devices (the DCN
  collectives then move its piece), all-gathers its fsdp shard back over data, and takes part in
  the slice's share of the one all-gather of the parameters over fsdp (see
  dcn_bytes_per_slice); tensor parallelism adds `tensor_parallel_bytes`. `expert_bytes` of the
  parameters are experts, split over the expert axis, which also splits the batch: the others'
  gradients are reduced over it as over data, theirs not; and the tokens' all-to-alls
  (`expert_all_to_all_bytes`) come on top.
  """
  per_slice = math.prod(ici.values())
  dcn_slice = dcn_bytes_per_slice(param_bytes - expert_bytes * (1 - 1 / ici['expert']),
                                  dcn['data'], dcn['fsdp'])
  batch_devices = ici['data'] * ici['fsdp'] * ici['expert']
  rows = data_cfg.batch_size / (batch_devices * dcn['data'] * dcn['fsdp'])
  ici_device = tensor_parallel_bytes(cfg, data_cfg.inputs_length, data_cfg.targets_length, rows,
                                     ici['tensor'])
  for nbytes, replicas in ((param_bytes - expert_bytes, ici['expert']),
                           (expert_bytes / ici['expert'], 1)):
    shard = nbytes / ici['tensor']  # the gradients (parameters) of one tensor shard
    ici_device += (all_gather(shard, ici['data'] * ici['fsdp'] * replicas)
                   + all_gather(shard / (ici['fsdp'] * dcn['fsdp']), ici['data'] * replicas)
                   + all_gather(shard, ici['fsdp']))
  all_to_all = expert_all_to_all_bytes(cfg, data_cfg, rows, ici['expert'])
  return {'dcn_per_slice': dcn_slice, 'dcn_per_device': dcn_slice / per_slice,
          'ici_per_device': ici_device + all_to_all, 'all_to_all_per_device': all_to_all}


COLLECTIVE = re.compile(r'^\s*\S+ = (?P<type>.*?) (?P<op>all-reduce|all-gather|reduce-scatter|'
                        r'all-to-all)(?P<start>-start)?\(')
ARRAY = re.compile(r'\b(pred|[suf]\d+|bf16|f8e\w+)\[([\d,]*)\]')
IOTA_GROUPS = re.compile(r'replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?')
LISTED_GROUPS = re.compile(r'replica_groups=\{((?:\{[\d,]*\},?)*)\}')
MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}")
COMPUTATION = re.compile(r'^(ENTRY )?%(\S+) .*\{$')
WHILE_LOOP = re.compile(r' while\(.*\bcondition=%([^,\s]+), body=%([^,\s]+)')
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
BOUND = re.compile(r'\bs32\[\]\S* constant\((\d+)\)')  # a loop condition's `i < N`
# libtpu compiles a multi-slice step as one slice's program: its collectives stay in the slice,
# and what crosses the slices goes through the Megascale runtime as host-transfer sends, each of
# the device's share of one DCN collective
MEGASCALE_SEND = re.compile(r'^\s*\S+ = \((?P<type>.*?), u32\[\], token\[\]\) send\(.*'
                            r'_xla_megascale_transfer_type="(?P<kind>\w+)"')
MEGASCALE_RING = {'ALL_REDUCE': all_reduce, 'REDUCE_SCATTER': all_gather,
                  'ALL_GATHER': lambda nbytes, members: all_gather(nbytes * members, members)}


def array_bytes(text: str) -> list[int]:
  """Bytes of each array type in an HLO type string, '(f32[4,8]{1,0}, bf16[2])' -> [128, 4]."""
  sizes = []
  for dtype, dims in ARRAY.findall(text):
    bits = 8 if dtype == 'pred' else int(re.match(r'[a-z]+(\d+)', dtype)[1])
    sizes.append(math.prod(int(d) for d in dims.split(',') if d) * bits // 8)
  return sizes


def replica_groups(line: str, num_devices: int) -> np.ndarray:
  """The (groups, members) device ids of one collective's HLO line, in any of the three forms
  XLA prints: listed ({{0,1},{2,3}}), iota ([2,2]<=[4]) or mesh axes (mesh['a'=2,'b'=2] {'a'}:
  the devices that differ only along the named axes)."""
  if match := MESH_GROUPS.search(line):
    axes = re.findall(r"'(\w+)'=(\d+)", match[1])
    ids = np.arange(math.prod(int(n) for _, n in axes)).reshape([int(n) for _, n in axes])
    names = [name for name, _ in axes]
    inside = [names.index(name) for name in re.findall(r"'(\w+)'", match[2])]
    ids = ids.transpose([i for i in range(len(names)) if i not in inside] + inside)
    return ids.reshape(-1, math.prod(int(axes[i][1]) for i in inside))
  if match := IOTA_GROUPS.search(line):
    dims = [int(d) for d in match[3].split(',')]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if match[4]:
      ids = ids.transpose([int(p) for p in match[4].split(',')])
    return ids.reshape(int(match[1]), int(match[2]))
  match = LISTED_GROUPS.search(line)
  groups = [[int(i) for i in g.split(',') if i] for g in re.findall(r'\{([\d,]*)\}', match[1])
            ] if match else []
  return np.array(groups) if groups and groups[0] else np.arange(num_devices)[None]


def runs_per_step(hlo_text: str) -> dict[str, int]:
  """How often each computation of an HLO module runs in a step: the product of the trip counts
  of the while loops around it (a scanned layer stack: its layers), 1 outside loops. A loop's
  count is XLA's known_trip_count (CPU), or the bound its condition compares with (libtpu
  prints no count: `i < 24`)."""
  loops, entry, current, bounds = {}, None, None, {}
  for line in hlo_text.splitlines():
    if match := COMPUTATION.match(line):
      current = match[2]
      entry = current if match[1] else entry
    elif match := BOUND.search(line):
      bounds.setdefault(current, int(match[1]))
    if match := WHILE_LOOP.search(line):
      trips = TRIP_COUNT.search(line)
      loops.setdefault(current, []).append((match[2], int(trips[1]) if trips else match[1]))
  loops = {name: [(body, trips if isinstance(trips, int) else bounds.get(trips, 1))
                  for body, trips in bodies] for name, bodies in loops.items()}
  runs, todo = {}, [(entry, 1)]
  while todo:
    name, count = todo.pop()
    runs[name] = count
    todo += [(body, count * trips) for body, trips in loops.get(name, [])]
  return runs


def hlo_bytes(hlo_text: str, slice_of_device: Sequence[int]) -> dict[str, float]:
  """Bytes per device, on average, that a compiled step's collectives send over DCN ('dcn') and
  inside a slice ('ici', of which the all-to-alls send 'all_to_all').

  `slice_of_device[i]`: the slice of device i of the executable (the mesh's devices in order).
  A collective among m devices of n slices runs as XLA's hierarchical collectives do: a ring
  among the group's m/n devices of each slice over ICI, and n/m of the ring share among the n
  slices per device over DCN (an all-to-all sends (n-1)/n of its bytes across). A collective
  inside a loop counts once per iteration (`runs_per_step`). A TPU program of one slice of
  several (libtpu's, with Megascale sends) counts its collectives inside its slice and each send
  as its device's share of a ring collective among the slices.
  """
  slices = np.asarray(slice_of_device)
  num_slices = len(np.unique(slices))
  if '_xla_megascale_transfer_type' in hlo_text:
    slices = np.zeros(len(slices) // num_slices, np.int64)  # the program's devices: one slice
  runs, current = runs_per_step(hlo_text), None
  totals = {'dcn': 0.0, 'ici': 0.0, 'all_to_all': 0.0}
  for line in hlo_text.splitlines():
    if computation := COMPUTATION.match(line):
      current = computation[2]
    if send := MEGASCALE_SEND.search(line):
      ring = MEGASCALE_RING.get(send['kind'], lambda nbytes, _: nbytes)
      totals['dcn'] += (ring(sum(array_bytes(send['type'])), num_slices) * runs.get(current, 1)
                        * len(slices))
      continue
    match = COLLECTIVE.search(line)
    if not match:
      continue
    arrays = array_bytes(match['type'])
    if match['start'] and match['op'] == 'all-gather':
      arrays = arrays[len(arrays) // 2:]  # an async all-gather's type is (operands, results)
    groups = replica_groups(line, len(slices))
    members = groups.shape[1]
    nbytes = (sum(arrays) * (members if match['op'] == 'reduce-scatter' else 1)
              * runs.get(current, 1))
    ring = all_reduce if match['op'] == 'all-reduce' else all_gather
    for group in groups:
      spanned = len(set(slices[group]))
      inside = members // spanned
      if match['op'] == 'all-to-all':
        totals['dcn'] += ring(nbytes, spanned) * members
        totals['ici'] += nbytes * (inside - 1) / members * members
        totals['all_to_all'] += nbytes * (inside - 1) / members * members
      else:  # the group's members' bytes
        totals['dcn'] += ring(nbytes, spanned) * spanned
        totals['ici'] += ring(nbytes, inside) * members
  return {link: total / len(slices) for link, total in totals.items()}
