"""TensorFlow as the input pipeline runs it: `from t5lite.data.tf_setup import tf, plain`.

TensorFlow runs the input pipeline only, and only a run that reads text imports it: `tf` here
imports it at its first attribute read, not at `import`, so that the modules that define tf.data
code (the objectives' transforms, the pipeline) are imported by every run and cost nothing to one
fed synthetic batches. Before TensorFlow creates its runtime, this hides every accelerator from
it (JAX owns them), bounds its op thread pools and quiets its C++ logging, and drops the banner it
writes to stderr while it is imported (whatever TF_CPP_MIN_LOG_LEVEL says): stderr is for
t5lite's own lines. T5LITE_DEBUG=1 keeps it. It also keeps TensorFlow from importing Keras and JAX
(`_without`). Every function the pipeline maps goes through `plain` (`parallel_map` does that).
"""

import contextlib
import functools
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


@contextlib.contextmanager
def _without(*modules: str):
  """TensorFlow's import loads Keras's optimizers, for registrations the pipeline never uses, and
  JAX, for TF Lite's converter, and passes over an ImportError of either: with `import keras`
  failing while TensorFlow is imported, that import takes a quarter less, and a command that
  reads text starts 9% sooner in 42 MiB less; without JAX, `t5lite prepare` loads no JAX at all
  (nor its gc callback, which a Ctrl-C can land in) and starts in 0.79 of the time in 109 MiB
  less (docs/notes/input-pipeline.md, docs/notes/token-stores.md). Afterwards each imports as
  usual, for whoever wants it; one imported already is left as it is."""
  blocked = [name for name in modules if name not in sys.modules]
  for name in blocked:
    sys.modules[name] = None  # `import name` raises ImportError
  try:
    yield
  finally:
    for name in blocked:
      if sys.modules.get(name, ...) is None:
        del sys.modules[name]


def _import_tensorflow():
  with _without('keras', 'jax'):
    if os.environ.get('T5LITE_DEBUG'):
      import tensorflow  # pylint: disable=import-outside-toplevel
      return tensorflow
    saved = os.dup(2)
    try:
      with open(os.devnull, 'w', encoding='utf-8') as devnull:
        os.dup2(devnull.fileno(), 2)
        import tensorflow  # pylint: disable=import-outside-toplevel
    finally:
      os.dup2(saved, 2)
      os.close(saved)
    return tensorflow


def _hide_accelerators_from_tensorflow(tf):
  try:
    for kind in ('GPU', 'TPU'):
      tf.config.set_visible_devices([], kind)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(2)
  except RuntimeError:  # TF was already initialized by someone else: leave it as it is
    pass


@functools.cache
def load():
  """TensorFlow, imported and set up once; `tf` calls this at its first attribute read."""
  tensorflow = _import_tensorflow()
  _hide_accelerators_from_tensorflow(tensorflow)
  return tensorflow


class _TensorFlow:
  """The `tf` module, loaded when first used. (A type annotation such as `tf.data.Dataset` is
  such a use, at import: the objectives' modules leave them out.)"""

  def __getattr__(self, name: str):
    return getattr(load(), name)


tf = _TensorFlow()


def plain(fn):
  """`fn` for tf.data to trace as written, without AutoGraph's rewrite: no tensor drives Python
  control flow in the pipeline's functions (loops and branches are TF ops), and the rewrite cost
  each process that reads text about a second of its start-up."""
  return tf.autograph.experimental.do_not_convert(fn)


def parallel_map(dataset, fn):
  """`dataset.map(fn)` as the pipeline maps: `fn` plain, in parallel, in order."""
  return dataset.map(plain(fn), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
