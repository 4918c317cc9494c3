"""bench/long_attention.py end to end at short lengths: a line per attention with a median time
per length and the growth between the first and the last."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / 'bench'))


@pytest.mark.slow  # five compiles: 14 s on 2 cores at a load of 5 (126 s at 15 with six)
def test_a_line_per_attention_with_its_times_and_growth(capsys):
  """Dense attention only up to --dense_max_length (its l^2 memory), the others at every length."""
  import long_attention  # pylint: disable=import-outside-toplevel  # bench/long_attention.py
  long_attention.main(['--lengths=128,256', '--repeats=2', '--dense_max_length=128'])
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [line['attention'] for line in lines] == ['local', 'transient_global', 'dense']
  for line in lines[:2]:
    assert line['bench'] == 'long_attention' and line['model'] == 'long_t5_tiny'
    assert line['fwd_bwd_ms_128'] > 0 and line['fwd_bwd_ms_256'] > 0
    assert line['growth_ratio_128_to_256'] == pytest.approx(
        line['fwd_bwd_ms_256'] / line['fwd_bwd_ms_128'], abs=0.01)
  dense = lines[2]
  assert dense['fwd_bwd_ms_128'] > 0 and 'fwd_bwd_ms_256' not in dense
  assert dense['growth_ratio_128_to_128'] == 1.0


def test_each_step_is_the_presets_encoder_with_its_attention():
  import long_attention  # pylint: disable=import-outside-toplevel  # bench/long_attention.py
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel
  config = config_lib.load('long_t5_tiny')
  assert config.model.encoder_attention == 'transient_global'
  grads = long_attention.encoder_step('long_t5_tiny', 'local', 1, 64)()
  assert 'global_bias' not in grads['encoder'] and 'decoder' in grads  # its decoder: zero
  assert float(abs(grads['encoder']['relative_bias']['embedding'][...]).sum()) > 0
