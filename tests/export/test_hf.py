"""Hugging Face export/import of T5 v1.0 and v1.1: logits agree with transformers both ways; the
export of BERT with next-sentence prediction (and no HF MLM head) agrees too.

transformers runs on CPU in float32 with random weights (no downloads). Every tensor, layer norm
scales included, is perturbed away from its initial value so that a wrong mapping shows.
"""

import dataclasses
import json
import os
import subprocess
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, build, get_params, load_params

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

VERSIONS = {'v1_0': dict(activation='relu', tie_embeddings=True),
            'v1_1': dict(activation='gated-gelu', tie_embeddings=False)}
ENCODER_LENGTH, DECODER_LENGTH = 12, 8
BERT_LAYERS = dict(position='learned', norm='layer', norm_position='post', use_bias=True,
                   max_length=16, norm_eps=1e-12)
TOLERANCE = 1e-4


def tiny(version: str, **overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
                num_decoder_layers=2, dropout=0.0, **VERSIONS[version])
  return ModelConfig(**{**fields, **overrides})


def perturbed_model(cfg: ModelConfig, seed: int):
  """Our model with every parameter scaled by a random factor (norm scales stop being 1)."""
  model = build(cfg, nnx.Rngs(seed))
  rng = np.random.RandomState(seed)
  load_params(model, jax.tree.map(lambda x: x * (1 + 0.3 * rng.randn(*x.shape)), get_params(model)))
  return model


def hf_model(version: str, seed: int):
  """A random transformers T5ForConditionalGeneration; v1.1 gets its own lm head."""
  cfg = tiny(version)
  config = transformers.T5Config(
      vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_ff=cfg.d_ff, d_kv=cfg.d_kv,
      num_heads=cfg.num_heads, num_layers=2, num_decoder_layers=2, dropout_rate=0.0,
      feed_forward_proj='relu' if version == 'v1_0' else 'gated-gelu',
      tie_word_embeddings=cfg.tie_embeddings, decoder_start_token_id=0)
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(config).eval()
  if not cfg.tie_embeddings:
    model.lm_head.weight = torch.nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model))
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.mul_(1 + 0.3 * torch.randn_like(parameter))
  return model


def hf_logits(model, encoder, decoder) -> np.ndarray:
  encoder, decoder = torch.as_tensor(encoder, dtype=torch.long), torch.as_tensor(decoder)
  with torch.no_grad():
    return model(input_ids=encoder, attention_mask=(encoder > 0).long(),
                 decoder_input_ids=decoder.long()).logits.numpy()


def padded_batch(seed: int) -> dict:
  """Two rows; row 1 has 4 encoder pads; decoder inputs start with T5's start token 0."""
  rng = np.random.RandomState(seed)
  encoder = rng.randint(2, 128, (2, ENCODER_LENGTH))
  encoder[1, -4:] = 0
  decoder = rng.randint(2, 128, (2, DECODER_LENGTH))
  decoder[:, 0] = 0
  return {'encoder_input_tokens': encoder.astype(np.int32),
          'decoder_input_tokens': decoder.astype(np.int32)}


def packed_batch(seed: int):
  """Two examples packed in row 0 (row 1 repeats it), and the examples themselves."""
  rng = np.random.RandomState(seed)
  examples = [(rng.randint(2, 128, e), np.concatenate([[0], rng.randint(2, 128, d - 1)]))
              for e, d in ((7, 3), (5, 4))]
  batch = {}
  for side, index, length in (('encoder', 0, ENCODER_LENGTH), ('decoder', 1, DECODER_LENGTH)):
    parts = [example[index] for example in examples]
    pad = (0, length - sum(map(len, parts)))
    batch[f'{side}_input_tokens'] = np.pad(np.concatenate(parts), pad)
    batch[f'{side}_segment_ids'] = np.pad(np.repeat([1, 2], list(map(len, parts))), pad)
    batch[f'{side}_positions'] = np.pad(np.concatenate([np.arange(len(p)) for p in parts]), pad)
  return {k: np.stack([v, v]).astype(np.int32) for k, v in batch.items()}, examples


def assert_parity(ours, theirs, seed: int) -> None:
  """Padded batch and packed batch: ours and transformers' logits within TOLERANCE."""
  batch = padded_batch(seed)
  diff = np.abs(np.asarray(ours(jax.tree.map(jnp.asarray, batch)))
                - hf_logits(theirs, batch['encoder_input_tokens'], batch['decoder_input_tokens']))
  packed, examples = packed_batch(seed)
  logits = np.asarray(ours(jax.tree.map(jnp.asarray, packed)))[0]
  start, packed_diff = 0, 0.0
  for encoder, decoder in examples:
    alone = hf_logits(theirs, encoder[None], decoder[None])[0]
    packed_diff = max(packed_diff, np.abs(logits[start:start + len(decoder)] - alone).max())
    start += len(decoder)
  print(f'max |logit diff|: padded {diff.max():.2e}, packed {packed_diff:.2e}')
  assert diff.max() < TOLERANCE and packed_diff < TOLERANCE


@pytest.fixture(scope='module', params=sorted(VERSIONS))
def exported(request, tmp_path_factory):
  """(cfg, our model, its export folder, transformers' model loaded from it)."""
  cfg = tiny(request.param)
  model = perturbed_model(cfg, seed=1)
  folder = str(tmp_path_factory.mktemp(f'export_{request.param}'))
  export_hf(nnx.state(model, nnx.Param), cfg, folder)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
  return cfg, model, folder, hf


def test_export_matches_transformers(exported):
  cfg, model, _, hf = exported
  assert hf.config.scale_decoder_outputs == cfg.tie_embeddings  # v1.0 rescales by d_model**-0.5
  assert_parity(model, hf, seed=2)


def test_export_writes_t5_config_and_tensors(exported):
  cfg, model, folder, _ = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  assert config['model_type'] == 't5' and config['tie_word_embeddings'] == cfg.tie_embeddings
  assert config['feed_forward_proj'] == {'relu': 'relu', 'gated-gelu': 'gated-gelu'}[
      cfg.activation]
  assert (config['decoder_start_token_id'], config['pad_token_id'], config['eos_token_id']) == (
      0, 0, 1)
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  assert ('lm_head.weight' in tensors) == (not cfg.tie_embeddings)
  # HF keeps the relative attention bias in block 0 of each stack only: (buckets, heads).
  for stack in ('encoder', 'decoder'):
    name = f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight'
    np.testing.assert_array_equal(tensors[name],
                                  getattr(model, stack).relative_bias.embedding.get_value())
    assert tensors[name].shape == (cfg.relative_buckets, cfg.num_heads)
  assert not any('block.1' in name and 'relative_attention_bias' in name for name in tensors)
  q = tensors['decoder.block.1.layer.1.EncDecAttention.q.weight']  # torch Linear: (out, in)
  assert q.shape == (cfg.num_heads * cfg.d_kv, cfg.d_model)


def test_export_of_scanned_layers_is_the_same(exported, tmp_path):
  cfg, model, folder, _ = exported
  scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
  cfg_back, params = import_hf(folder, scan_layers=True)
  assert cfg_back == scanned_cfg
  assert params['encoder']['layers']['mlp']['wo']['kernel'].shape == (2, cfg.d_ff, cfg.d_model)
  export_hf(params, scanned_cfg, str(tmp_path))
  original = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  again = safetensors.numpy.load_file(os.path.join(tmp_path, 'model.safetensors'))
  assert original.keys() == again.keys()
  for name in original:
    np.testing.assert_array_equal(again[name], original[name])


@pytest.mark.parametrize('version', sorted(VERSIONS))
def test_import_from_transformers(version, tmp_path):
  hf = hf_model(version, seed=3)
  hf.save_pretrained(tmp_path)
  cfg, params = import_hf(str(tmp_path))
  assert cfg == tiny(version)
  model = build(cfg, nnx.Rngs(0))
  load_params(model, params)
  assert_parity(model, hf, seed=4)


def test_import_of_a_tied_unscaled_head(tmp_path):
  """transformers 5 ties v1.1's head to the embedding; that imports as an untied copy."""
  hf = hf_model('v1_1', seed=5)
  hf.lm_head.weight = hf.shared.weight
  hf.save_pretrained(tmp_path)
  cfg, params = import_hf(str(tmp_path))
  assert not cfg.tie_embeddings
  np.testing.assert_array_equal(params['lm_head']['kernel'], params['embed']['embedding'].T)
  model = build(cfg, nnx.Rngs(0))
  load_params(model, params)
  batch = padded_batch(6)
  np.testing.assert_allclose(
      model(jax.tree.map(jnp.asarray, batch)),
      hf_logits(hf, batch['encoder_input_tokens'], batch['decoder_input_tokens']), atol=TOLERANCE)


@pytest.mark.parametrize('overrides, message', [
    (dict(arch='decoder'), "GPT-2 models .position='learned'.; got position='t5_relative'"),
    (dict(arch='encoder'), "BERT with next-sentence prediction models .position='learned'.; "
                           "got position='t5_relative'"),
    (dict(position='sinusoidal'), "got position='sinusoidal'"),
    (dict(norm_position='post'), "got norm_position='post'"),
    (dict(arch='electra', **BERT_LAYERS, embed_norm=False), 'ELECTRA models .embed_norm=True.'),
    (dict(arch='electra', **BERT_LAYERS, embed_norm=True, d_kv=4),
     r'ELECTRA export needs .* \(got relu, 4 \* 4 vs 32\)'),
])
def test_export_refuses_other_architectures(overrides, message, tmp_path):
  cfg = tiny('v1_0', **overrides)
  with pytest.raises(ValueError, match=message):
    export_hf({}, cfg, str(tmp_path))
  assert not os.listdir(tmp_path)


def bert_with_next_sentence(seed: int):
  """A tiny BERT with next-sentence prediction and our plain MLM head, every parameter perturbed
  (biases and norm offsets stop being 0, scales 1)."""
  cfg = ModelConfig(arch='encoder', vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8,
                    num_encoder_layers=2, num_decoder_layers=0, activation='gelu',
                    embed_norm=True, next_sentence=True, **BERT_LAYERS)
  model = build(cfg, nnx.Rngs(seed))
  rng = np.random.RandomState(seed)
  load_params(model, jax.tree.map(
      lambda x: x * (1 + 0.3 * rng.randn(*x.shape)) + 0.1 * rng.randn(*x.shape),
      get_params(model)))
  return cfg, model


def bert_batch(seed: int):
  """Tokens (4, 12) with right padding, and token types: segment B from a random point."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, 128, size=(4, 12)).astype(np.int32)
  lengths = np.array([12, 9, 5, 12])
  tokens[np.arange(12) >= lengths[:, None]] = 0
  types = (np.arange(12) >= rng.randint(2, 5, size=(4, 1))).astype(np.int32) * (tokens > 0)
  return tokens, types


def test_bert_with_next_sentence_prediction_exports_to_transformers(tmp_path):
  """Encoder states, pooler and next-sentence logits, token types included, agree with
  BertForNextSentencePrediction."""
  cfg, model = bert_with_next_sentence(seed=9)
  export_hf(nnx.state(model, nnx.Param), cfg, str(tmp_path))
  hf = transformers.BertForNextSentencePrediction.from_pretrained(str(tmp_path)).eval()
  tokens, types = bert_batch(10)
  hidden = model.hidden_states({'encoder_input_tokens': jnp.asarray(tokens),
                                'encoder_token_types': jnp.asarray(types)})
  ours = np.asarray(model.next_sentence_logits(hidden))  # (b, 2)
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(tokens, dtype=torch.long),
             token_type_ids=torch.tensor(types, dtype=torch.long),
             attention_mask=torch.tensor(tokens > 0, dtype=torch.long), output_hidden_states=True)
  hidden_diff = np.abs(np.asarray(hidden) - out.hidden_states[-1].numpy())[tokens > 0]
  logit_diff = np.abs(ours - out.logits.numpy())
  print(f'BERT max |diff|: hidden {hidden_diff.max():.2e}, next-sentence logits '
        f'{logit_diff.max():.2e}')
  assert hidden_diff.max() < TOLERANCE and logit_diff.max() < TOLERANCE
  # the token types matter: all-A inputs give other logits
  all_a = model.hidden_states({'encoder_input_tokens': jnp.asarray(tokens)})
  same = model.next_sentence_logits(all_a)
  assert np.abs(np.asarray(same) - ours).max() > 1e-2


def test_export_refuses_params_of_another_config(exported, tmp_path):
  cfg, model, _, _ = exported
  other = dataclasses.replace(cfg, tie_embeddings=not cfg.tie_embeddings,
                              activation='gated-gelu' if cfg.activation == 'relu' else 'relu')
  with pytest.raises(ValueError, match='params have no'):
    export_hf(get_params(model), other, str(tmp_path))


def test_import_refuses_what_is_not_a_t5_checkpoint(exported, tmp_path):
  _, _, folder, _ = exported
  with pytest.raises(ValueError, match='no config.json'):
    import_hf(str(tmp_path))
  with open(os.path.join(tmp_path, 'config.json'), 'w') as f:
    json.dump({'model_type': 'llama'}, f)
  with pytest.raises(ValueError, match="not a Switch, BART, UMT5, MT5, T5, BERT, RoBERTa, GPT-2 "
                                       "or ELECTRA checkpoint: model_type='llama'"):
    import_hf(str(tmp_path))
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(tmp_path, 'config.json'), 'w') as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match='has no model.safetensors'):
    import_hf(str(tmp_path))
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  del tensors['decoder.block.1.layer.2.layer_norm.weight']
  safetensors.numpy.save_file(tensors, os.path.join(tmp_path, 'model.safetensors'))
  with pytest.raises(ValueError, match=r'misses 1 T5 tensor\(s\), e.g. decoder.block.1.layer.2'):
    import_hf(str(tmp_path))


def test_export_needs_no_torch(tmp_path):
  """Export runs with torch and transformers unimportable."""
  script = f'''
import sys
sys.modules['torch'] = sys.modules['transformers'] = None
import numpy as np
from flax import nnx
import jax
from t5lite.export import export_hf
from t5lite.models import ModelConfig, build, get_params
cfg = ModelConfig(vocab_size=128, d_model=16, d_ff=32, num_heads=2, d_kv=8,
                  num_encoder_layers=1, num_decoder_layers=1)
abstract = nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0)))
params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), get_params(abstract))
export_hf(params, cfg, {str(tmp_path)!r})
'''
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  subprocess.run([sys.executable, '-c', script], check=True, env=env,
                 cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert sorted(os.listdir(tmp_path)) == ['config.json', 'model.safetensors']
