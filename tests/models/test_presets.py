"""Every preset in configs/ builds abstractly with its published size; bad configs fail early."""

import dataclasses
import importlib.util
import math
import pathlib

from flax import nnx
import jax
import pytest

from t5lite import config as t5config
from t5lite.models import ModelConfig, build

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / 'configs'

# Published sizes (T5 paper, T5 v1.1 release notes); counted with the untied v1.1 lm head.
# Exact counts agree with HF T5ForConditionalGeneration built on the meta device.
PUBLISHED = {
    't5_small': 60.5e6, 't5_base': 223e6, 't5_large': 738e6, 't5_3b': 2.85e9, 't5_11b': 11.3e9,
    't5_1_1_small': 77e6, 't5_1_1_base': 248e6, 't5_1_1_large': 783e6, 't5_1_1_xl': 2.85e9,
    't5_1_1_xxl': 11.1e9,
    'ul2_base': 248e6,  # T5 v1.1 base's shape, as UL2's models are T5 v1.1's
}

# The family's presets: (published size, exact count). The exact counts are Hugging Face's
# (transformers 5.23, built on the meta device) less what t5lite leaves out, plus what it adds:
# BERT is BertForPreTraining, all there; RoBERTa is RobertaForMaskedLM less its one token type
# (no next sentence) and its 2 offset position rows; BART has no 2 offset position rows per
# stack; GPT-2 is all there. Vaswani's by hand: 6*3,152,384 + 6*4,204,032 in the layers. Plus the
# embedding rows (and MLM output biases) that pad each vocabulary to a multiple of 128.
FAMILY = {
    'bert_base': (110e6, 110_106_428 + (30592 - 30522) * (768 + 1)),
    'roberta_base': (125e6, 124_697_433 - 768 - 2 * 768 + (50304 - 50265) * (768 + 1)),
    'gpt2_small': (124e6, 124_439_808 + (50304 - 50257) * 768),
    'transformer_base': (65e6, 37_120 * 512 + 6 * 3_152_384 + 6 * 4_204_032),
    'bart_base': (140e6, 139_420_416 - 2 * 2 * 768 + (50304 - 50265) * 768),
    # ELECTRA-small by hand, BERT layers of 4 * d * inner + 2 * d * ff weights, their biases
    # (3 * inner + d + ff + d) and two LayerNorms (4 * d): 12 discriminator layers (d and inner
    # 256, ff 1024), 12 generator layers (d and inner 64, ff 256); the 8192-id embedding, 512
    # positions and the embedding LayerNorm (2 * 256), all shared; the discriminator head (d*d + d,
    # then d + 1); the generator's projection in (256 * 64 + 64) and MLM head (64 * 256 + 256, a
    # LayerNorm, 8192 output biases). No published count to compare: the paper's 14M is the
    # discriminator alone with 30,522 ids embedded 128 wide.
    'electra_small': (None, 12 * (4 * 256 * 256 + 2 * 256 * 1024 + 5 * 256 + 1024 + 1024)
                      + 12 * (4 * 64 * 64 + 2 * 64 * 256 + 5 * 64 + 256 + 256)
                      + (8192 + 512 + 2) * 256 + 256 * 256 + 256 + 256 + 1
                      + 256 * 64 + 64 + 64 * 256 + 256 + 2 * 256 + 8192),
}

# The Switch Transformers as Hugging Face publishes them (google/switch-base-N model cards: 620M
# for 8 experts, 7.4B for 128), the exact counts transformers' for the same config
SWITCH = {'switch_base_8': 620e6, 'switch_base_16': 1.07e9, 'switch_base_32': 1.98e9,
          'switch_base_128': 7.4e9}
# ByT5 (Xue et al. 2022, table 1), mT5 (Xue et al. 2021) and UMT5 (no size published): the
# published size and transformers' class, whose count (built on the meta device, its forced tie
# undone: the checkpoints have their own lm head) must be ours exactly.
MULTILINGUAL = {
    'byt5_small': (300e6, 'T5'), 'byt5_base': (582e6, 'T5'), 'byt5_large': (1.23e9, 'T5'),
    'byt5_xl': (3.74e9, 'T5'), 'byt5_xxl': (12.9e9, 'T5'),
    'mt5_small': (300e6, 'MT5'), 'mt5_base': (580e6, 'MT5'), 'mt5_large': (1.2e9, 'MT5'),
    'mt5_xl': (3.7e9, 'MT5'), 'mt5_xxl': (13e9, 'MT5'),
    'umt5_small': (None, 'UMT5'), 'umt5_base': (None, 'UMT5'), 'umt5_xl': (None, 'UMT5'),
    'umt5_xxl': (None, 'UMT5'),
}


def preset(name: str) -> ModelConfig:
  """The ModelConfig of configs/NAME.py, imported from its path (no config flags)."""
  spec = importlib.util.spec_from_file_location(f'configs_{name}', CONFIGS / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return t5config.model_config(module.get_config())


def count_params(cfg: ModelConfig) -> int:
  """Parameters of the abstract model; scanned layers trace one layer per stack, so it is fast."""
  model = nnx.eval_shape(lambda: build(dataclasses.replace(cfg, scan_layers=True), nnx.Rngs(0)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def t5_formula(cfg: ModelConfig) -> int:
  """T5's parameter count by hand: embedding, attention, FFN, RMSNorm scales, bias tables."""
  attention = 4 * cfg.d_model * cfg.num_heads * cfg.d_kv
  ffn = (3 if cfg.is_gated else 2) * cfg.d_model * cfg.d_ff
  encoder_layer = attention + ffn + 2 * cfg.d_model
  decoder_layer = 2 * attention + ffn + 3 * cfg.d_model
  table = cfg.relative_buckets * cfg.num_heads  # a stack's bias table (UMT5: a layer's)
  tables = (cfg.num_encoder_layers + cfg.num_decoder_layers if cfg.relative_bias_per_layer
            else 2) * table
  embeddings = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
  return (embeddings + tables + 2 * cfg.d_model + cfg.num_encoder_layers * encoder_layer
          + cfg.num_decoder_layers * decoder_layer)


def test_every_preset_is_covered():
  names = {path.stem for path in CONFIGS.glob('*.py')}
  assert set(PUBLISHED) <= names
  assert names - set(PUBLISHED) - set(FAMILY) - set(SWITCH) - set(MULTILINGUAL) <= {
      't5_tiny', 't5_tiny_distill', 'ul2_tiny', 'switch_tiny'}, (
      'add the new preset to PUBLISHED')


@pytest.mark.parametrize('name', sorted(PUBLISHED))
def test_preset_parameter_count(name):
  cfg = preset(name)
  count = count_params(cfg)
  print(f'{name}: {count:,} parameters (published {PUBLISHED[name]:,.0f})')
  assert count == t5_formula(cfg)
  assert abs(count / PUBLISHED[name] - 1) < 0.01


@pytest.mark.parametrize('name', sorted(FAMILY))
def test_family_preset_parameter_count(name):
  published, exact = FAMILY[name]
  count = count_params(preset(name))
  assert count == exact
  if published is not None:
    assert abs(count / published - 1) < 0.03


@pytest.mark.parametrize('name', sorted(SWITCH))
def test_switch_preset_parameter_count_is_transformers(name):
  transformers = pytest.importorskip('transformers')
  torch = pytest.importorskip('torch')
  cfg = preset(name)
  config = transformers.SwitchTransformersConfig(
      vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_ff=cfg.d_ff, d_kv=cfg.d_kv,
      num_heads=cfg.num_heads, num_layers=cfg.num_encoder_layers,
      num_decoder_layers=cfg.num_decoder_layers, num_sparse_encoder_layers=6,
      num_sparse_decoder_layers=6, num_experts=cfg.num_experts,
      tie_word_embeddings=cfg.tie_embeddings)
  with torch.device('meta'):
    hf = transformers.SwitchTransformersForConditionalGeneration(config)
  count = count_params(cfg)
  assert count == sum(p.numel() for p in hf.parameters())
  assert abs(count / SWITCH[name] - 1) < 0.01


def test_switch_tiny_is_t5_tiny_with_experts():
  """Its 4 sparse layers hold 8 experts of t5_tiny's MLP (3 * 256 * 1024 weights) and a router
  (256 x 8) in place of the one MLP."""
  t5_tiny, switch_tiny = preset('t5_tiny'), preset('switch_tiny')
  assert dataclasses.replace(switch_tiny, num_experts=0) == t5_tiny
  assert count_params(switch_tiny) == 13_637_376 + 4 * (7 * 3 * 256 * 1024 + 256 * 8)


@pytest.mark.parametrize('name', sorted(MULTILINGUAL))
def test_multilingual_preset_parameter_count_is_transformers(name):
  """ByT5's encoder is 3 times as deep as its decoder; mT5 and UMT5 have one bias table a stack
  and a layer."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  published, kind = MULTILINGUAL[name]
  cfg = preset(name)
  count = count_params(cfg)
  config = getattr(transformers, f'{kind}Config')(
      vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_ff=cfg.d_ff, d_kv=cfg.d_kv,
      num_heads=cfg.num_heads, num_layers=cfg.num_encoder_layers,
      num_decoder_layers=cfg.num_decoder_layers, feed_forward_proj='gated-gelu')
  with torch.device('meta'):
    hf = getattr(transformers, f'{kind}ForConditionalGeneration')(config)
  tied = hf.lm_head.weight is hf.shared.weight
  hf_count = sum(p.numel() for p in hf.parameters()) + tied * hf.lm_head.weight.numel()
  print(f'{name}: {count:,} parameters, transformers {hf_count:,} (published {published})')
  assert count == hf_count == t5_formula(cfg)
  if name.startswith('byt5'):
    assert cfg.num_encoder_layers == 3 * cfg.num_decoder_layers and cfg.vocab_size == 384
  if published is not None:
    assert abs(count / published - 1) < 0.03  # published to 2 or 3 digits


def test_t5_tiny_builds():
  cfg = preset('t5_tiny')
  assert count_params(cfg) == t5_formula(cfg) == 13_637_376


def test_scanned_and_unrolled_have_the_same_parameters():
  cfg = preset('t5_small')
  unrolled = nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0)))
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(unrolled, nnx.Param)))
  assert count == count_params(cfg) == 60_506_624


@pytest.mark.parametrize('field, value', [
    ('activation', 'swish'), ('position', 'alibi'), ('norm', 'batch'),
    ('attention', 'flex'), ('remat_policy', 'some'), ('dtype', 'int8'), ('mlm_transform', 'gelu'),
])
def test_bad_config_fails_at_construction(field, value):
  with pytest.raises(ValueError, match=f'model.{field}'):
    ModelConfig(**{field: value})


def test_unknown_preset_key_fails():
  config = t5config.base_config()
  config.model.unlock()
  config.model.n_layers = 3
  with pytest.raises(ValueError, match='model.n_layers'):
    t5config.model_config(config)
