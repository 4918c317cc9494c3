"""Training, evaluation, `plan`, the models and the Hugging Face export load without TensorFlow,
which only the input pipeline runs, and TensorFlow loads without Keras or JAX (`prepare` loads no
JAX at all); the token ids they share live in one TF-free module."""

import subprocess
import sys

MODULES = ('t5lite.models', 't5lite.train.loop', 't5lite.commands.evaluate',
           't5lite.commands.plan', 't5lite.data.batches', 't5lite.export.hf', 't5lite.token_ids')


def test_training_evaluation_plan_and_export_import_no_tensorflow():
  code = (f'import sys, {", ".join(MODULES)}; '
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]'


def test_tensorflow_is_imported_without_keras_which_still_imports_after():
  code = ("import sys; from t5lite.data.tf_setup import tf; "
          "print(tf.data.Dataset.range(3).reduce(tf.constant(0, tf.int64), "
          "lambda a, b: a + b).numpy(), "
          "sorted(m for m in sys.modules if m.split('.')[0] == 'keras')); "
          "import keras; print(keras.__name__)")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.splitlines() == ['3 []', 'keras']


def test_prepare_loads_no_jax_which_still_imports_after():
  code = ("import sys, t5lite.commands.prepare; "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib'))); "
          "import jax; print(int(jax.numpy.arange(3).sum()))")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.splitlines() == ['[]', '3']


def test_a_keras_imported_before_tensorflow_is_left_as_it_is():
  code = ("import sys, keras; from t5lite.data.tf_setup import tf; "
          "print(sys.modules['keras'] is keras, 'keras.src.optimizers' in sys.modules)")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == 'True True'  # TensorFlow loaded Keras's optimizers, as it does


def test_token_ids_are_defined_once():
  from t5lite import token_ids
  from t5lite.data import packing, vocabulary
  from t5lite.models import decoding
  assert (token_ids.PAD_ID, token_ids.EOS_ID, token_ids.UNK_ID) == (0, 1, 2)
  assert packing.PAD_ID is vocabulary.PAD_ID is decoding.PAD_ID is token_ids.PAD_ID
