"""Hugging Face export/import of BART-shaped encoder-decoders (BartForConditionalGeneration):
logits and greedy decoding agree with transformers, an import gives back the params that were
exported, and a model saved by transformers imports.
(tests/export/hf_testing.py: how weights are perturbed).
"""

import dataclasses
import json
import os
import pathlib

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite import config as t5config
from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, decoding
from t5lite.token_ids import EOS_ID, PAD_ID
from tests.export.hf_testing import (assert_imports_as_exported, assert_same_params, our_model,
                                     perturb_torch, perturbed_params, swap_with_eos)

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

BART_BASE = t5config.model_config(t5config.load(
    str(pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'bart_base.py')))
# bart_base's layers, shrunk. d_model 64 and d_kv 16 make the factors the export folds in
# (d_model**-0.5 into the decoder's last layer norm, sqrt(d_kv) into the queries) powers of two,
# so that an import gives back the exported params bit for bit.
SMALL = dict(vocab_size=256, d_model=64, d_ff=128, num_heads=4, d_kv=16, num_encoder_layers=2,
             num_decoder_layers=2, max_length=64)
TOLERANCE = 1e-4
ENCODER_LENGTH, DECODER_LENGTH, DECODE_LENGTH = 12, 8, 12


def tiny(**overrides) -> ModelConfig:
  return dataclasses.replace(BART_BASE, **{**SMALL, **overrides})


def encoder_inputs() -> np.ndarray:
  """Encoder tokens (4, ENCODER_LENGTH) of 12, 9, 5 and 1 tokens, 0-padded."""
  tokens = np.random.RandomState(3).randint(2, SMALL['vocab_size'], (4, ENCODER_LENGTH))
  tokens[np.arange(ENCODER_LENGTH) >= np.array([12, 9, 5, 1])[:, None]] = 0
  return tokens.astype(np.int32)


def decoder_inputs(seed: int) -> np.ndarray:
  """Decoder inputs (4, DECODER_LENGTH) after the start token 0, as training shifts them."""
  tokens = np.random.RandomState(seed).randint(2, SMALL['vocab_size'], (4, DECODER_LENGTH))
  tokens[:, 0] = PAD_ID
  return tokens.astype(np.int32)


def greedy(model, inputs: np.ndarray) -> np.ndarray:
  return np.asarray(decoding.generate(model, jnp.asarray(inputs), max_decode_length=DECODE_LENGTH))


def load_bart(folder: str):
  return transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()


def logit_diff(model, hf, seed: int) -> float:
  """Max |logit difference| on padded encoder inputs (HF is given their attention mask)."""
  encoder, decoder = encoder_inputs(), decoder_inputs(seed)
  ours = np.asarray(model({'encoder_input_tokens': jnp.asarray(encoder),
                           'decoder_input_tokens': jnp.asarray(decoder)}))
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(encoder, dtype=torch.long),
                attention_mask=torch.tensor(encoder > 0, dtype=torch.long),
                decoder_input_ids=torch.tensor(decoder, dtype=torch.long)).logits.numpy()
  return float(np.abs(ours - theirs).max())


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """(our unrolled params, their export folder, transformers' model loaded from it).

  EOS's embedding row trades places with that of the token our greedy decoding of
  `encoder_inputs()` gives 5th in row 0 (in no input, and not before in row 0): the same model but
  for two tokens' names, whose decoding of row 0 now ends there.
  """
  params = perturbed_params(tiny(), seed=4)
  params = swap_with_eos(params, greedy(our_model(tiny(), params), encoder_inputs())[0, 4])
  folder = str(tmp_path_factory.mktemp('bart'))
  export_hf(params, tiny(), folder)
  return params, folder, load_bart(folder)


def test_export_matches_transformers(exported):
  params, folder, hf = exported
  assert type(hf) is transformers.BartForConditionalGeneration
  diff = logit_diff(our_model(tiny(), params), hf, seed=2)
  print(f'BART max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  names = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors')).keys()
  tied = {'lm_head.weight', 'model.encoder.embed_tokens.weight',
          'model.decoder.embed_tokens.weight'}  # model.shared.weight, HF ties them
  assert set(hf.state_dict()) - names == tied  # nothing left at random


def test_export_writes_bart_config_and_tensors(exported):
  params, folder, _ = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  assert (config['model_type'], config['activation_function'], config['scale_embedding']) == (
      'bart', 'gelu_new', False)
  assert (config['decoder_start_token_id'], config['pad_token_id'], config['eos_token_id'],
          config['forced_bos_token_id'], config['forced_eos_token_id']) == (0, 0, 1, None, None)
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  positions = tensors['model.decoder.embed_positions.weight']  # HF's position p is row p + 2
  assert positions.shape == (64 + 2, 64) and not positions[:2].any()
  np.testing.assert_array_equal(positions[2:], params['decoder']['position_embedding']['embedding'])
  layer = params['decoder']['layers'][1]
  np.testing.assert_array_equal(tensors['model.decoder.layers.1.encoder_attn.q_proj.weight'],
                                layer['cross_attention']['q']['kernel'].reshape(64, 64).T * 4)
  for i, factor in ((0, 1), (1, 8)):  # the last layer's norm carries the head's d_model**-0.5
    np.testing.assert_array_equal(tensors[f'model.decoder.layers.{i}.final_layer_norm.bias'],
                                  params['decoder']['layers'][i]['mlp_norm']['bias'] / factor)
  np.testing.assert_array_equal(tensors['final_logits_bias'], np.zeros((1, 256), np.float32))


@pytest.mark.parametrize('scan_layers', [False, True])
def test_greedy_decoding_matches_transformers(exported, scan_layers, tmp_path):
  """HF starts from decoder_start_token_id 0 and pads ended rows with 0, as ours. It is given the
  encoder's attention mask (transformers 5 infers none for an encoder-decoder). A scanned model
  exports through unstack_layers."""
  params, _, _ = exported
  cfg = tiny(scan_layers=scan_layers)
  model = our_model(cfg, params)
  export_hf(nnx.state(model, nnx.Param), cfg, str(tmp_path))
  ours = greedy(model, encoder_inputs())
  assert (ours[0, 4:] == [EOS_ID] + [PAD_ID] * (DECODE_LENGTH - 5)).all()  # see `exported`
  inputs = torch.tensor(encoder_inputs(), dtype=torch.long)
  with torch.no_grad():
    out = load_bart(str(tmp_path)).generate(
        inputs, attention_mask=(inputs > 0).long(), max_new_tokens=DECODE_LENGTH, do_sample=False,
        num_beams=1).numpy()[:, 1:]  # after the start token
  theirs = np.pad(out, ((0, 0), (0, DECODE_LENGTH - out.shape[1])), constant_values=PAD_ID)
  np.testing.assert_array_equal(theirs, ours)


def test_import_gives_back_the_exported_params(exported):
  params, folder, _ = exported
  imported = assert_imports_as_exported(folder, params, tiny())
  assert imported['decoder']['layers']['cross_attention']['q']['kernel'].shape == (2, 64, 4, 16)


@pytest.mark.parametrize('scale_embedding, activation', [(False, 'gelu_new'), (True, 'gelu')])
def test_import_from_transformers(scale_embedding, activation, tmp_path):
  """A BartForConditionalGeneration saved by transformers imports; so does its BartModel, whose
  tensors lack the 'model.' prefix. Embeddings that HF multiplies by sqrt(d_model) import with
  the factor in ours; BART's own erf `gelu` as our gelu_erf."""
  config = transformers.BartConfig(
      vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
      max_position_embeddings=64, activation_function=activation, scale_embedding=scale_embedding,
      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None)
  hf = perturb_torch(transformers.BartForConditionalGeneration(config).eval(), seed=5)
  hf.save_pretrained(tmp_path / 'lm')
  hf.model.save_pretrained(tmp_path / 'base')
  cfg, params = import_hf(str(tmp_path / 'lm'))
  assert cfg == tiny(activation={'gelu_new': 'gelu', 'gelu': 'gelu_erf'}[activation])
  diff = logit_diff(our_model(cfg, params), hf, seed=6)
  print(f'imported BART ({activation}, scale_embedding={scale_embedding}) max |logit diff| '
        f'{diff:.2e}')
  assert diff < TOLERANCE
  assert_same_params(import_hf(str(tmp_path / 'base'))[1], params)


@pytest.mark.parametrize('overrides, message', [
    (dict(norm_position='pre'), r"BART models \(norm_position='post'\); got norm_position='pre'"),
    (dict(embed_norm=False), 'got embed_norm=False'),
    (dict(tie_embeddings=False), 'got tie_embeddings=False'),
    (dict(norm_eps=1e-12), r'BART models \(norm_eps=1e-05\); got norm_eps=1e-12'),
    (dict(use_bias=False), 'got use_bias=False'),
    (dict(activation='gated-gelu'), 'BART export needs an ungated activation'),
    (dict(d_kv=8), r'num_heads \* d_kv == d_model \(got gelu, 4 \* 8 vs 64\)'),
    (dict(position='sinusoidal'), r"T5 models \(position='t5_relative'\); got position="),
])
def test_export_refuses_what_bart_cannot_be(overrides, message, tmp_path):
  """Learned positions make an encoder-decoder BART; any other one is measured against T5."""
  with pytest.raises(ValueError, match=message):
    export_hf({}, tiny(**overrides), str(tmp_path))
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('change, message', [
    (dict(activation_function='silu'),
     "unsupported BART activation_function='silu'; expected one of relu, gelu_new, gelu$"),
    (dict(tie_word_embeddings=False), 'unsupported BART tie_word_embeddings=False'),
    (dict(normalize_before=True), 'unsupported BART normalize_before=True'),
    (dict(add_final_layer_norm=True), 'unsupported BART add_final_layer_norm=True'),
    (dict(decoder_ffn_dim=256), 'unsupported BART encoder_ffn_dim=128 with decoder_ffn_dim=256'),
    (dict(d_model=None), 'BART config.json misses d_model'),
])
def test_import_refuses_what_t5lite_cannot_be(exported, change, message, tmp_path):
  _, folder, _ = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = {k: v for k, v in {**json.load(f), **change}.items() if v is not None}
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(config, f)
  os.symlink(os.path.join(folder, 'model.safetensors'), tmp_path / 'model.safetensors')
  with pytest.raises(ValueError, match=message):
    import_hf(str(tmp_path))


def test_import_refuses_a_final_logits_bias(exported, tmp_path):
  _, folder, _ = exported
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  tensors['final_logits_bias'][0, 7] = 1.0
  safetensors.numpy.save_file(tensors, str(tmp_path / 'model.safetensors'))
  os.symlink(os.path.join(folder, 'config.json'), tmp_path / 'config.json')
  with pytest.raises(ValueError, match='unsupported BART final_logits_bias other than zeros'):
    import_hf(str(tmp_path))
