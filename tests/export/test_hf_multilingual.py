"""ByT5 (T5ForConditionalGeneration over bytes), MT5ForConditionalGeneration and
UMT5ForConditionalGeneration both ways with transformers: logits within 1e-4, greedy decoding
equal to `generate`, an export imports back as it was; UMT5's bias table of every layer is
transformers'; ByT5's tokenizer is ByT5Tokenizer, written without a vocabulary file, and an
import of a ByT5 folder trains on bytes.
(tests/export/hf_testing.py: how weights are perturbed.)
"""

import json
import os

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite import cli
from t5lite.data import vocabulary
from t5lite.export import export_hf, import_hf
from t5lite.export.tokenizer import export_tokenizer
from t5lite.models import ModelConfig, decoding
from t5lite.models.hf_mapping import T5_TEXT
from t5lite.token_ids import EOS_ID, PAD_ID
from tests.export.hf_testing import (assert_imports_as_exported, our_model, perturb_torch,
                                     perturbed_params)

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

BYTES = vocabulary.load_vocabulary('bytes')
TOLERANCE = 1e-4
DECODE_LENGTH = 10
# d_model 64: UMT5's head factor sqrt(d_model) is 8, exact both ways
SHAPE = dict(d_model=64, d_ff=128, num_heads=4, d_kv=16, dropout=0.0, activation='gated-gelu',
             tie_embeddings=False)
KINDS = {  # t5lite's config, transformers' classes
    'byt5': (dict(vocab_size=384, num_encoder_layers=3, num_decoder_layers=1),
             transformers.T5Config, transformers.T5ForConditionalGeneration),
    'mt5': (dict(vocab_size=256, num_encoder_layers=2, num_decoder_layers=2,
                 hf_model_type='mt5'),
            transformers.MT5Config, transformers.MT5ForConditionalGeneration),
    'umt5': (dict(vocab_size=256, num_encoder_layers=2, num_decoder_layers=2,
                  relative_bias_per_layer=True),
             transformers.UMT5Config, transformers.UMT5ForConditionalGeneration),
}
TEXTS = ['The whale surfaced.', 'Кит всплыл.', 'व्हेल ऊपर आई।', '鲸鱼浮出水面。', '🐋⬆️']


def tiny(kind: str) -> ModelConfig:
  return ModelConfig(**SHAPE, **KINDS[kind][0])


def encoder_inputs(kind: str) -> np.ndarray:
  """Rows of 3 to 20 ids ending in EOS, 0-padded: the texts' bytes for ByT5, random ids else."""
  cfg, rng = tiny(kind), np.random.RandomState(3)
  rows = ([BYTES.encode(text)[:19] for text in TEXTS] if kind == 'byt5' else
          [rng.randint(2, cfg.vocab_size, n).tolist() for n in (19, 11, 5, 2)])
  return np.array([row + [EOS_ID] + [PAD_ID] * (19 - len(row)) for row in rows], np.int32)


def logit_diff(model, hf, kind: str) -> float:
  encoder = encoder_inputs(kind)
  decoder = np.random.RandomState(4).randint(2, tiny(kind).vocab_size, (len(encoder), 7))
  decoder[:, 0] = PAD_ID
  ours = np.asarray(model({'encoder_input_tokens': jnp.asarray(encoder),
                           'decoder_input_tokens': jnp.asarray(decoder, jnp.int32)}))
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(encoder, dtype=torch.long),
                attention_mask=torch.tensor(encoder > 0, dtype=torch.long),
                decoder_input_ids=torch.tensor(decoder, dtype=torch.long)).logits.numpy()
  return float(np.abs(ours - theirs).max())


def assert_same_greedy_decoding(model, hf, kind: str) -> None:
  inputs = encoder_inputs(kind)
  ours = np.asarray(decoding.generate(model, jnp.asarray(inputs), max_decode_length=DECODE_LENGTH))
  tokens = torch.tensor(inputs, dtype=torch.long)
  with torch.no_grad():
    out = hf.generate(tokens, attention_mask=(tokens > 0).long(), max_new_tokens=DECODE_LENGTH,
                      do_sample=False, num_beams=1).numpy()[:, 1:]  # after the start token
  theirs = np.pad(out, ((0, 0), (0, DECODE_LENGTH - out.shape[1])), constant_values=PAD_ID)
  np.testing.assert_array_equal(theirs, ours)


def hf_model(kind: str, seed: int):
  """A random transformers model of `tiny(kind)`'s shape, every tensor perturbed."""
  cfg = tiny(kind)
  config = KINDS[kind][1](
      vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_ff=cfg.d_ff, d_kv=cfg.d_kv,
      num_heads=cfg.num_heads, num_layers=cfg.num_encoder_layers,
      num_decoder_layers=cfg.num_decoder_layers, dropout_rate=0.0, feed_forward_proj='gated-gelu',
      tie_word_embeddings=False, decoder_start_token_id=0)
  torch.manual_seed(seed)
  model = KINDS[kind][2](config).eval()
  model.lm_head.weight = torch.nn.Parameter(  # untied, of logits about 1
      torch.randn(cfg.vocab_size, cfg.d_model) * cfg.d_model**-0.5)
  return perturb_torch(model, seed)


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_import_from_transformers(kind, tmp_path):
  hf = hf_model(kind, seed=5)
  hf.save_pretrained(tmp_path)
  cfg, params = import_hf(str(tmp_path))
  assert cfg == tiny(kind)
  model = our_model(cfg, params)
  diff = logit_diff(model, hf, kind)
  print(f'imported {kind}: max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  assert_same_greedy_decoding(model, hf, kind)


@pytest.fixture(scope='module')
def exported(request, tmp_path_factory):
  """(kind, our perturbed params, their export folder with its tokenizer, transformers' model
  loaded from it)."""
  kind = request.param
  params = perturbed_params(tiny(kind), seed=6)
  folder = tmp_path_factory.mktemp(kind)
  export_hf(params, tiny(kind), str(folder))
  export_tokenizer('bytes' if kind == 'byt5' else 'bundled', str(folder), T5_TEXT)
  hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
  return kind, params, folder, hf


@pytest.mark.parametrize('exported', sorted(KINDS), indirect=True)
def test_export_to_transformers(exported):
  kind, params, folder, hf = exported
  assert type(hf) is KINDS[kind][2]
  model = our_model(tiny(kind), params)
  diff = logit_diff(model, hf, kind)
  print(f'exported {kind}: max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  assert_same_greedy_decoding(model, hf, kind)
  assert_imports_as_exported(str(folder), params, tiny(kind))


@pytest.mark.parametrize('exported', ['umt5'], indirect=True)
def test_umt5_has_transformers_bias_table_in_every_layer(exported):
  """Each layer's own table, bucketed as transformers buckets it, at lengths past max_distance
  (decoder: causal buckets; encoder: both directions)."""
  kind, params, folder, hf = exported
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  model = our_model(tiny(kind), params)
  for stack in ('encoder', 'decoder'):
    for i, block in enumerate(getattr(model, stack).layers):
      name = f'{stack}.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight'
      np.testing.assert_array_equal(tensors[name], block.relative_bias.embedding.get_value())
      with torch.no_grad():
        theirs = getattr(hf, stack).block[i].layer[0].SelfAttention.compute_bias(150, 150).numpy()
      np.testing.assert_allclose(np.asarray(block.relative_bias(150, 150)), theirs, atol=1e-6)
  tables = [tensors[f'encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight']
            for i in range(2)]
  assert not np.array_equal(*tables)  # two tables, not one shared


@pytest.mark.parametrize('exported', sorted(KINDS), indirect=True)
def test_config_json_names_the_model(exported):
  kind, _, folder, _ = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  assert (config['model_type'], config['architectures']) == {
      'byt5': ('t5', ['T5ForConditionalGeneration']),
      'mt5': ('mt5', ['MT5ForConditionalGeneration']),
      'umt5': ('umt5', ['UMT5ForConditionalGeneration'])}[kind]
  assert config['num_layers'] == tiny(kind).num_encoder_layers
  assert config['num_decoder_layers'] == tiny(kind).num_decoder_layers


@pytest.mark.parametrize('exported', ['byt5'], indirect=True)
def test_byt5_export_has_byt5_tokenizer_and_no_vocabulary_file(exported):
  """AutoTokenizer builds ByT5Tokenizer from tokenizer_config.json alone; its ids of text in five
  scripts are ours, then EOS, and it decodes ours back."""
  _, _, folder, _ = exported
  assert sorted(os.listdir(folder)) == ['config.json', 'model.safetensors',
                                        'tokenizer_config.json']
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
  assert type(tokenizer) is transformers.ByT5Tokenizer
  for text in TEXTS + ['a <extra_id_0> b']:
    assert tokenizer(text).input_ids == BYTES.encode(text) + [EOS_ID]
    assert tokenizer.decode(BYTES.encode(text)) == BYTES.decode(BYTES.encode(text)) == text


@pytest.mark.parametrize('exported', ['byt5'], indirect=True)
def test_import_of_a_byt5_folder_trains_on_bytes(exported, tmp_path, capsys):
  """`t5lite import-hf` of a ByT5 folder (ByT5Tokenizer, no vocabulary file) sets
  data.vocabulary='bytes' and ByT5's span corruption, and records the byte vocabulary."""
  _, _, folder, _ = exported
  workdir = tmp_path / 'run'
  assert cli.main(['import-hf', f'--hf={folder}', f'--workdir={workdir}']) == 0
  capsys.readouterr()
  config = json.loads((workdir / 'config.json').read_text())
  assert {key: config['data'][key] for key in ('vocabulary', 'inputs_length', 'targets_length',
                                               'mean_noise_span_length')} == {
      'vocabulary': 'bytes', 'inputs_length': 1024, 'targets_length': 189,
      'mean_noise_span_length': 20.0}
  assert json.loads((workdir / vocabulary.RECORD_FILE).read_text()) == BYTES.identity('bytes')
  assert not (workdir / 'spiece.model').exists()


def test_the_byte_vocabulary_exports_only_for_models_that_read_text_as_t5():
  """ByT5Tokenizer ends a text in EOS: GPT-2's start token or BERT's [CLS] it cannot add."""
  from t5lite.export.tokenizer import BYTE_FILES, files_written
  from t5lite.models.hf_mapping import CAUSAL_TEXT, MASKED_TEXT
  assert files_written('bytes', T5_TEXT) == BYTE_FILES == ('tokenizer_config.json',)
  for text in (CAUSAL_TEXT, MASKED_TEXT):
    with pytest.raises(ValueError, match="^data.vocabulary='bytes' exports as ByT5Tokenizer, "
                       "which reads a text as T5 does"):
      files_written('bytes', text)
