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
  assert traffic.hlo_bytes(line, [0, 0, 1, 1]) == {
      'dcn': dcn, 'ici': ici, 'all_to_all': ici if op == 'all-to-all' else 0}


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
  assert traffic.hlo_bytes(HLO_LOOPS, [0, 1]) == {'dcn': 7 * 400, 'ici': 0, 'all_to_all': 0}


# libtpu's program of one slice of 2 (4 devices each): a gradient all-reduced in the slice, then
# its shard (1/4) sent through Megascale to be all-reduced across the slices, as libtpu 0.0.42
# compiles a data-parallel step for 2xv5e-4 (the attributes cut short)
HLO_MEGASCALE = """\
ENTRY %main (p: f32[4]) -> f32[4] {
  %r = f32[200]{0} all-reduce(%g), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true
  %send = (f32[50]{0}, u32[], token[]) send(%s, %t), channel_id=3, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_reduce_operation="SUM",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (f32[50]{0}, u32[], token[]) recv(%t), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}
}
"""


def test_a_tpu_slices_program_counts_its_megascale_sends_over_dcn():
  """Per device: the slice's all-reduce of 800 bytes among its 4 devices over ICI (2 * 3/4 *
  800), and the 200 bytes it sends over DCN all-reduced among 2 slices (2 * 1/2 * 200); the
  receive is not counted again."""
  assert traffic.hlo_bytes(HLO_MEGASCALE, [0] * 4 + [1] * 4) == {
      'dcn': 200, 'ici': 1200, 'all_to_all': 0}


HLO_BOUNDED_LOOP = """\
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = f32[100]{0} all-reduce(%x), replica_groups={{0,1}}
}
%cond (p: (s32[], f32[4])) -> pred[] {
  %constant.9 = s32[]{:T(128)} constant(24)
  ROOT %lt = pred[]{:T(512)} compare(%i, %constant.9), direction=LT
}
ENTRY %main (p: f32[4]) -> f32[4] {
  %w = (s32[], f32[4]) while(%t), condition=%cond, body=%body
}
"""


def test_a_loop_without_a_known_trip_count_runs_as_often_as_its_condition_bounds():
  """libtpu prints no known_trip_count: a scanned stack's loop runs while i < 24."""
  assert traffic.runs_per_step(HLO_BOUNDED_LOOP) == {'main': 1, 'body': 24}
  assert traffic.hlo_bytes(HLO_BOUNDED_LOOP, [0, 1]) == {'dcn': 24 * 400, 'ici': 0,
                                                         'all_to_all': 0}
