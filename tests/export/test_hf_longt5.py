"""Hugging Face export/import of LongT5 (LongT5ForConditionalGeneration, local and
transient-global encoders): logits agree with transformers both ways on inputs of several local
blocks, a partial last block (local and global) and padding; packed rows give what transformers
gives each example alone; greedy and beam decoding agree with `generate`; an import gives back
the exported params; a folder of an encoder attention t5lite lacks is refused.
(tests/export/hf_testing.py: how weights are perturbed).
"""

import dataclasses
import json
import os

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, decoding
from t5lite.token_ids import PAD_ID
from tests.export import test_hf
from tests.export.hf_testing import (assert_imports_as_exported, our_model, perturb_torch,
                                     perturbed_params)

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

# Local blocks of 4 tokens (radius 3), a global token per 4 tokens: the 23-token inputs below have
# 6 local blocks, the last partial, and 5 global blocks, the last partial (3 orphan tokens).
TINY = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
            num_decoder_layers=2, activation='gated-gelu', tie_embeddings=False, local_radius=3,
            global_block_size=4)
KINDS = {'local': 'local', 'transient_global': 'transient-global'}  # ours: Hugging Face's
ENCODER_LENGTH, DECODER_LENGTH, DECODE_LENGTH = 23, 6, 8
TOLERANCE = 1e-4


def tiny(kind: str, **overrides) -> ModelConfig:
  return ModelConfig(**{**TINY, 'encoder_attention': kind, **overrides})


def encoder_inputs() -> np.ndarray:
  """Encoder tokens (3, 23) of 23, 13 and 6 tokens, 0-padded."""
  tokens = np.random.RandomState(3).randint(2, 128, (3, ENCODER_LENGTH))
  tokens[np.arange(ENCODER_LENGTH) >= np.array([23, 13, 6])[:, None]] = 0
  return tokens.astype(np.int32)


def logit_diff(model, hf, seed: int) -> float:
  encoder = encoder_inputs()
  decoder = np.random.RandomState(seed).randint(2, 128, (3, DECODER_LENGTH))
  decoder[:, 0] = PAD_ID
  ours = np.asarray(model({'encoder_input_tokens': jnp.asarray(encoder),
                           'decoder_input_tokens': jnp.asarray(decoder, jnp.int32)}))
  return float(np.abs(ours - test_hf.hf_logits(hf, encoder, decoder)).max())


@pytest.fixture(scope='module', params=sorted(KINDS))
def exported(request, tmp_path_factory):
  """(cfg, our unrolled params, their export folder, transformers' model loaded from it)."""
  cfg = tiny(request.param)
  params = perturbed_params(cfg, seed=1)
  folder = str(tmp_path_factory.mktemp(f'longt5_{request.param}'))
  export_hf(params, cfg, folder)
  hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
  return cfg, params, folder, hf


def test_export_matches_transformers(exported):
  cfg, params, folder, hf = exported
  assert type(hf) is transformers.LongT5ForConditionalGeneration
  assert hf.config.encoder_attention_type == KINDS[cfg.encoder_attention]
  diff = logit_diff(our_model(cfg, params), hf, seed=2)
  print(f'LongT5 {cfg.encoder_attention} max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  names = set(tensors) | {'encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'}
  assert names == set(hf.state_dict())  # every tensor written, none left at random


def test_a_packed_row_gives_what_transformers_gives_each_example_alone(exported):
  """What transformers' LongT5 cannot do: two examples in one row (encoder and decoder)."""
  cfg, params, _, hf = exported
  diff = test_hf.packed_diff(our_model(cfg, params), hf, seed=5, sizes=((14, 3), (9, 3)),
                             lengths=(ENCODER_LENGTH + 2, DECODER_LENGTH))  # 14: 2 orphans
  print(f'LongT5 {cfg.encoder_attention} packed max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE


def hf_generate(hf, inputs: np.ndarray, **options):
  ids = torch.tensor(inputs, dtype=torch.long)
  with torch.no_grad():
    out = hf.generate(input_ids=ids, attention_mask=(ids > 0).long(), do_sample=False,
                      max_new_tokens=DECODE_LENGTH, return_dict_in_generate=True,
                      output_scores=True, **options)
  return out.sequences.numpy()[:, 1:], out  # after the start token


def test_greedy_and_beam_decoding_match_generate(exported):
  """Beam search with alpha 0 against length_penalty 0: both rank by log-probability alone."""
  cfg, params, _, hf = exported
  model, inputs = our_model(cfg, params), encoder_inputs()
  ours = np.asarray(decoding.generate(model, jnp.asarray(inputs), max_decode_length=DECODE_LENGTH))
  theirs, _ = hf_generate(hf, inputs, num_beams=1)
  np.testing.assert_array_equal(ours, theirs)
  ours = np.asarray(decoding.generate(model, jnp.asarray(inputs), max_decode_length=DECODE_LENGTH,
                                      method='beam', beam_size=3, alpha=0.0))
  theirs, _ = hf_generate(hf, inputs, num_beams=3, length_penalty=0.0, early_stopping=False)
  np.testing.assert_array_equal(ours, theirs)


def test_import_gives_back_the_exported_params(exported):
  cfg, params, folder, _ = exported
  imported = assert_imports_as_exported(folder, params, cfg)
  if cfg.encoder_attention == 'transient_global':
    assert imported['encoder']['layers']['self_attention']['global_norm']['scale'].shape == (2, 32)


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_import_from_transformers(kind, tmp_path):
  """Sizes of their own (radius 5, global blocks of 3, 3 heads of 12), v1.0's tied and scaled
  head for local, v1.1's own head for transient-global."""
  v1_0 = kind == 'local'
  config = transformers.LongT5Config(
      vocab_size=128, d_model=24, d_ff=40, d_kv=12, num_heads=3, num_layers=2,
      num_decoder_layers=1, dropout_rate=0.0, feed_forward_proj='relu' if v1_0 else 'gated-gelu',
      tie_word_embeddings=v1_0, encoder_attention_type=KINDS[kind], local_radius=5,
      global_block_size=3, decoder_start_token_id=0)
  hf = transformers.LongT5ForConditionalGeneration(config).eval()
  if not v1_0:
    hf.lm_head.weight = torch.nn.Parameter(torch.randn(128, 24))
  hf = perturb_torch(hf, seed=6)
  hf.save_pretrained(tmp_path)
  cfg, params = import_hf(str(tmp_path))
  assert cfg == tiny(kind, d_model=24, d_ff=40, d_kv=12, num_heads=3, num_decoder_layers=1,
                     activation='relu' if v1_0 else 'gated-gelu', tie_embeddings=v1_0,
                     local_radius=5, global_block_size=3)
  diff = logit_diff(our_model(cfg, params), hf, seed=7)
  print(f'imported LongT5 {kind} max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE


def test_import_refuses_an_encoder_attention_t5lite_lacks(exported, tmp_path):
  _, _, folder, _ = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = {**json.load(f), 'encoder_attention_type': 'block-sparse'}
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(config, f)
  os.symlink(os.path.join(folder, 'model.safetensors'), tmp_path / 'model.safetensors')
  with pytest.raises(ValueError, match="unsupported LongT5 encoder_attention_type='block-sparse'; "
                                       "expected one of local, transient-global$"):
    import_hf(str(tmp_path))


def test_export_refuses_what_longt5_cannot_be(tmp_path):
  with pytest.raises(ValueError, match="LongT5 models .norm_position='pre'.; got norm_position"):
    export_hf({}, dataclasses.replace(tiny('local'), norm_position='post'), str(tmp_path))
  assert not os.listdir(tmp_path)


@pytest.mark.slow  # three commands in process: 266 s on 2 cores at a load of 15
def test_a_transformers_longt5_through_the_command_line(tmp_path, capsys):
  """A LongT5 made in transformers (sizes of its own) becomes a workdir with `import-hf` that
  pretrains as LongT5 did, decodes as `generate` does with `infer`, and exports the same
  tensors again."""
  from t5lite import cli  # pylint: disable=import-outside-toplevel
  from t5lite.data import vocabulary  # pylint: disable=import-outside-toplevel
  config = transformers.LongT5Config(
      vocab_size=8192, d_model=40, d_ff=56, d_kv=10, num_heads=2, num_layers=3,
      num_decoder_layers=2, dropout_rate=0.0, feed_forward_proj='gated-gelu',
      tie_word_embeddings=False, encoder_attention_type='transient-global', local_radius=6,
      global_block_size=5, decoder_start_token_id=0)
  hf = transformers.LongT5ForConditionalGeneration(config).eval()
  hf.lm_head.weight = torch.nn.Parameter(torch.randn(8192, 40))
  perturb_torch(hf, seed=8).save_pretrained(tmp_path / 'hf')
  workdir, out = tmp_path / 'run', tmp_path / 'exported'
  assert cli.main(['import-hf', f'--hf={tmp_path / "hf"}', f'--workdir={workdir}']) == 0
  data = json.loads((workdir / 'config.json').read_text())['data']
  assert (data['objective'], data['inputs_length'], data['targets_length']) == (
      'principal_sentences', 4096, 910)
  text = 'The committee met. It reported late, and the report was long.'
  capsys.readouterr()
  assert cli.main(['infer', f'--workdir={workdir}', f'--input={text}',
                   '--max_decode_length=8']) == 0
  ours = capsys.readouterr().out.splitlines()
  vocab = vocabulary.load_vocabulary('bundled')
  theirs, _ = hf_generate(hf, np.asarray([vocab.encode(text) + [1]]))
  assert ours == [vocab.decode(theirs[0])]
  assert cli.main(['export', f'--workdir={workdir}', f'--out={out}']) == 0
  original = safetensors.numpy.load_file(str(tmp_path / 'hf' / 'model.safetensors'))
  again = safetensors.numpy.load_file(str(out / 'model.safetensors'))
  assert set(original) <= set(again)
  for name in original:
    np.testing.assert_allclose(again[name], original[name], rtol=1e-6, err_msg=name)
