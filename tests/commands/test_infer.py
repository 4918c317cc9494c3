"""`t5lite infer` end to end on a workdir trained for two steps: output, truncation, bad input."""

import json

import jax
import numpy as np
import pytest

from t5lite import cli
from t5lite.data import vocabulary
from t5lite.models import decoding
from t5lite.commands import infer as infer_lib
from t5lite.train import run as run_lib
from tests.train.test_loop import train

SENTINELS = 'The <extra_id_0> walks in <extra_id_1> park'
LONG = ' '.join(['The whale swam far out to sea and did not come back.'] * 4)  # > 32 tokens
MAX_DECODE_LENGTH = 6


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp('infer')
  assert train(path, '--config.train.steps=2', '--config.checkpoint.every_steps=2') == 0
  return path


def infer(workdir, *flags) -> int:
  return cli.main(['infer', f'--workdir={workdir}', f'--max_decode_length={MAX_DECODE_LENGTH}',
                   *flags])


def test_infer_prints_and_writes_one_output_per_input(workdir, tmp_path, capsys):
  inputs_file = tmp_path / 'inputs.txt'
  inputs_file.write_text(f'{LONG}\nCall me Ishmael.\n')
  out = tmp_path / 'out.jsonl'
  assert infer(workdir, f'--input={SENTINELS}', f'--input_file={inputs_file}',
               f'--out={out}') == 0
  captured = capsys.readouterr()
  printed = captured.out.splitlines()[-3:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [row['input'] for row in rows] == [SENTINELS, LONG, 'Call me Ishmael.']
  assert [row['output'] for row in rows] == printed
  warnings = captured.err.strip().splitlines()
  assert warnings[0].startswith('warning: input 2 has ') and 'data.inputs_length=32' in warnings[0]
  assert warnings[0].endswith('keeping the first 31 and EOS') and len(warnings) == 2
  assert warnings[1] == 'warning: truncated 1 of 3 inputs'

  # The same tokens as decoding each input alone, on one device, from the restored checkpoint:
  # infer's batching, padding and sharding over 8 devices change nothing.
  config = cli.load_run_config(cli.parser().parse_args(['infer', f'--workdir={workdir}']), [])
  vocab = vocabulary.load_vocabulary(config.data.vocabulary)
  run = run_lib.make_run(config)
  model = run.model(jax.device_get(run.restore_params(str(workdir))[1]))
  tokens = infer_lib.encode_inputs(vocab, [row['input'] for row in rows], 32, eos=True)
  for row, ids in zip(rows, tokens):
    alone = decoding.generate(model, ids[None], max_decode_length=MAX_DECODE_LENGTH)[0]
    assert vocab.decode(alone) == row['output']


def test_encode_inputs_appends_eos_and_truncates(capsys):
  vocab = vocabulary.load_vocabulary('bundled')
  tokens = infer_lib.encode_inputs(vocab, [SENTINELS, 'The<extra_id_0>walks', LONG], 8,
                                     eos=True)
  ids = vocab.encode(SENTINELS)
  assert ids.count(vocab.sentinel_id(0)) == ids.count(vocab.sentinel_id(1)) == 1  # 8099, 8098
  np.testing.assert_array_equal(tokens[0], ids + [1])
  np.testing.assert_array_equal(tokens[1], vocab.encode('The <extra_id_0> walks') + [1, 0, 0, 0])
  np.testing.assert_array_equal(tokens[2], vocab.encode(LONG)[:7] + [1])
  assert capsys.readouterr().err.count('\n') == 2  # input 3, then the count


@pytest.mark.parametrize('lines, flags, message', [
    ('first\n\nthird\n', [], 'inputs.txt line 2 is empty: give one input per line'),
    ('{"input": "a"}\n{"text": "b"}\n', ['--jsonl'],
     'inputs.jsonl line 2 is not a JSON object with a string "input" field'),
    (None, ['--input=ok', '--input= '], '--input number 2 is empty'),
    (None, [], 'nothing to decode: give --input=TEXT or --input_file=FILE'),
    (None, ['--input=x', '--method=sample', '--temperature=0'], 'temperature must be > 0'),
])
def test_bad_inputs_fail_with_one_line(workdir, tmp_path, capsys, lines, flags, message):
  if lines is not None:
    path = tmp_path / ('inputs.jsonl' if '--jsonl' in flags else 'inputs.txt')
    path.write_text(lines)
    flags = [f'--input_file={path}']
  assert infer(workdir, *flags) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and error[0].startswith('t5lite infer: error: ') and message in error[0]
