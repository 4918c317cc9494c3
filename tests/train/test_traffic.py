"""Counting the bytes of collectives: ring shares, HLO array types and replica groups."""

import numpy as np
import pytest

from t5lite.train import traffic


def test_ring_shares():
  assert traffic.all_reduce(100, 4) == 150
  assert traffic.all_gather(100, 4) == 75
  assert traffic.dcn_bytes_per_slice(100, 2, 1) == 100
  assert traffic.dcn_bytes_per_slice(100, 1, 1) == 0
  assert traffic.dcn_bytes_per_slice(100, 1, 4) == 225


def test_array_bytes_of_hlo_types():
  assert traffic.array_bytes('(f32[4,8]{1,0}, bf16[2], /*index=2*/pred[], s8[3])') == [
      128, 4, 1, 3]


@pytest.mark.parametrize('text, groups', [
    ('replica_groups={{0,1},{2,3}}', [[0, 1], [2, 3]]),
    ('replica_groups={}', [[0, 1, 2, 3]]),
    ('replica_groups=[2,2]<=[4]', [[0, 1], [2, 3]]),
    ('replica_groups=[2,2]<=[2,2]T(1,0)', [[0, 2], [1, 3]]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_1'}", [[0, 1], [2, 3]]),
])
def test_replica_groups_in_each_form_xla_prints(text, groups):
  assert traffic.replica_groups(f'x = f32[8] all-reduce(y), {text}', 4).tolist() == groups


def test_hlo_dcn_bytes_counts_only_what_crosses_slices():
  """4 devices in 2 slices {0,1} {2,3}: an all-reduce of 800 bytes over all of them sends
  2 * 1/2 * 800 / 2 = 400 bytes per device over DCN; one over each slice alone sends none; an
  all-gather of 800 bytes over {0,2} and {1,3}: 1/2 * 800 = 400."""
  slices = [0, 0, 1, 1]

  def line(op, groups):
    return f'  %a = f32[200]{{0}} {op}(%x), replica_groups={groups}'

  assert traffic.hlo_dcn_bytes(line('all-reduce', '{{0,1,2,3}}'), slices) == 400
  assert traffic.hlo_dcn_bytes(line('all-reduce', '{{0,1},{2,3}}'), slices) == 0
  assert traffic.hlo_dcn_bytes(line('all-gather', '{{0,2},{1,3}}'), slices) == 400
  assert traffic.hlo_dcn_bytes(line('reduce-scatter', '{{0,2},{1,3}}'), slices) == 800
  assert np.isclose(traffic.hlo_dcn_bytes(
      line('all-reduce-start', '{{0,1,2,3}}') + '\n' + line('fusion', '{}'),
      slices), 400)
