"""Training, evaluation, `plan`, the models and the Hugging Face export load without TensorFlow,
which only the input pipeline runs; the token ids they share live in one TF-free module."""

import subprocess
import sys

MODULES = ('t5lite.models', 't5lite.train.loop', 't5lite.commands.evaluate',
           't5lite.commands.plan', 't5lite.data.batches', 't5lite.export.hf', 't5lite.token_ids')


def test_training_evaluation_plan_and_export_import_no_tensorflow():
  code = (f'import sys, {", ".join(MODULES)}; '
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]'


def test_token_ids_are_defined_once():
  from t5lite import token_ids
  from t5lite.data import packing, vocabulary
  from t5lite.models import decoding
  assert (token_ids.PAD_ID, token_ids.EOS_ID, token_ids.UNK_ID) == (0, 1, 2)
  assert packing.PAD_ID is vocabulary.PAD_ID is decoding.PAD_ID is token_ids.PAD_ID
