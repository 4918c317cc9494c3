"""Hugging Face export and import of ELECTRA: the discriminator as ElectraForPreTraining, the
generator as ElectraForMaskedLM in the export's `generator/`. Logits of both agree with
transformers both ways; either model's folder alone imports, the other model starting fresh; and
what t5lite's ELECTRA cannot be is refused in one line.

transformers runs on CPU in float32 with random weights (no downloads); every tensor is perturbed
away from its initial value so that a wrong mapping shows.
"""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite import cli
from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, stack_layers
from t5lite.models.params import flatten

from tests.export.hf_testing import (assert_imports_as_exported, our_model, perturb_torch,
                                     perturbed_params)

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

TOLERANCE = 1e-4
LENGTH = 12
# 4 heads of 16; the generator half of them, so 32 wide, and half the d_ff
CFG = ModelConfig(arch='electra', vocab_size=128, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                  num_encoder_layers=2, num_decoder_layers=0, activation='gelu', norm='layer',
                  norm_position='post', position='learned', use_bias=True, embed_norm=True,
                  tie_embeddings=True, max_length=16, dropout=0.0, norm_eps=1e-12,
                  generator_size=0.5)
SHARED = ('embed', 'position_embedding', 'embed_norm')  # the embeddings both models read


def padded_tokens(seed: int, vocab_size: int = 128) -> np.ndarray:
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, vocab_size, size=(4, LENGTH)).astype(np.int32)
  tokens[np.arange(LENGTH) >= np.array([LENGTH, 9, 5, LENGTH])[:, None]] = 0
  return tokens


def assert_parity(model, discriminator, generator, seed: int) -> None:
  """Replaced-token and MLM logits agree on the real tokens of a padded batch (HF's padded
  queries compute what they like)."""
  tokens = padded_tokens(seed)
  batch = {'encoder_input_tokens': jnp.asarray(tokens)}
  inputs = dict(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(tokens > 0, dtype=torch.long))
  with torch.no_grad():
    theirs = discriminator(**inputs).logits.numpy(), generator(**inputs).logits.numpy()
  ours = np.asarray(model(batch)), np.asarray(model.generator_logits(batch))
  for name, a, b in zip(('discriminator', 'generator MLM'), ours, theirs):
    diff = np.abs(a - b)[tokens > 0].max()
    print(f'ELECTRA {name} max |logit diff| {diff:.2e}')
    assert diff < TOLERANCE


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """(our perturbed params, their export folder)."""
  params = perturbed_params(CFG, seed=3)
  folder = tmp_path_factory.mktemp('electra')
  export_hf(params, CFG, str(folder))
  return params, folder


def test_export_matches_transformers(exported):
  params, folder = exported
  discriminator = transformers.AutoModelForPreTraining.from_pretrained(folder).eval()
  generator = transformers.AutoModelForMaskedLM.from_pretrained(folder / 'generator').eval()
  assert type(discriminator).__name__ == 'ElectraForPreTraining'
  assert type(generator).__name__ == 'ElectraForMaskedLM'
  assert generator.config.hidden_size == 32 and generator.config.embedding_size == 64
  assert_parity(our_model(CFG, params), discriminator, generator, seed=4)
  for where, model in ((folder, discriminator), (folder / 'generator', generator)):
    written = safetensors.numpy.load_file(where / 'model.safetensors')
    # every tensor HF's model has is written, but the lm head HF ties to the embeddings
    assert set(written) == set(model.state_dict()) - {'generator_lm_head.weight'}


def test_scanned_exports_as_unrolled(exported, tmp_path):
  params, folder = exported
  export_hf(stack_layers(params), dataclasses.replace(CFG, scan_layers=True), str(tmp_path))
  for name in ('config.json', 'model.safetensors'):
    for model in ('', 'generator'):
      assert (tmp_path / model / name).read_bytes() == (folder / model / name).read_bytes()


def test_export_imports_as_it_was(exported):
  params, folder = exported
  assert_imports_as_exported(str(folder), params, CFG)


def test_generator_alone_imports_with_the_discriminator_absent(exported):
  """The discriminator's size follows from the generator's config; its layers and head are left
  to the run's initialiser (state.from_params)."""
  params, folder = exported
  cfg, imported = import_hf(str(folder / 'generator'))
  assert cfg == CFG
  expected = {path: value for path, value in flatten(params)
              if path[0].startswith('generator') or set(path) & set(SHARED)}
  imported = dict(flatten(imported))
  assert imported.keys() == expected.keys()
  for path, value in expected.items():
    np.testing.assert_array_equal(imported[path], value)


def hf_pair(seed: int):
  """A random transformers discriminator and generator of CFG's sizes sharing their embeddings,
  as the two checkpoints of one ELECTRA run do, with the erf GELU of the published ones; token
  types are random too."""
  sizes = dict(vocab_size=128, embedding_size=64, num_hidden_layers=2, hidden_act='gelu',
               max_position_embeddings=16, hidden_dropout_prob=0.0, layer_norm_eps=1e-12,
               attention_probs_dropout_prob=0.0, pad_token_id=0)
  discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=64, num_attention_heads=4, intermediate_size=128, **sizes))
  generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=32, num_attention_heads=2, intermediate_size=64, **sizes))
  perturb_torch(discriminator, seed)
  perturb_torch(generator, seed + 1)
  generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
  return discriminator.eval(), generator.eval()


def test_transformers_models_import(tmp_path):
  discriminator, generator = hf_pair(seed=5)
  discriminator.save_pretrained(tmp_path)
  generator.save_pretrained(tmp_path / 'generator')
  cfg, params = import_hf(str(tmp_path))
  assert cfg == dataclasses.replace(CFG, activation='gelu_erf')
  assert_parity(our_model(cfg, params), discriminator, generator, seed=6)


def test_import_refuses_what_t5lite_electra_is_not(exported, tmp_path):
  params, folder = exported
  wide = json.loads((folder / 'config.json').read_text())
  (tmp_path / 'wide').mkdir()
  (tmp_path / 'wide' / 'config.json').write_text(json.dumps({**wide, 'embedding_size': 32}))
  (tmp_path / 'wide' / 'model.safetensors').write_bytes((folder / 'model.safetensors').read_bytes())
  with pytest.raises(ValueError, match=r'^unsupported ELECTRA discriminator embedding_size=32: '):
    import_hf(str(tmp_path / 'wide'))
  # a generator/ that is not the generator, and one whose embeddings are not the discriminator's
  export_hf(params, CFG, str(tmp_path / 'two'))
  export_hf(params, CFG, str(tmp_path / 'two' / 'generator'))
  with pytest.raises(ValueError, match=r"generator holds architectures=\['ElectraForPreTraining'\]"
                                       r', not ElectraForMaskedLM$'):
    import_hf(str(tmp_path / 'two'))
  other = {**params, 'embed': {'embedding': params['embed']['embedding'] + 1}}
  export_hf(other, CFG, str(tmp_path / 'apart'))
  export_hf(params, CFG, str(tmp_path / 'mixed'))
  (tmp_path / 'mixed' / 'generator' / 'model.safetensors').write_bytes(
      (tmp_path / 'apart' / 'generator' / 'model.safetensors').read_bytes())
  with pytest.raises(ValueError, match=r'mixed/generator hold different embed/embedding; '
                                       r"t5lite's ELECTRA shares it$"):
    import_hf(str(tmp_path / 'mixed'))


@pytest.mark.slow  # a run, an import and an evaluation: about 50 s on 2 cores
def test_discriminator_alone_imports_into_a_workdir_that_evaluates(tmp_path, capsys):
  """import-hf of a discriminator without generator/: one warning line names what starts fresh,
  which --config.model.generator_size shapes; the discriminator is the folder's, scanned or not,
  and the run evaluates."""
  cfg = dataclasses.replace(CFG, vocab_size=8192)  # the bundled vocabulary's
  params = perturbed_params(cfg, seed=8)
  export_hf(params, cfg, str(tmp_path / 'both'))
  folder, workdir = tmp_path / 'both', tmp_path / 'run'
  for name in ('config.json', 'model.safetensors'):
    (folder / 'generator' / name).unlink()
  (folder / 'generator').rmdir()
  capsys.readouterr()
  assert cli.main(['import-hf', f'--hf={folder}', f'--workdir={workdir}',
                   '--config.model.generator_size=0.5', '--config.model.scan_layers=true']) == 0
  warnings = capsys.readouterr().err.splitlines()
  assert warnings[-1] == (f'warning: {folder} holds no generator/embed_projection, '
                          'generator/layers, generator_head; they start as a new run\'s do '
                          '(train.seed=0)')
  assert json.loads((workdir / 'config.json').read_text())['data']['objective'] == 'electra'
  assert cli.main(['eval', f'--workdir={workdir}', '--num_batches=1']) == 0
  evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert evaluated['step'] == 0 and np.isfinite(evaluated['eval_mlm_loss'])
  hf_dir = tmp_path / 'back'
  assert cli.main(['export', f'--workdir={workdir}', f'--out={hf_dir}']) == 0
  back = safetensors.numpy.load_file(hf_dir / 'model.safetensors')
  ours = safetensors.numpy.load_file(folder / 'model.safetensors')
  assert back.keys() == ours.keys()
  for name, value in ours.items():  # the discriminator comes back as it went in
    np.testing.assert_array_equal(back[name], value, err_msg=name)
  generator = json.loads((hf_dir / 'generator' / 'config.json').read_text())
  assert (generator['hidden_size'], generator['intermediate_size']) == (32, 64)
