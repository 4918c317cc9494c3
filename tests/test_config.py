"""The run configuration: presets load, overrides parse by type, bad values fail in one line."""

import glob
import os

import pytest

from t5lite import cli
from t5lite import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')))
TINY = os.path.join(ROOT, 'configs', 't5_tiny.py')


@pytest.mark.parametrize('path', PRESETS, ids=os.path.basename)
def test_every_preset_loads_and_validates(path):
  config = config_lib.load(path)
  assert set(config.keys()) >= {'model', 'data', 'train', 'optim', 'mesh', 'checkpoint'}
  model = config_lib.model_config(config)
  assert model.vocab_size % 128 == 0


def test_overrides_take_the_type_of_the_field():
  config = config_lib.load(TINY)
  config_lib.override(config, ['--config.train.steps=1_000', '--config.optim.learning_rate=3e-4',
                               '--config.model.scan_layers=true', '--config.data.source=a.jsonl'])
  assert config.train.steps == 1000 and isinstance(config.train.steps, int)
  assert config.optim.learning_rate == 3e-4
  assert config.model.scan_layers is True
  assert config.data.source == 'a.jsonl'


@pytest.mark.parametrize('flag, message', [
    ('--config.train.stepz=5', 'unknown setting config.train.stepz'),
    ('--config.nothing.steps=5', 'unknown setting config.nothing.steps'),
    ('--config.train.steps=many', "config.train.steps='many' is not a valid int"),
    ('--config.model.scan_layers=maybe', "config.model.scan_layers='maybe' is not a valid bool"),
    ('--config.train.steps', 'expected --config.KEY=VALUE'),
])
def test_bad_overrides_say_what_is_wrong(flag, message):
  config = config_lib.base_config()
  with pytest.raises(ValueError, match=message.replace('.', r'\.')):
    config_lib.override(config, [flag])


@pytest.mark.parametrize('field, value, message', [
    ('activation', 'swish', "model.activation='swish' is not one of"),
    ('position', 'alibi', "model.position='alibi' is not one of"),
    ('norm', 'batch', "model.norm='batch' is not one of"),
    ('num_heads', 0, 'model.num_heads must be positive'),
])
def test_bad_model_settings_fail_at_config_time(field, value, message):
  config = config_lib.base_config()
  config.model[field] = value
  with pytest.raises(ValueError, match=message):
    config_lib.model_config(config)


def test_missing_config_file():
  with pytest.raises(FileNotFoundError, match='config file not found: nope.py'):
    config_lib.load('nope.py')


def test_a_preset_name_loads_the_shipped_file_from_any_folder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert [os.path.basename(path) for path in PRESETS] == [
      f'{name}.py' for name in config_lib.presets()]
  assert config_lib.load('t5_tiny').to_dict() == config_lib.load(TINY).to_dict()
  assert config_lib.load('t5_tiny').train.steps == 2000
  distill = config_lib.load('t5_tiny_distill:runs/teacher')
  assert distill.train.teacher_workdir == 'runs/teacher'
  assert distill.model.num_encoder_layers == 2


def test_a_file_that_exists_wins_over_the_preset_of_its_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / 't5_tiny').write_text('from t5lite import config\n\n\ndef get_config(steps=7):\n'
                                    '  base = config.base_config()\n'
                                    '  base.train.steps = int(steps)\n  return base\n')
  assert config_lib.load('t5_tiny').train.steps == 7
  assert config_lib.load('t5_tiny:9').train.steps == 9


def test_the_cli_takes_a_preset_name_from_any_folder(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert cli.main(['plan', '--config=t5_tiny', '--topology=8xH100', '--analytic',
                   '--config.data.batch_size=64']) == 0
  out = capsys.readouterr().out
  assert 'mesh data=8 fsdp=1 expert=1 tensor=1, remat none, 14M parameters' in out  # t5_tiny's 13.6M
  assert 'FLOPs per step: 3.24e+11 analytic' in out


def test_an_unknown_preset_name_is_one_line_naming_the_presets(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert cli.main(['plan', '--config=t5_tinyy', '--topology=8xH100']) == 2
  err = capsys.readouterr().err
  assert err == (f't5lite plan: error: --config t5_tinyy: no such preset or file; presets: '
                 f'{", ".join(config_lib.presets())}\n')
  assert 'bart_base, bert_base, ' in err and ', t5_tiny, t5_tiny_distill, ' in err
