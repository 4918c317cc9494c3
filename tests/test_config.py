"""The run configuration: presets load, overrides parse by type, bad values fail in one line."""

import glob
import os

import pytest

from t5lite import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')))


@pytest.mark.parametrize('path', PRESETS, ids=os.path.basename)
def test_every_preset_loads_and_validates(path):
  config = config_lib.load(path)
  assert set(config.keys()) >= {'model', 'data', 'train', 'optim', 'mesh', 'checkpoint'}
  model = config_lib.model_config(config)
  assert model.vocab_size % 128 == 0


def test_overrides_take_the_type_of_the_field():
  config = config_lib.load(os.path.join(ROOT, 'configs', 't5_tiny.py'))
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
