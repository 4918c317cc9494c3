"""What a Hugging Face user does first works on every family's export, with default arguments:
the folder's AutoTokenizer gives the ids its model read in pretraining, and transformers' pipeline
(fill-mask, text-generation) or, where transformers 5 has none (text2text-generation is gone),
`generate()` and the model's forward pass give what t5lite's model gives for that text.

Models are random (tests/export/hf_testing.py perturbs them) over the bundled vocabulary's ids.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.data import vocabulary
from t5lite.export import export_hf
from t5lite.export.hf import hf_models
from t5lite.export.tokenizer import export_tokenizer
from t5lite.models import decoding
from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID
from tests.export import (test_hf, test_hf_bart, test_hf_bert, test_hf_electra, test_hf_gpt2,
                          test_hf_longt5)
from tests.export.hf_testing import our_model, perturbed_params

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()

VOCAB = vocabulary.load_vocabulary('bundled')
TEXT = 'The committee reported that the <extra_id_0> was late.'  # masked as our MLM masks
PROMPT = 'The committee reported'  # the issue's
FIRST, SECOND = 'The committee met.', 'It reported late.'
TOLERANCE = 1e-4


def exported(cfg, seed: int, folder) -> dict:
  """Exports a perturbed model of `cfg` with the bundled vocabulary as `t5lite export` does;
  returns its params."""
  params = perturbed_params(cfg, seed)
  export_hf(params, cfg, str(folder))
  for hf in hf_models(cfg):
    export_tokenizer('bundled', str(folder / hf.folder), hf.text)
  return params


def plain(ids) -> list[int]:
  """The pieces of `ids` up to EOS that both decoders write as text (HF skips the special
  tokens: pads, unk and sentinels)."""
  ids = list(ids)
  ids = ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids
  return [i for i in ids if UNK_ID < i < VOCAB.num_pieces]


def test_gpt2_text_generation(tmp_path):
  """The issue's call continues the prompt (its max_new_tokens=5 keeps within the tiny model's
  64 positions; the pipeline's default is 256, sampled): the tokenizer gives what t5lite's
  decoding feeds the model, the start token, then the prompt, no EOS. Greedy, the pipeline
  writes the text of t5lite's own greedy continuation after the prompt."""
  cfg = test_hf_gpt2.tiny(vocab_size=VOCAB.vocab_size, max_length=64)
  params = exported(cfg, seed=7, folder=tmp_path)
  prompt = VOCAB.encode(PROMPT)
  tokens, _ = decoding.prompt_tokens(jnp.asarray([prompt]))
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert tokenizer(PROMPT).input_ids == np.asarray(tokens)[0].tolist() == [PAD_ID, *prompt]
  generate = transformers.pipeline('text-generation', model=str(tmp_path))
  torch.manual_seed(0)
  sampled = generate(PROMPT, max_new_tokens=5)[0]['generated_text']
  print(sampled)
  assert sampled.startswith(PROMPT) and len(sampled) > len(PROMPT)
  ours = np.asarray(decoding.generate(our_model(cfg, params), jnp.asarray([prompt]),
                                      max_decode_length=5))[0].tolist()
  assert plain(ours) == ours  # text both write alike
  greedy = generate(PROMPT, max_new_tokens=5, do_sample=False)[0]['generated_text']
  assert greedy == VOCAB.decode(prompt + ours)


@pytest.mark.filterwarnings('ignore:Using the model-agnostic default `max_length`')  # wanted
@pytest.mark.parametrize('kind', ['t5_v1_0', 't5_v1_1', 'bart', 'longt5_local',
                                  'longt5_transient_global'])
def test_encoder_decoder_generate(kind, tmp_path):
  """T5, BART and LongT5: the tokenizer ends the text in EOS, as span corruption's and BART's
  inputs end; `generate()` with the defaults (greedy, 20 new tokens) gives t5lite's greedy
  tokens, which decode to t5lite's text."""
  vocab_size = VOCAB.vocab_size
  if kind.startswith('longt5'):
    cfg = test_hf_longt5.tiny(kind.removeprefix('longt5_'), vocab_size=vocab_size)
  else:
    cfg = (test_hf_bart.tiny(vocab_size=vocab_size) if kind == 'bart' else
           test_hf.tiny(kind.removeprefix('t5_'), vocab_size=vocab_size))
  params = exported(cfg, seed=4, folder=tmp_path)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  inputs = tokenizer(TEXT, return_tensors='pt')
  ids = inputs.input_ids[0].tolist()
  assert ids == VOCAB.encode(TEXT) + [EOS_ID]
  hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    theirs = hf.generate(**inputs)[0, 1:].tolist()  # after the start token
  ours = np.asarray(decoding.generate(our_model(cfg, params), jnp.asarray([ids]),
                                      max_decode_length=len(theirs)))[0].tolist()
  print(kind, theirs, ours)
  assert len(theirs) >= 19 and theirs == ours  # HF's default length: no EOS came
  assert plain(ours)  # some text to compare
  assert tokenizer.decode(theirs, skip_special_tokens=True) == VOCAB.decode(plain(ours))


def masked_lm(kind: str):
  """(config, the folder of its masked LM in the export) of a family with an MLM head."""
  vocab_size = VOCAB.vocab_size
  if kind == 'electra':
    return dataclasses.replace(test_hf_electra.CFG, vocab_size=vocab_size), 'generator'
  return test_hf_bert.tiny(kind, vocab_size=vocab_size), ''


def mlm_logits(cfg, params, ids: list[int]) -> np.ndarray:
  """t5lite's (l, vocab) MLM logits of one text, all of segment A."""
  model = our_model(cfg, params)
  batch = {'encoder_input_tokens': jnp.asarray([ids])}
  if cfg.arch == 'electra':
    return np.asarray(model.generator_logits(batch))[0]
  batch['encoder_token_types'] = jnp.zeros_like(batch['encoder_input_tokens'])
  return np.asarray(model.lm_logits(model.hidden_states(batch)))[0]


@pytest.mark.parametrize('kind', ['bert_mlm', 'bert', 'roberta', 'electra'])
def test_fill_mask(kind, tmp_path):
  """The tokenizer adds what MLM rows hold (nothing; BERT with next-sentence prediction: [CLS]
  and [SEP]) and masks with <extra_id_0>, as our MLM; the pipeline's top 5 (its default) are
  t5lite's most likely tokens at the mask, with t5lite's probabilities."""
  cfg, folder = masked_lm(kind)
  params = exported(cfg, seed=5, folder=tmp_path)
  ids = VOCAB.encode(TEXT)
  if cfg.next_sentence:
    ids = [VOCAB.sentinel_id(1), *ids, VOCAB.sentinel_id(2)]
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / folder))
  assert tokenizer(TEXT).input_ids == ids and tokenizer.mask_token_id == VOCAB.sentinel_id(0)
  fill = transformers.pipeline('fill-mask', model=str(tmp_path / folder))
  results = fill(TEXT)
  mask = ids.index(VOCAB.sentinel_id(0))
  probabilities = jax.nn.softmax(mlm_logits(cfg, params, ids)[mask].astype(np.float64))
  top = np.argsort(-probabilities)[:5]
  print(kind, [(r['token'], r['score']) for r in results], top, probabilities[top])
  assert [r['token'] for r in results] == top.tolist()
  np.testing.assert_allclose([r['score'] for r in results], probabilities[top], rtol=TOLERANCE)
  best = ids[:mask] + [int(top[0])] + ids[mask + 1:]
  assert results[0]['sequence'] == VOCAB.decode(plain(best))


def test_electra_discriminator_reads_the_tokenizer_ids(tmp_path):
  """The discriminator has no pipeline: its replaced-token logits of the tokenizer's ids (the
  text alone, as our MLM rows) are t5lite's."""
  cfg = dataclasses.replace(test_hf_electra.CFG, vocab_size=VOCAB.vocab_size)
  params = exported(cfg, seed=6, folder=tmp_path)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  inputs = tokenizer(TEXT, return_tensors='pt')
  assert inputs.input_ids[0].tolist() == VOCAB.encode(TEXT) and tokenizer.mask_token is None
  hf = transformers.AutoModelForPreTraining.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    theirs = hf(**inputs).logits.numpy()
  ours = np.asarray(our_model(cfg, params)({'encoder_input_tokens': jnp.asarray(
      inputs.input_ids.numpy())}))
  assert np.abs(ours - theirs).max() < TOLERANCE


@pytest.mark.parametrize('mlm_transform', ['bert', 'none'])
def test_bert_sentence_pairs(mlm_transform, tmp_path):
  """BERT with next-sentence prediction (BertForPreTraining; without HF's MLM head,
  BertForNextSentencePrediction): a pair is [CLS] A [SEP] B [SEP], B and its [SEP] of type 1, as
  `mlm_nsp.sentence_pairs` builds them, and HF's next-sentence logits of it are t5lite's."""
  cfg = test_hf_bert.tiny('bert', mlm_transform=mlm_transform, vocab_size=VOCAB.vocab_size)
  params = exported(cfg, seed=8, folder=tmp_path)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  inputs = tokenizer(FIRST, SECOND, return_tensors='pt')
  first, second = VOCAB.encode(FIRST), VOCAB.encode(SECOND)
  cls, sep = VOCAB.sentinel_id(1), VOCAB.sentinel_id(2)
  assert inputs.input_ids[0].tolist() == [cls, *first, sep, *second, sep]
  assert inputs.token_type_ids[0].tolist() == [0] * (len(first) + 2) + [1] * (len(second) + 1)
  hf = transformers.AutoModelForPreTraining.from_pretrained(str(tmp_path)) if (
      mlm_transform == 'bert') else transformers.BertForNextSentencePrediction.from_pretrained(
          str(tmp_path))
  with torch.no_grad():
    out = hf.eval()(**inputs)
  theirs = out.seq_relationship_logits if mlm_transform == 'bert' else out.logits
  model = our_model(cfg, params)
  ours = model.next_sentence_logits(model.hidden_states(
      {'encoder_input_tokens': jnp.asarray(inputs.input_ids.numpy()),
       'encoder_token_types': jnp.asarray(inputs.token_type_ids.numpy())}))
  assert np.abs(np.asarray(ours) - theirs.numpy()).max() < TOLERANCE
