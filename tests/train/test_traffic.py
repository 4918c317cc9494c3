"""Counting the bytes of collectives: ring shares, HLO array types and replica groups."""

import pytest

from t5lite.train import traffic


def test_ring_shares():
  assert traffic.all_reduce(100, 4) == 150
  assert traffic.all_gather(100, 4) == 75
  assert traffic.dcn_bytes_per_slice(100, 2, 1) == 100
  assert traffic.dcn_bytes_per_slice(100, 1, 1) == 0
  assert traffic.dcn_bytes_per_slice(100, 1, 4) == 150


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


@pytest.mark.parametrize('op, groups, dcn, ici', [
    ('all-reduce', '{{0,1,2,3}}', 400, 800),  # 2 * 1/2 * 800 / 2 across, 2 * 1/2 * 800 inside
    ('all-reduce-start', '{{0,1,2,3}}', 400, 800),
    ('all-reduce', '{{0,1},{2,3}}', 0, 800),  # each slice alone
    ('all-gather', '{{0,2},{1,3}}', 400, 0),  # 1/2 * 800, each pair across the slices
    ('reduce-scatter', '{{0,2},{1,3}}', 800, 0),  # of 2 * 800 bytes
    ('all-to-all', '{{0,1,2,3}}', 400, 200),  # a quarter to each member, half of them across
    ('fusion', '{{0,1,2,3}}', 0, 0),  # not a collective
])
def test_hlo_bytes_splits_each_collective_into_dcn_and_ici(op, groups, dcn, ici):
  """Per device, 4 devices in 2 slices {0,1} {2,3}, a collective of f32[200] (800 bytes)."""
  line = f'  %a = f32[200]{{0}} {op}(%x), replica_groups={groups}'
  assert traffic.hlo_bytes(line, [0, 0, 1, 1]) == {'dcn': dcn, 'ici': ici}


HLO_LOOPS = """\
%inner (p: f32[4]) -> f32[4] {
  %a = f32[100]{0} all-reduce(%x), replica_groups={{0,1}}
}
%outer (p: f32[4]) -> f32[4] {
  %w = (s32[]) while(%t), condition=%c, body=%inner, backend_config={"known_trip_count":{"n":"3"}}
}
ENTRY %main (p: f32[4]) -> f32[4] {
  %w = (s32[]) while(%t), condition=%c, body=%outer, backend_config={"known_trip_count":{"n":"2"}}
  %b = f32[100]{0} all-reduce(%y), replica_groups={{0,1}}
}
"""


def test_a_collective_in_nested_loops_counts_once_per_iteration():
  """400 bytes all-reduced 2 x 3 times in the loops and once outside, among 2 devices of 2
  slices: 7 x 2 * 1/2 * 400 over DCN per device."""
  assert traffic.runs_per_step(HLO_LOOPS) == {'main': 1, 'outer': 2, 'inner': 6}
  assert traffic.hlo_bytes(HLO_LOOPS, [0, 1]) == {'dcn': 7 * 400, 'ici': 0}
