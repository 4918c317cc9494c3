"""Test-wide setup: 8 fake CPU devices for real meshes, quiet TensorFlow, no accelerators for TF,
and one JAX compilation cache for the session, its processes included: many tests train the same
tiny presets in their own `t5lite` processes, and each of them would compile the same steps. And
the data and input pipeline tests' fixtures: small data configs, a tiny TFDS dataset."""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='t5lite-tests-jax-cache-')
  # readable by all (mkdtemp's is the owner's alone): a root test acting as `nobody` (tests/fs.py)
  # loads the steps compiled before it instead of compiling them again
  os.chmod(os.environ['JAX_COMPILATION_CACHE_DIR'], 0o755)
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')
  atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


def pytest_collection_modifyitems(items):
  """Files with slow tests first: `make test`'s two processes take a file at a time, so the
  longest start early and the two finish together."""
  slow_files = {item.path for item in items if item.get_closest_marker('slow')}
  items.sort(key=lambda item: item.path not in slow_files)  # stable: each file keeps its order


@pytest.fixture(scope='session')
def tfds_dir(tmp_path_factory):
  """A TFDS data_dir holding t5lite_test_text/short and t5lite_test_text/empty, prepared here."""
  from tests import tfds_text  # pylint: disable=import-outside-toplevel  # TensorFlow's
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  for name in ('short', 'empty'):
    tfds_text.T5liteTestText(config=name, data_dir=data_dir).download_and_prepare()
  return data_dir


@pytest.fixture
def small_data():
  """Makes data configs with short sequences and small batches, so that tests take seconds."""
  from t5lite import config as config_lib  # pylint: disable=import-outside-toplevel

  def make(**overrides):
    data = config_lib.base_config().data
    data.update(dict(inputs_length=64, targets_length=16, batch_size=8, threads=2), **overrides)
    return data
  return make
