"""Hugging Face export and import of BERT (BertForPreTraining, BertForMaskedLM) and RoBERTa
(RobertaForMaskedLM) with their MLM heads: MLM and next-sentence logits agree with transformers
both ways, and what HF's models cannot be is refused in one line.

transformers runs on CPU in float32 with random weights (no downloads); every tensor is perturbed
away from its initial value (norm scales from 1, biases from 0) so that a wrong mapping shows.
"""

import dataclasses
import json
import os

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, build, get_params, load_params
from t5lite.models.hf_mapping import FEED_FORWARD_PROJ

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

TOLERANCE = 1e-4
VOCAB, LENGTH = 128, 12
BERT_LAYERS = dict(arch='encoder', vocab_size=VOCAB, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                   num_encoder_layers=2, num_decoder_layers=0, activation='gelu', norm='layer',
                   norm_position='post', position='learned', use_bias=True, embed_norm=True,
                   tie_embeddings=True, max_length=16, dropout=0.0)
# kind -> (our config's fields, transformers' class, the Auto class that loads it)
KINDS = {
    'bert': (dict(next_sentence=True, mlm_transform='bert', norm_eps=1e-12),
             'BertForPreTraining', 'AutoModelForPreTraining'),
    'bert_mlm': (dict(mlm_transform='bert', norm_eps=1e-12), 'BertForMaskedLM',
                 'AutoModelForMaskedLM'),
    # the published BERT's layers: the erf GELU (HF's hidden_act='gelu')
    'bert_erf': (dict(next_sentence=True, mlm_transform='bert', norm_eps=1e-12,
                      activation='gelu_erf'), 'BertForPreTraining', 'AutoModelForPreTraining'),
    'roberta': (dict(mlm_transform='roberta', norm_eps=1e-5), 'RobertaForMaskedLM',
                'AutoModelForMaskedLM'),
}


def tiny(kind: str, **overrides) -> ModelConfig:
  return ModelConfig(**{**BERT_LAYERS, **KINDS[kind][0], **overrides})


def perturbed_model(cfg: ModelConfig, seed: int):
  model = build(cfg, nnx.Rngs(seed))
  rng = np.random.RandomState(seed)
  load_params(model, jax.tree.map(
      lambda x: x * (1 + 0.3 * rng.randn(*x.shape)) + 0.1 * rng.randn(*x.shape),
      get_params(model)))
  return model


def padded_batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Tokens (4, 12), right-padded, and token types: segment B from a random point."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, VOCAB, size=(4, LENGTH)).astype(np.int32)
  tokens[np.arange(LENGTH) >= np.array([LENGTH, 9, 5, LENGTH])[:, None]] = 0
  types = (np.arange(LENGTH) >= rng.randint(2, 5, size=(4, 1))).astype(np.int32) * (tokens > 0)
  return tokens, types


def assert_parity(cfg: ModelConfig, model, hf, seed: int) -> None:
  """MLM logits (and with next_sentence, next-sentence logits; token types included) agree on the
  real tokens of a padded batch: HF's padded queries compute what they like."""
  tokens, types = padded_batch(seed)
  batch = {'encoder_input_tokens': jnp.asarray(tokens)}
  inputs = dict(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(tokens > 0, dtype=torch.long))
  if cfg.next_sentence:
    batch['encoder_token_types'] = jnp.asarray(types)
    inputs['token_type_ids'] = torch.tensor(types, dtype=torch.long)
  hidden = model.hidden_states(batch)
  with torch.no_grad():
    out = hf(**inputs)
  theirs = out.prediction_logits if cfg.next_sentence else out.logits
  diff = np.abs(np.asarray(model.lm_logits(hidden)) - theirs.numpy())[tokens > 0].max()
  print(f'{type(hf).__name__} max |MLM logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  if cfg.next_sentence:
    next_diff = np.abs(np.asarray(model.next_sentence_logits(hidden))
                       - out.seq_relationship_logits.numpy()).max()
    print(f'max |next-sentence logit diff| {next_diff:.2e}')
    assert next_diff < TOLERANCE


@pytest.fixture(scope='module', params=sorted(KINDS))
def exported(request, tmp_path_factory):
  """(kind, cfg, our perturbed model, its export folder)."""
  cfg = tiny(request.param)
  model = perturbed_model(cfg, seed=1)
  folder = str(tmp_path_factory.mktemp(f'export_{request.param}'))
  export_hf(get_params(model), cfg, folder)
  return request.param, cfg, model, folder


def test_export_matches_transformers(exported):
  kind, cfg, model, folder = exported
  _, name, auto = KINDS[kind]
  hf, info = getattr(transformers, name).from_pretrained(folder, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys']  # nothing left at random
  assert type(getattr(transformers, auto).from_pretrained(folder)).__name__ == name
  assert_parity(cfg, model, hf.eval(), seed=2)


def test_export_writes_the_head_and_positions_hf_reads(exported):
  """HF's transform LayerNorm carries the tied head's d_model**-0.5; RoBERTa's positions start at
  pad_token_id + 1 = 1, after a zero row."""
  kind, cfg, model, folder = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  prefix, norm = (('roberta', 'lm_head.layer_norm') if kind == 'roberta'
                  else ('bert', 'cls.predictions.transform.LayerNorm'))
  np.testing.assert_allclose(tensors[f'{norm}.weight'],
                             model.mlm_transform.norm.scale.get_value() * cfg.d_model**-0.5)
  positions = tensors[f'{prefix}.embeddings.position_embeddings.weight']
  ours = model.encoder.position_embedding.embedding.get_value()
  offset = int(kind == 'roberta')
  assert config['max_position_embeddings'] == cfg.max_length + offset == len(positions)
  assert config['pad_token_id'] == 0 and not positions[:offset].any()
  np.testing.assert_array_equal(positions[offset:], ours)


def test_export_import_round_trip(exported):
  """Back from the folder: the same config and, bit for bit, the same parameters (d_model 64
  and d_kv 16 make the folded factors powers of 2)."""
  _, cfg, model, folder = exported
  cfg_back, params = import_hf(folder)
  assert cfg_back == cfg
  jax.tree.map(np.testing.assert_array_equal, params, get_params(model))


def test_bert_keeps_the_next_sentence_export_tensors(tmp_path):
  """BertForPreTraining holds every tensor of BertForNextSentencePrediction, which the same
  weights without the MLM transform export as, with the same values."""
  cfg = tiny('bert')
  params = get_params(perturbed_model(cfg, seed=3))
  export_hf(params, cfg, str(tmp_path / 'pre_training'))
  plain = dataclasses.replace(cfg, mlm_transform='none')
  export_hf({k: v for k, v in params.items() if k != 'mlm_transform'}, plain,
            str(tmp_path / 'next_sentence'))
  with open(tmp_path / 'next_sentence' / 'config.json') as f:
    assert json.load(f)['architectures'] == ['BertForNextSentencePrediction']
  ours = safetensors.numpy.load_file(str(tmp_path / 'next_sentence' / 'model.safetensors'))
  theirs = safetensors.numpy.load_file(str(tmp_path / 'pre_training' / 'model.safetensors'))
  assert set(theirs) - set(ours) == {
      'cls.predictions.bias', 'cls.predictions.transform.dense.weight',
      'cls.predictions.transform.dense.bias', 'cls.predictions.transform.LayerNorm.weight',
      'cls.predictions.transform.LayerNorm.bias'}
  for name, value in ours.items():
    np.testing.assert_array_equal(theirs[name], value)


def hf_model(kind: str, seed: int):
  """A random transformers model of `kind` our config can be: pad id 0; every parameter
  perturbed, token type 0 too (imported, it joins the positions)."""
  cfg = tiny(kind)
  fields = dict(vocab_size=VOCAB, hidden_size=cfg.d_model, num_hidden_layers=2,
                num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
                hidden_act=FEED_FORWARD_PROJ[cfg.activation], layer_norm_eps=cfg.norm_eps,
                pad_token_id=0,
                max_position_embeddings=cfg.max_length)
  if kind == 'roberta':
    fields.update(max_position_embeddings=cfg.max_length + 1, type_vocab_size=1)
  config_class = transformers.RobertaConfig if kind == 'roberta' else transformers.BertConfig
  torch.manual_seed(seed)
  model = getattr(transformers, KINDS[kind][1])(config_class(**fields)).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.mul_(1 + 0.3 * torch.randn_like(parameter)).add_(0.1 * torch.randn_like(parameter))
  return model


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_import_from_transformers(kind, tmp_path):
  hf = hf_model(kind, seed=4)
  hf.save_pretrained(tmp_path)
  cfg, params = import_hf(str(tmp_path))
  assert cfg == tiny(kind, dropout=0.1)  # HF's default hidden_dropout_prob
  model = build(cfg, nnx.Rngs(0))
  load_params(model, params)
  assert_parity(cfg, model, hf, seed=5)


@pytest.mark.parametrize('kind, overrides, message', [
    ('roberta', dict(next_sentence=True),
     r'export supports RoBERTa models \(next_sentence=False\); got next_sentence=True'),
    ('bert', dict(norm_position='pre'),
     r"export supports BERT models \(norm_position='post'\); got norm_position='pre'"),
    ('bert_mlm', dict(activation='gated-gelu'), 'BERT export needs an ungated activation'),
    ('roberta', dict(tie_embeddings=False), r'RoBERTa models \(tie_embeddings=True\)'),
    ('bert_mlm', dict(mlm_transform='none'),
     "export of model.arch='encoder' needs Hugging Face's MLM head"),
])
def test_export_refuses_what_hf_cannot_be(kind, overrides, message, tmp_path):
  with pytest.raises(ValueError, match=message):
    export_hf({}, tiny(kind, **overrides), str(tmp_path))
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('kind, config, message', [
    ('bert', dict(hidden_act='silu'),
     "unsupported BERT hidden_act='silu'; expected one of relu, gelu_new, gelu$"),
    ('bert_mlm', dict(position_embedding_type='relative_key'),
     "unsupported BERT position_embedding_type='relative_key'"),
    ('bert', dict(is_decoder=True), 'unsupported BERT is_decoder=True'),
    ('roberta', dict(add_cross_attention=True), 'unsupported RoBERTa add_cross_attention=True'),
    ('roberta', dict(pad_token_id=1), 'unsupported RoBERTa pad_token_id=1: t5lite pads with id 0'),
    ('bert', dict(architectures=['BertForSequenceClassification']),
     r"holds architectures=\['BertForSequenceClassification'\]; import reads BertForPreTraining"
     ' or BertForMaskedLM'),
])
def test_import_refuses_what_t5lite_cannot_be(kind, config, message, tmp_path):
  cfg = tiny(kind)
  abstract = nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0)))
  export_hf(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), get_params(abstract)), cfg,
            str(tmp_path))
  with open(tmp_path / 'config.json') as f:
    written = json.load(f)
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump({**written, **config}, f)
  with pytest.raises(ValueError, match=message):
    import_hf(str(tmp_path))
