"""`t5lite plan` with the flash kernel against XLA's attention on TPUs: the compiled train step's
bytes per device at several input lengths, and the longest input that fits; a JSON line each.

  python bench/tpu_plan.py --out=/tmp/tpu_plan.jsonl   # needs libtpu (else it says so and
                                                       # measures nothing): pip install -e .[tpu]
  python bench/record.py --add=/tmp/tpu_plan.jsonl --machine='libtpu 0.0.42.1 AOT on a CPU host' \
      --command='python bench/tpu_plan.py --out=/tmp/tpu_plan.jsonl'

libtpu compiles the real step (models, loss, optimizer, shardings) for a topology's compile-only
devices on this CPU host, as `t5lite plan` does; its memory_analysis() is the figure. Settings:
t5_1_1_base in bfloat16, scanned layers with remat save_dots (--remat: another), 8 rows a chip
(--rows), 128 targets, on synthetic batches. For each topology and kernel the inputs double from 512 until a step no
longer fits the chip's HBM (the compiler's verdict, or its bytes): the longest input that fits is
known to a factor of 2. A summary line per topology gives the ratios. Memory only: no speed can be
read from a compile (cost_analysis' times are not trustworthy without the chip).
tests/bench/test_tpu_plan.py runs it on this CPU (topology cpu:1, t5_tiny) at tiny lengths.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # t5lite

from t5lite import config as config_lib  # noqa: E402
from t5lite.commands import plan as plan_lib  # noqa: E402

LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
REPORTED = (512, 2048, 8192, 16384)  # the lengths a line is written for even past the longest
TOPOLOGIES = ('v5e-1', 'v5p-8')
REMAT = 'save_dots'  # the lines' remat policy unless they name another
GiB = 2**30


def settings(attention: str, inputs_length: int, batch_size: int, remat: str) -> list[str]:
  return [f'model.attention={attention}', 'model.dtype=bfloat16', 'model.scan_layers=True',
          f'model.remat_policy={remat}', f'data.batch_size={batch_size}',
          f'data.inputs_length={inputs_length}', 'data.targets_length=128',
          'data.source=synthetic']


def planned(preset: str, topology: str, attention: str, inputs_length: int,
            batch_size: int, remat: str) -> dict:
  """One plan's line: its compiled bytes per device and whether the step fits."""
  config = config_lib.load(os.path.join(ROOT, 'configs', f'{preset}.py'))
  config_lib.override(config, settings(attention, inputs_length, batch_size, remat))
  start = time.time()
  result = plan_lib.plan(config, topology)
  compiled = result['compiled']
  return {'bench': 'tpu_plan', 'preset': preset, 'topology': topology, 'attention': attention,
          **({} if remat == REMAT else {'remat_policy': remat}),
          'inputs_length': inputs_length, 'batch_size': batch_size, 'fits': result['fits'],
          'compiled_gib': None if compiled is None else round(compiled['total'] / GiB, 3),
          'temp_gib': None if compiled is None else round(compiled['temp'] / GiB, 3),
          'hbm_gib': None if result['hbm_per_device'] is None else round(
              result['hbm_per_device'] / GiB, 2),
          'units': {'compiled_gib': 'GiB', 'temp_gib': 'GiB', 'hbm_gib': 'GiB'},
          'plan_s': round(time.time() - start, 1)}


def sweep(preset: str, topology: str, attention: str, batch_size: int, remat: str, lengths,
          reported, write) -> int:
  """Plans at the lengths in order until one does not fit; past it only the reported lengths get
  a line, not compiled (a longer input fits no better). The longest that fit."""
  longest, failed = 0, None
  for length in lengths:
    if failed is not None:
      if length in reported:
        write({'bench': 'tpu_plan', 'preset': preset, 'topology': topology,
               'attention': attention, **({} if remat == REMAT else {'remat_policy': remat}),
               'inputs_length': length, 'batch_size': batch_size, 'fits': False,
               'compiled': f'no: {failed} already did not fit'})
      continue
    line = planned(preset, topology, attention, length, batch_size, remat)
    write(line)
    if line['fits'] is not False:  # None: no HBM to fit in (this CPU)
      longest = length
    else:
      failed = length
  return longest


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', help='a JSON lines file to append the lines to, too')
  parser.add_argument('--preset', default='t5_1_1_base')
  parser.add_argument('--topologies', default=','.join(TOPOLOGIES), help='comma-separated')
  parser.add_argument('--lengths', default=','.join(map(str, LENGTHS)))
  parser.add_argument('--remat', default=REMAT, help='model.remat_policy')
  parser.add_argument('--rows', type=int, default=8, help='rows a chip')
  parser.add_argument('--attentions', default='xla,flash',
                      help='the kernels to plan (the summary needs both)')
  args = parser.parse_args(argv)
  lengths = [int(n) for n in args.lengths.split(',')]
  reported = [n for n in REPORTED if n in lengths] or lengths
  topologies = [plan_lib.parse_topology(name) for name in args.topologies.split(',')]
  if any(t.platform == 'tpu' for t in topologies) and importlib.util.find_spec('libtpu') is None:
    print('tpu_plan: nothing measured: compiling for TPUs needs libtpu (pip install -e .[tpu])',
          file=sys.stderr)
    return
  lines = []

  def write(line):
    lines.append(line)
    print(json.dumps(line), flush=True)
    if args.out:
      with open(args.out, 'a', encoding='utf-8') as f:
        f.write(json.dumps(line) + '\n')

  for topology in topologies:
    batch_size = args.rows * topology.num_devices
    longest = {attention: sweep(args.preset, topology.name, attention, batch_size, args.remat,
                                lengths, reported, write)
               for attention in args.attentions.split(',')}
    if len(longest) == 2:
      write(summary(lines, args.preset, topology.name, args.remat, longest))


def summary(lines: list[dict], preset: str, topology: str, remat: str, longest: dict) -> dict:
  """The ratios: flash's compiled bytes over XLA's at each length both compiled, and the longest
  inputs that fit."""
  mine = {(line['attention'], line['inputs_length']): line for line in lines
          if line.get('bench') == 'tpu_plan' and line['topology'] == topology
          and line.get('remat_policy', REMAT) == remat and line.get('compiled_gib') is not None}
  ratios = {f'flash_vs_xla_memory_{n}': round(mine['flash', n]['compiled_gib']
                                              / mine['xla', n]['compiled_gib'], 3)
            for attention, n in mine if attention == 'xla' and ('flash', n) in mine}
  longest_ratio = longest['flash'] / longest['xla'] if longest['xla'] else None
  return {'bench': 'tpu_plan/summary', 'preset': preset, 'topology': topology,
          **({} if remat == REMAT else {'remat_policy': remat}), **ratios,
          'longest_inputs': longest, 'longest_inputs_vs_xla': longest_ratio,
          'units': {'longest_inputs.xla': 'tokens', 'longest_inputs.flash': 'tokens'}}


if __name__ == '__main__':
  main()
