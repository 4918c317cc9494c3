"""The Switch Transformer both ways with transformers' SwitchTransformersForConditionalGeneration:
logits, router z-loss and load-balancing loss equal in evaluation with a capacity that drops
tokens (transformers' is per sequence), greedy decoding equal to `generate`, the export loading
through the Auto classes. Random weights, perturbed (tests/export/hf_testing.py)."""

import json
import os

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, decoding, experts, get_params
from t5lite.objectives import routing
from tests.export import hf_testing

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

ENCODER_LENGTH, DECODER_LENGTH, VOCAB = 12, 7, 96
# 4 encoder layers, 2 of them sparse (transformers' step 4 // 2 = 2: layers 1 and 3), 3 decoder
# layers, 1 sparse (step 3: layer 1); 4 experts with 2 slots each in a row of 12 tokens: most
# rows drop some. (transformers computes no router loss for a stack of step 1, all sparse.)
HF_CONFIG = dict(vocab_size=VOCAB, d_model=24, d_ff=40, d_kv=6, num_heads=3, num_layers=4,
                 num_decoder_layers=3, num_sparse_encoder_layers=2, num_sparse_decoder_layers=1,
                 num_experts=4, expert_capacity=2, dropout_rate=0.0, tie_word_embeddings=True,
                 dense_act_fn='gelu_new', router_jitter_noise=0.02)
OURS = ModelConfig(vocab_size=VOCAB, d_model=24, d_ff=40, d_kv=6, num_heads=3,
                   num_encoder_layers=4, num_decoder_layers=3, encoder_sparse_step=2,
                   decoder_sparse_step=3, num_experts=4, expert_capacity=2, dropout=0.0,
                   tie_embeddings=True, activation='gelu', router_jitter=0.02)


def padded_batch(seed: int) -> dict:
  """Three rows; row 2 has 5 encoder pads (routed as any token, as transformers does)."""
  rng = np.random.RandomState(seed)
  encoder = rng.randint(2, VOCAB, (3, ENCODER_LENGTH))
  encoder[2, -5:] = 0
  decoder = rng.randint(2, VOCAB, (3, DECODER_LENGTH))
  decoder[:, 0] = 0
  return {'encoder_input_tokens': encoder, 'decoder_input_tokens': decoder}


def ours_in_eval(model, batch) -> tuple[np.ndarray, dict]:
  """Logits and each stack's (z-loss, load-balancing loss, fraction dropped)."""
  logits, stats = nnx.capture(model, experts.RouterStats)(jax.tree.map(jnp.asarray, batch))
  sums = routing.captured_sums(stats, model.cfg.num_experts)
  return np.asarray(logits), {stack: (s['z_loss'] / s['tokens'], s['load_balance'] / s['tokens'],
                                      s['dropped'] / s['routed']) for stack, s in sums.items()}


def transformers_in_eval(hf, batch) -> tuple[np.ndarray, dict]:
  encoder = torch.as_tensor(batch['encoder_input_tokens'], dtype=torch.long)
  with torch.no_grad():
    out = hf(input_ids=encoder, attention_mask=(encoder > 0).long(),
             decoder_input_ids=torch.as_tensor(batch['decoder_input_tokens'], dtype=torch.long),
             output_router_logits=True)
  return out.logits.numpy(), {'encoder': (out.encoder_z_loss, out.encoder_aux_loss),
                              'decoder': (out.decoder_z_loss, out.decoder_aux_loss)}


def assert_parity(model, hf, seed: int):
  batch = padded_batch(seed)
  logits, losses = ours_in_eval(model, batch)
  hf_logits, hf_losses = transformers_in_eval(hf, batch)
  np.testing.assert_allclose(logits, hf_logits, atol=1e-4)
  for stack in ('encoder', 'decoder'):
    z, balance, dropped = losses[stack]
    np.testing.assert_allclose([z, balance], [float(x) for x in hf_losses[stack]], rtol=1e-5)
  assert losses['encoder'][2] > 0.1  # capacity 2 of 12 tokens: tokens were dropped


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
  """A perturbed random transformers Switch model, saved and imported."""
  folder = str(tmp_path_factory.mktemp('switch_hf'))
  config = transformers.SwitchTransformersConfig(**HF_CONFIG)
  torch.manual_seed(0)
  hf = hf_testing.perturb_torch(
      transformers.SwitchTransformersForConditionalGeneration(config).eval(), seed=1)
  with torch.no_grad():  # EOS likelier, so that some rows of a decoding stop early
    hf.shared.weight[1] *= 2.0
  hf.save_pretrained(folder)
  cfg, params = import_hf(folder)
  return folder, hf, cfg, hf_testing.our_model(cfg, params), params


def test_import_computes_as_transformers(imported):
  folder, hf, cfg, model, params = imported
  assert cfg == OURS
  assert set(params['encoder']['layers'][1]['mlp']) == {'router', 'wi', 'wo'}
  assert 'router' not in params['encoder']['layers'][2]['mlp']['wi']  # a dense layer: T5's
  assert_parity(model, hf, seed=2)
  hf_testing.assert_imports_as_exported(folder, params, cfg)  # and scanned, layers in groups


def test_greedy_decoding_is_transformers_generate(imported):
  _, hf, _, model, _ = imported
  inputs = padded_batch(3)['encoder_input_tokens']
  ours = np.asarray(decoding.generate(model, inputs, max_decode_length=6))
  ids = torch.as_tensor(inputs, dtype=torch.long)
  with torch.no_grad():
    theirs = hf.generate(input_ids=ids, attention_mask=(ids > 0).long(), do_sample=False,
                         num_beams=1, max_new_tokens=6, decoder_start_token_id=0).numpy()[:, 1:]
  theirs = np.pad(theirs, ((0, 0), (0, 6 - theirs.shape[1])))
  eos = np.cumsum(theirs == decoding.EOS_ID, axis=1) - (theirs == decoding.EOS_ID) > 0
  np.testing.assert_array_equal(ours, np.where(eos, 0, theirs))  # ours: 0 after EOS


def test_export_loads_through_the_auto_classes(tmp_path):
  cfg = OURS
  params = hf_testing.perturbed_params(cfg, seed=4)
  model = hf_testing.our_model(cfg, params)
  export_hf(params, cfg, str(tmp_path))
  with open(os.path.join(tmp_path, 'config.json')) as f:
    config = json.load(f)
  assert (config['model_type'], config['decoder_start_token_id']) == ('switch_transformers', 0)
  assert (config['num_sparse_encoder_layers'], config['num_sparse_decoder_layers']) == (2, 1)
  hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path)).eval()
  assert type(hf).__name__ == 'SwitchTransformersForConditionalGeneration'
  assert_parity(model, hf, seed=5)
  labels = torch.as_tensor(padded_batch(6)['decoder_input_tokens'], dtype=torch.long)
  with torch.no_grad():  # its loss shifts the labels right from decoder_start_token_id
    assert torch.isfinite(hf(input_ids=labels, labels=labels).loss)


@pytest.mark.parametrize('overrides, message', [
    (dict(router_bias=True), 'unsupported Switch router_bias=True; only router_bias=False'),
    (dict(router_dtype='bfloat16'), "unsupported Switch router_dtype='bfloat16'"),
    (dict(router_ignore_padding_tokens=True), 'router_ignore_padding_tokens=True'),
    (dict(dense_act_fn='gated-gelu'), "unsupported Switch dense_act_fn='gated-gelu'"),
])
def test_import_refuses_a_router_or_activation_of_another_kind(imported, overrides, message,
                                                               tmp_path):
  folder = imported[0]
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  os.symlink(os.path.join(folder, 'model.safetensors'), tmp_path / 'model.safetensors')
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump({**config, **overrides}, f)
  with pytest.raises(ValueError, match=message) as error:
    import_hf(str(tmp_path))
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('overrides, message', [
    (dict(expert_top_k=2), 'top-1 routing, an ungated activation and expert_weights=probability; '
     'got expert_top_k=2'),
    (dict(activation='gated-gelu'), 'got expert_top_k=1, gated-gelu, probability'),
    (dict(expert_weights='normalized'), 'got expert_top_k=1, gelu, normalized'),
    (dict(num_encoder_layers=7, encoder_sparse_step=4), 'places 2 sparse layers of 7 otherwise '
     'than model.encoder_sparse_step=4'),
])
def test_export_refuses_what_transformers_cannot_compute(overrides, message, tmp_path):
  cfg = ModelConfig(**{**OURS.__dict__, **overrides})
  params = get_params(hf_testing.our_model(cfg, hf_testing.perturbed_params(cfg, 0)))
  with pytest.raises(ValueError, match=message):
    export_hf(params, cfg, str(tmp_path))
  assert not os.listdir(tmp_path)
