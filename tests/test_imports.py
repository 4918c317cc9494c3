"""Training, evaluation, `plan`, the models and the Hugging Face export load without TensorFlow,
which only the input pipeline runs, and TensorFlow loads without Keras or JAX (`prepare` loads no
JAX at all); the token ids they share live in one TF-free module; imports run down the floors."""

import ast
import pathlib
import subprocess
import sys

# The objectives define tf.data transforms, and load TensorFlow only when one runs (tf_setup.tf)
MODULES = ('t5lite.models', 't5lite.objectives', 't5lite.train.loop', 't5lite.commands.evaluate',
           't5lite.commands.plan', 't5lite.inputs.batches', 't5lite.export.hf', 't5lite.token_ids')


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
  code = ("import sys, keras; from t5lite.data.tf_setup import tf; tf.constant(0); "
          "print(sys.modules['keras'] is keras, 'keras.src.optimizers' in sys.modules)")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == 'True True'  # TensorFlow loaded Keras's optimizers, as it does


def test_token_ids_are_defined_once():
  from t5lite import token_ids
  from t5lite.data import packing, vocabulary
  from t5lite.models import decoding
  assert (token_ids.PAD_ID, token_ids.EOS_ID, token_ids.UNK_ID) == (0, 1, 2)
  assert packing.PAD_ID is vocabulary.PAD_ID is decoding.PAD_ID is token_ids.PAD_ID


# The floors, lowest first: a module imports only from its own floor and those below. The data
# floor (text -> tokens) and the models know nothing of each other; objectives (tokens ->
# examples) sit on both; the input pipeline (config -> batches) on the objectives; the run's
# config on the input pipeline and the models; then training, export and the presets (each a
# get_config() over config's), the commands, the CLI.
FLOORS = (('token_ids', 'paths', 'files', 'outputs', 'lock'), ('data', 'models'), ('objectives',),
          ('inputs',), ('config',), ('train', 'export', 'configs'), ('commands',),
          ('cli', '__main__'))


def import_graph() -> dict[str, set[str]]:
  """{module: the t5lite modules it imports, anywhere in it (functions too)}, by reading the
  source: t5lite.a.b for `from t5lite.a import b` where b is a module, else t5lite.a."""
  root = pathlib.Path(__file__).parents[1] / 't5lite'
  paths = {'.'.join(p.relative_to(root.parent).with_suffix('').parts).removesuffix('.__init__'): p
           for p in root.rglob('*.py')}
  graph = {}
  for module, path in paths.items():
    graph[module] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
      if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == 't5lite':
        graph[module].update(f'{node.module}.{alias.name}' if f'{node.module}.{alias.name}'
                             in paths else node.module for alias in node.names)
      elif isinstance(node, ast.Import):
        graph[module].update(a.name for a in node.names if a.name.split('.')[0] == 't5lite')
  return graph


def floor(module: str) -> int:
  """The floor of t5lite.<name>[...]: its folder's, or a top-level module's own."""
  name = module.split('.')[1]
  return next(i for i, names in enumerate(FLOORS) if name in names)


def test_imports_run_one_way():
  """No module imports a floor above its own, at module or folder level, and no module imports
  itself back through others (a cycle)."""
  graph = import_graph()
  upward = sorted(f'{a} -> {b}' for a, imported in graph.items() for b in imported
                  if b != 't5lite' and floor(b) > floor(a))
  assert upward == []
  across = sorted(f'{a} -> {b}' for a, imported in graph.items() for b in imported
                  if b != 't5lite' and floor(a) == floor(b) and a.split('.')[1] != b.split('.')[1]
                  and a.count('.') > 1 and b.count('.') > 1)
  assert across == []  # the data floor and the models, train and export: strangers
  finished, on_path = set(), []

  def visit(module):
    on_path.append(module)
    for imported in sorted(graph[module] - {module}):
      assert imported not in on_path, ' -> '.join(on_path[on_path.index(imported):] + [imported])
      if imported not in finished:
        visit(imported)
    on_path.pop()
    finished.add(module)

  for module in sorted(graph):
    if module not in finished:
      visit(module)
  assert len(finished) > 60 and floor('t5lite.data.store') < floor('t5lite.inputs.pipeline')
