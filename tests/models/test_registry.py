"""The registry: one `Family` per `model.arch`, refusals in one line, and an architecture added in
one module and one line (a toy one registered here)."""

import functools
import pathlib
import runpy

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import config as t5config
from t5lite.export import export_hf
from t5lite.models import ModelConfig, build, decoding, family, get_params, registry
from t5lite.models.architecture import Family, Shapes, StackShape, require_layers
from t5lite.models.decoder import DecoderOnly
from t5lite.models.hf_mapping import HfModel
from t5lite.train import flops

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / 'configs'
TINY = dict(vocab_size=100, d_model=8, d_ff=16, num_heads=2, d_kv=4, num_encoder_layers=1,
            num_decoder_layers=1)


def test_an_unknown_arch_is_refused_in_one_line():
  message = "^model.arch='rnn' is not one of encoder_decoder, encoder, decoder, electra$"
  with pytest.raises(ValueError, match=message):
    family('rnn')
  with pytest.raises(ValueError, match=message):
    build(ModelConfig(arch='rnn'), nnx.Rngs(0))
  config = t5config.base_config()
  config.model.arch = 'rnn'
  with pytest.raises(ValueError, match=message):
    t5config.model_config(config)


@pytest.mark.parametrize('overrides, message', [
    (dict(arch='decoder', num_decoder_layers=0),
     "model.arch='decoder' needs num_decoder_layers > 0"),
    (dict(arch='encoder_decoder', num_encoder_layers=0),
     "model.arch='encoder_decoder' needs num_encoder_layers > 0"),
    (dict(arch='electra', next_sentence=True),
     "model.next_sentence is BERT's .arch=encoder., not arch='electra'"),
    (dict(arch='decoder', mlm_transform='bert'),
     "model.mlm_transform is BERT's and RoBERTa's .arch=encoder., not arch='decoder'"),
])
def test_a_setting_the_family_cannot_take_is_refused_in_one_line(overrides, message):
  config = t5config.base_config()
  config.model.update(overrides)
  with pytest.raises(ValueError, match=message):
    t5config.model_config(config)
  with pytest.raises(ValueError, match=message):
    build(ModelConfig(**overrides), nnx.Rngs(0))


@functools.cache
def presets_by_arch() -> dict[str, list[str]]:
  archs = {}
  for path in sorted(CONFIGS.glob('*.py')):
    arch = runpy.run_path(str(path))['get_config']().model.arch
    archs.setdefault(arch, []).append(path.stem)
  return archs


@pytest.mark.parametrize('arch', list(registry.FAMILIES))
def test_every_family_has_its_hooks_and_a_preset(arch):
  """Every field is there and agrees with the model the family builds: its stacks are the
  parameter tree's, `shapes` describes each of them, the prompt is one of its sides."""
  assert arch in presets_by_arch()
  entry = family(arch)
  assert entry.arch == arch and set(entry.sides) <= {'encoder', 'decoder'}
  assert entry.objective is None or isinstance(entry.objective, str)
  assert entry.prompt is None or entry.prompt in entry.sides
  assert all(isinstance(hf, HfModel) and callable(hf.check) and callable(hf.config)
             and callable(hf.table) for hf in entry.hf)
  cfg = ModelConfig(arch=arch, **TINY, max_length=16)
  entry.check(cfg)
  model = nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0)))
  params = get_params(model)
  assert set(entry.stacks) == {name for name, node in params.items()
                               if isinstance(node, dict) and 'layers' in node}
  shapes = entry.shapes(cfg, 10, 6)
  assert isinstance(shapes, Shapes) and len(shapes.stacks) == len(entry.stacks)
  assert flops.flops_per_example(cfg, 10, 6) > 0


class ToyDecoder(DecoderOnly):
  """A language model over the targets alone (no prefix), for the registration test."""


def toy_shapes(cfg: ModelConfig, inputs_length: int, targets_length: int) -> Shapes:
  del inputs_length  # a toy: no prefix
  return Shapes((StackShape(cfg, cfg.num_decoder_layers, targets_length, causal=True),),
                logits_length=targets_length)


TOY = Family(arch='toy', model=ToyDecoder, sides=('decoder',), objective='causal_lm',
             stacks=('decoder',), shapes=toy_shapes,
             check=lambda cfg: require_layers(cfg, 'num_decoder_layers'), prompt='decoder',
             hf=())


def test_an_architecture_is_added_with_one_registration(monkeypatch, tmp_path):
  monkeypatch.setattr(registry, 'FAMILIES', dict(registry.FAMILIES))
  registry.register(TOY)
  with pytest.raises(ValueError, match="model.arch='toy' is registered already"):
    registry.register(TOY)
  config = t5config.base_config()
  config.model.update(arch='toy', activation='relu', **TINY)
  cfg = t5config.model_config(config)
  model = build(cfg, nnx.Rngs(0))
  assert isinstance(model, ToyDecoder)
  tokens = jnp.asarray(np.random.RandomState(0).randint(2, 100, (2, 10)), jnp.int32)
  assert model({'decoder_input_tokens': tokens}).shape == (2, 10, 100)
  # flops.py's hand count of a 10-token ReLU decoder layer and lm head, the inputs ignored
  assert flops.flops_per_example(cfg, 99, 10) == 5120 + 1600 + 5120 + 16000
  assert decoding.generate(model, tokens[:, :4], max_decode_length=3).shape == (2, 3)
  with pytest.raises(ValueError, match="model.arch='toy' needs num_decoder_layers > 0"):
    build(ModelConfig(arch='toy', num_decoder_layers=0), nnx.Rngs(0))
  with pytest.raises(ValueError, match='export supports Switch, BART, UMT5, MT5, T5, BERT, '
                                       'RoBERTa, GPT-2 and ELECTRA models; got arch=toy'):
    export_hf({}, cfg, str(tmp_path))
