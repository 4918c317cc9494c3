"""TensorFlow as the input pipeline runs it: `from t5lite.data.tf_setup import tf`.

TensorFlow runs the input pipeline only. Before it creates its runtime, this hides every
accelerator from it (JAX owns them), bounds its op thread pools and quiets its C++ logging.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow as tf  # pylint: disable=g-import-not-at-top


def _hide_accelerators_from_tensorflow():
  try:
    for kind in ('GPU', 'TPU'):
      tf.config.set_visible_devices([], kind)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(2)
  except RuntimeError:  # TF was already initialized by someone else: leave it as it is
    pass


_hide_accelerators_from_tensorflow()
