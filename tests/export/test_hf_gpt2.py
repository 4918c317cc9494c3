"""Hugging Face export/import of decoder-only models as GPT-2 (GPT2LMHeadModel): logits and greedy
decoding agree with transformers, and an import gives back the params that were exported.
(tests/export/hf_testing.py: how weights are perturbed).
"""

import json
import os

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from t5lite.export import export_hf, import_hf
from t5lite.models import ModelConfig, decoding, hf_mapping
from t5lite.token_ids import EOS_ID, PAD_ID
from tests.export.hf_testing import (assert_imports_as_exported, assert_same_params, our_model,
                                     perturb_torch, perturbed_params, swap_with_eos)

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

# d_model 64 and d_kv 16 make the factors the export folds in (d_model**-0.5 into ln_f, sqrt(d_kv)
# into the queries) powers of two, so that an import gives back the exported params bit for bit.
GPT2 = dict(arch='decoder', vocab_size=256, d_model=64, d_ff=128, num_heads=4, d_kv=16,
            num_encoder_layers=0, num_decoder_layers=2, activation='gelu', norm='layer',
            norm_position='pre', norm_eps=1e-5, position='learned', max_length=32, use_bias=True,
            tie_embeddings=True, dropout=0.0)
TOLERANCE = 1e-4
LENGTH, DECODE_LENGTH = 12, 12


def tiny(**overrides) -> ModelConfig:
  return ModelConfig(**{**GPT2, **overrides})


def prompts() -> np.ndarray:
  """Right-padded prompts (4, 6) of 6, 4, 1 and 0 tokens."""
  tokens = np.random.RandomState(3).randint(2, GPT2['vocab_size'], (4, 6))
  tokens[np.arange(6) >= np.array([6, 4, 1, 0])[:, None]] = 0
  return tokens.astype(np.int32)


def greedy(model, inputs: np.ndarray) -> np.ndarray:
  return np.asarray(decoding.generate(model, jnp.asarray(inputs), max_decode_length=DECODE_LENGTH))


def load_gpt2(folder: str):
  return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def right_padded(seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Decoder inputs (3, LENGTH) that start with the start token 0, two rows right-padded, and
  their lengths."""
  rng = np.random.RandomState(seed)
  lengths = np.array([LENGTH, 8, 5])
  tokens = rng.randint(2, GPT2['vocab_size'], (3, LENGTH))
  tokens[:, 0] = 0
  tokens[np.arange(LENGTH) >= lengths[:, None]] = 0
  return tokens.astype(np.int32), lengths


def logit_diff(model, hf, seed: int) -> float:
  """Max |logit difference| over the real tokens of a right-padded batch (our decoder masks
  causally alone: its pads hide nothing from real tokens; HF is given the attention mask)."""
  tokens, lengths = right_padded(seed)
  valid = np.arange(LENGTH) < lengths[:, None]
  ours = np.asarray(model({'decoder_input_tokens': jnp.asarray(tokens)}))
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(valid, dtype=torch.long)).logits.numpy()
  return float(np.abs(ours - theirs)[valid].max())


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """(our unrolled params, their export folder, transformers' model loaded from it).

  EOS's embedding row trades places with that of the token our greedy decoding of `prompts()`
  gives 5th in row 0: the same model but for two tokens' names, whose decoding now ends early.
  """
  params = perturbed_params(tiny(), seed=1)
  params = swap_with_eos(params, greedy(our_model(tiny(), params), prompts())[0, 4])
  folder = str(tmp_path_factory.mktemp('gpt2'))
  export_hf(params, tiny(), folder)
  return params, folder, load_gpt2(folder)


def test_export_matches_transformers(exported):
  params, folder, hf = exported
  assert type(hf) is transformers.GPT2LMHeadModel
  diff = logit_diff(our_model(tiny(), params), hf, seed=2)
  print(f'GPT-2 max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  names = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors')).keys()
  assert set(hf.state_dict()) - names == {'lm_head.weight'}  # tied; nothing left at random


def test_export_writes_gpt2_config_and_tensors(exported):
  params, folder, _ = exported
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  assert (config['model_type'], config['activation_function'], config['n_inner']) == (
      'gpt2', 'gelu_new', 128)
  assert (config['bos_token_id'], config['eos_token_id'], config['tie_word_embeddings']) == (
      0, 1, True)
  assert 'pad_token_id' not in config  # HF would mask the start token 0 as padding
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  layer = params['decoder']['layers'][1]['self_attention']
  c_attn = tensors['transformer.h.1.attn.c_attn.weight']  # Conv1D (in, out): q, k, v
  assert c_attn.shape == (64, 3 * 64)
  np.testing.assert_array_equal(c_attn[:, :64], layer['q']['kernel'].reshape(64, 64) * 4)
  np.testing.assert_array_equal(c_attn[:, 128:], layer['v']['kernel'].reshape(64, 64))
  np.testing.assert_array_equal(tensors['transformer.h.1.attn.c_attn.bias'][64:128],
                                layer['k']['bias'].reshape(-1))
  np.testing.assert_array_equal(tensors['transformer.ln_f.bias'],
                                params['decoder']['final_norm']['bias'] / 8)


def their_greedy(hf, tokens: np.ndarray | None, **kwargs) -> np.ndarray:
  """HF's greedy continuations (b, DECODE_LENGTH) of its input tokens (None: of bos_token_id
  alone), 0 after HF stops (once every row has ended)."""
  with torch.no_grad():
    out = hf.generate(None if tokens is None else torch.tensor(tokens, dtype=torch.long),
                      max_new_tokens=DECODE_LENGTH, do_sample=False, **kwargs).numpy()
  out = out[:, 1 if tokens is None else tokens.shape[1]:]
  return np.pad(out, ((0, 0), (0, DECODE_LENGTH - out.shape[1])), constant_values=PAD_ID)


@pytest.mark.parametrize('scan_layers', [False, True])
def test_greedy_decoding_matches_transformers(exported, scan_layers, tmp_path):
  """Our prompts go to HF as our decoding runs them: behind the start token and left padding,
  which the attention mask hides. A scanned model exports through unstack_layers."""
  params, _, _ = exported
  cfg = tiny(scan_layers=scan_layers)
  model = our_model(cfg, params)
  export_hf(nnx.state(model, nnx.Param), cfg, str(tmp_path))
  ours = greedy(model, prompts())
  assert (ours[0, 4:] == [EOS_ID] + [PAD_ID] * (DECODE_LENGTH - 5)).all()  # see `exported`
  tokens, start = map(np.asarray, decoding.prompt_tokens(jnp.asarray(prompts())))
  mask = np.arange(tokens.shape[1]) >= start[:, None]
  theirs = their_greedy(load_gpt2(str(tmp_path)), tokens,
                        attention_mask=torch.tensor(mask, dtype=torch.long), pad_token_id=PAD_ID)
  np.testing.assert_array_equal(theirs, ours)


def test_transformers_generates_without_a_mask_or_a_prompt(exported):
  """config.json names no pad_token_id, so HF masks nothing itself: one prompt behind the start
  token needs no attention mask, and generate() without inputs starts from bos_token_id."""
  params, _, hf = exported
  model = our_model(tiny(), params)
  prompt = prompts()[:1]
  np.testing.assert_array_equal(their_greedy(hf, np.pad(prompt, ((0, 0), (1, 0)))),
                                greedy(model, prompt))
  np.testing.assert_array_equal(their_greedy(hf, None), greedy(model, np.zeros((1, 0), np.int32)))


def test_import_gives_back_the_exported_params(exported):
  params, folder, _ = exported
  imported = assert_imports_as_exported(folder, params, tiny())
  assert imported['decoder']['layers']['mlp']['wi']['kernel'].shape == (2, 64, 128)


def test_import_from_transformers(tmp_path):
  """A GPT2LMHeadModel saved by transformers imports; so does its GPT2Model, whose tensors lack
  the 'transformer.' prefix (OpenAI's checkpoint on the Hub)."""
  config = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
  hf = perturb_torch(transformers.GPT2LMHeadModel(config).eval(), seed=4)
  hf.save_pretrained(tmp_path / 'lm')
  hf.transformer.save_pretrained(tmp_path / 'base')
  cfg, params = import_hf(str(tmp_path / 'lm'))
  assert cfg == tiny(d_ff=256)  # n_inner None: 4 * n_embd
  diff = logit_diff(our_model(cfg, params), hf, seed=5)
  print(f'imported GPT-2 max |logit diff| {diff:.2e}')
  assert diff < TOLERANCE
  assert_same_params(import_hf(str(tmp_path / 'base'))[1], params)


@pytest.mark.parametrize('overrides, message', [
    (dict(norm_position='post'), r"GPT-2 models \(norm_position='pre'\); got norm_position='post'"),
    (dict(position='t5_relative'), "got position='t5_relative'"),
    (dict(tie_embeddings=False), 'got tie_embeddings=False'),
    (dict(norm='rms'), "got norm='rms'"),
    (dict(use_bias=False), 'got use_bias=False'),
    (dict(activation='gated-gelu'), r'GPT-2 export needs an ungated activation'),
    (dict(d_kv=8), r'num_heads \* d_kv == d_model \(got gelu, 4 \* 8 vs 64\)'),
])
def test_export_refuses_what_gpt2_cannot_be(overrides, message, tmp_path):
  with pytest.raises(ValueError, match=message):
    export_hf({}, tiny(**overrides), str(tmp_path))
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('change, message', [
    (dict(scale_attn_by_inverse_layer_idx=True),
     'unsupported GPT-2 scale_attn_by_inverse_layer_idx=True'),
    (dict(activation_function='silu'), "unsupported GPT-2 activation_function='silu'"),
    (dict(add_cross_attention=True), 'unsupported GPT-2 add_cross_attention=True'),
    (dict(tie_word_embeddings=False), 'unsupported GPT-2 tie_word_embeddings=False'),
    (dict(n_embd=None), 'GPT-2 config.json misses n_embd'),
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


def test_text_generation_pipeline_writes_what_t5lite_infer_writes(tmp_path, capsys):
  """A GPT-2 folder with the bundled vocabulary as its tokenizer: `pipeline('text-generation')`
  on it continues each text, greedy, as `t5lite infer` does on the workdir `t5lite import-hf`
  makes of it. The tokenizer puts our start token before each prompt by itself. (Random weights
  whose continuations hold no sentinel: the pipeline drops the text of special tokens, infer shows
  them.)"""
  from t5lite import cli  # pylint: disable=import-outside-toplevel
  from t5lite.export import tokenizer  # pylint: disable=import-outside-toplevel
  cfg = tiny(vocab_size=8192, max_length=64)
  folder, workdir = tmp_path / 'hf', tmp_path / 'run'
  export_hf(perturbed_params(cfg, seed=8), cfg, str(folder))
  tokenizer.export_tokenizer('bundled', str(folder), hf_mapping.CAUSAL_TEXT)
  assert cli.main(['import-hf', f'--hf={folder}', f'--workdir={workdir}']) == 0
  data = json.loads((workdir / 'config.json').read_text())['data']  # a GPT-2's pretraining
  assert (data['objective'], data['inputs_length'], data['targets_length']) == ('causal_lm', 0, 64)
  texts = ['It was the best of times,', 'Call me Ishmael.', 'The']
  capsys.readouterr()
  assert cli.main(['infer', f'--workdir={workdir}', *[f'--input={t}' for t in texts],
                   '--max_decode_length=8']) == 0
  ours = capsys.readouterr().out.splitlines()
  generate = transformers.pipeline('text-generation', model=str(folder), device='cpu')
  theirs = [generate(text, max_new_tokens=8, do_sample=False)[0]['generated_text']
            for text in texts]
  print(ours, theirs)
  assert len(set(ours)) == 3 and all(full.startswith(text) for full, text in zip(theirs, texts))
  assert not any('<extra_id_' in text for text in ours)
  assert [full[len(text):].lstrip(' ') for full, text in zip(theirs, texts)] == ours
