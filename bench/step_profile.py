"""Where a compiled step's device time goes: a `jax.profiler` trace read against XLA's HLO dump.

XLA names each kernel after the HLO instruction it runs (`fusion.12`, `custom-call.3`, ...), and
the optimised HLO that `--xla_dump_to` writes maps every instruction to the JAX source line that
made it (`stack_frame_id`). Together they give device time by instruction and by line of t5lite,
forward, backward and optimizer update apart, without TensorBoard or xprof:

  XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text" python ...  # trace() some steps
  python bench/step_profile.py --trace=/tmp/trace --dump=/tmp/dump      # the summary again

`bench/gpu.py`'s profile job does both on the device and brings the trace and the dump back as
archives, so that the summary can be recomputed (or read differently) on any machine.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
from typing import Callable

INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{([^}]*)\}')
OP_NAME = re.compile(r'op_name="([^"]*)"')
FRAME_ID = re.compile(r'stack_frame_id=(\d+)')
SOURCE = re.compile(r'source_file="([^"]*)" source_line=(\d+)')
TABLE_ROW = re.compile(r'^(\d+) (.*)$')
FIELD = re.compile(r'(\w+)=(\d+)')


def trace(step: Callable[[], object], steps: int, folder: str) -> None:
  """Profiles `steps` calls of `step()` (which must wait for its result) into `folder`."""
  import jax  # pylint: disable=import-outside-toplevel  # the summary needs no JAX
  jax.profiler.start_trace(folder)
  try:
    for _ in range(steps):
      step()
  finally:
    jax.profiler.stop_trace()


def optimised_module(dump: str, module: str = 'train_step') -> str | None:
  """The largest after-optimisations HLO text of `module` in an XLA dump folder."""
  candidates = [path for path in glob.glob(os.path.join(dump, f'*{module}*after_optimizations.txt'))
                if 'buffer-assignment' not in path and 'memory-usage' not in path]
  return max(candidates, key=os.path.getsize, default=None)


def _tables(text: str) -> dict[str, dict[int, str]]:
  """The FileNames, FunctionNames, FileLocations and StackFrames tables at the top of HLO text."""
  tables, current = {}, None
  for line in text.splitlines():
    if line in ('FileNames', 'FunctionNames', 'FileLocations', 'StackFrames'):
      current = tables.setdefault(line, {})
    elif current is not None and (row := TABLE_ROW.match(line)):
      current[int(row.group(1))] = row.group(2)
    elif line.startswith('%') or line.startswith('ENTRY'):
      break
  return tables


def instruction_sources(hlo_text: str) -> dict[str, tuple[str, str]]:
  """{instruction: (JAX op name, 'file:line' of the innermost frame)} of an HLO module's text."""
  tables = _tables(hlo_text)
  files, functions = tables.get('FileNames', {}), tables.get('FunctionNames', {})
  locations, frames = tables.get('FileLocations', {}), tables.get('StackFrames', {})

  def where(frame_id: int) -> str:
    location = dict((k, int(v)) for k, v in FIELD.findall(frames.get(frame_id, '')))
    fields = dict((k, int(v)) for k, v in FIELD.findall(
        locations.get(location.get('file_location_id', -1), '')))
    if not fields:
      return '?'
    path = files.get(fields.get('file_name_id'), '?').strip('"')
    function = functions.get(fields.get('function_name_id'), '?').strip('"')
    return f'{short_path(path)}:{fields.get("line")} {function}'

  sources = {}
  for line in hlo_text.splitlines():
    if match := INSTRUCTION.match(line):
      metadata = match.group(2)
      op_name = OP_NAME.search(metadata)
      frame = FRAME_ID.search(metadata)
      source = SOURCE.search(metadata)
      location = (where(int(frame.group(1))) if frame else
                  f'{short_path(source.group(1))}:{source.group(2)}' if source else '?')
      sources[match.group(1)] = (op_name.group(1) if op_name else '', location)
  return sources


def short_path(path: str) -> str:
  """A source path from its package on: '.../site-packages/optax/_src/x.py' -> 'optax/_src/x.py'."""
  for root in ('t5lite/', 'bench/', 'optax/', 'flax/', 'jax/'):
    if root in path:
      return path[path.rindex(root):]
  return os.path.basename(path)


def timed_instructions(trace_folder: str) -> list[tuple[str, float, str]]:
  """(HLO instruction, microseconds, kernel name) of every op run in the newest trace in a folder.

  On a GPU, kernel events on the device's stream threads carry their instruction in
  args['hlo_op']; where none do, XLA's own 'XLA Ops' thread names them. On the CPU backend, the
  thunk executor's events on host threads are named after the instruction.
  """
  paths = sorted(glob.glob(os.path.join(trace_folder, '**', '*.trace.json.gz'), recursive=True),
                 key=os.path.getmtime)
  if not paths:
    raise FileNotFoundError(f'no *.trace.json.gz under {trace_folder}')
  with gzip.open(paths[-1], 'rt', encoding='utf-8') as f:
    events = json.load(f)['traceEvents']
  processes = {e['pid']: e['args']['name'] for e in events
               if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  threads = {(e['pid'], e.get('tid')): e['args']['name'] for e in events
             if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  device = {pid for pid, name in processes.items() if name.startswith('/device:')}
  complete = [e for e in events if e.get('ph') == 'X']
  on_device = [e for e in complete if e['pid'] in device]
  if kernels := [e for e in on_device if 'hlo_op' in e.get('args', {})]:
    return [(e['args']['hlo_op'], e['dur'], e['name']) for e in kernels]
  if on_device:
    return [(e['name'], e['dur'], e['name']) for e in on_device
            if threads.get((e['pid'], e.get('tid'))) == 'XLA Ops']
  return [(e['name'], e['dur'], e['name']) for e in complete
          if e.get('args', {}).get('_src', '').endswith('thunk_executor.cc')
          and not e['name'].startswith('end: ')]


def summarize(trace_folder: str, dump_folder: str | None, steps: int, top: int = 25) -> dict:
  """Device time per step by HLO instruction, by source line and by kind, from a trace of
  `steps` steps; forward, backward and update apart (`phase`)."""
  timed = timed_instructions(trace_folder)
  hlo = optimised_module(dump_folder) if dump_folder else None
  sources = {}
  if hlo:
    with open(hlo, encoding='utf-8') as f:
      sources = instruction_sources(f.read())
  by_op, by_line, by_kind, by_phase = (collections.Counter() for _ in range(4))
  kernel_names = {}
  for op, microseconds, kernel in timed:
    op_name, where = sources.get(op, ('', '?'))
    direction = phase(op_name)
    by_op[op] += microseconds
    by_line[f'{where} ({direction})'] += microseconds
    by_kind[instruction_kind(op, kernel)] += microseconds
    by_phase[direction] += microseconds
    kernel_names.setdefault(op, (kernel, op_name, where))
  total = sum(by_op.values())

  def per_step(counter):
    return [[name, round(us / steps / 1e3, 3), round(us / max(total, 1), 4)]
            for name, us in counter.most_common(top)]

  return {'device_ms_per_step': round(total / steps / 1e3, 3), 'instructions': len(by_op),
          'hlo_module': os.path.basename(hlo) if hlo else None,
          'by_phase': per_step(by_phase), 'by_kind': per_step(by_kind),
          'by_line': per_step(by_line),
          'by_instruction': [row + list(kernel_names[row[0]]) for row in per_step(by_op)]}


def phase(op_name: str) -> str:
  """Which part of a train step an op belongs to, by JAX's name for it: autodiff's backward
  pass transposes the forward one (`jvp`); the rest is the optimizer and the metrics."""
  if 'transpose(' in op_name:
    return 'backward'
  return 'forward' if 'jvp(' in op_name else 'update'


def instruction_kind(op: str, kernel: str) -> str:
  """A coarse class: GEMMs (cuBLAS or Triton), cuDNN attention, fusions, copies, other."""
  kernel = kernel.lower()
  if 'cudnn' in kernel or 'flash' in kernel or 'fmha' in kernel:
    return 'attention kernel (cuDNN)'
  if 'gemm' in kernel or 'xmma' in kernel or 'cutlass' in kernel or 'dot' in op:
    return 'matmul'
  if op.startswith(('copy', 'transpose')):
    return 'copy/transpose'
  if 'fusion' in op:
    return 'fusion (elementwise/reduce)'
  return op.split('.')[0]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--trace', required=True, help='the folder given to jax.profiler')
  parser.add_argument('--dump', help="XLA's --xla_dump_to folder")
  parser.add_argument('--steps', type=int, default=1, help='steps the trace holds')
  parser.add_argument('--top', type=int, default=25)
  args = parser.parse_args()
  print(json.dumps(summarize(args.trace, args.dump, args.steps, args.top), indent=1))


if __name__ == '__main__':
  main()
