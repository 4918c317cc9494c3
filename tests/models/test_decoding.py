"""Decoding with a KV cache gives the tokens of full recomputation and of Hugging Face's generate.

The reference decoders here run the whole model over every token so far at each step (no cache),
as a numpy loop around one jitted forward pass per shape. Models are tiny and random, perturbed
as in tests/export/test_hf.py so that logits are far from uniform, with EOS made likely enough
that some rows stop early and others run to the length limit.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.export import export_hf
from t5lite.models import ModelConfig, build, decoding, get_params, load_params

BATCH, INPUT_LENGTH, MAX_DECODE_LENGTH = 3, 10, 8
T5_1_1 = dict(arch='encoder_decoder', activation='gated-gelu', tie_embeddings=False)
CASES = {
    't5_1_1': T5_1_1,  # relative position bias
    'vaswani_scanned': dict(arch='encoder_decoder', position='sinusoidal', norm='layer',
                            norm_position='post', use_bias=True, activation='relu',
                            scan_layers=True),
    'gpt_learned': dict(arch='decoder', position='learned', activation='gelu', norm='layer',
                        use_bias=True, tie_embeddings=False, num_decoder_layers=1),
    'rope_scanned': dict(arch='decoder', position='rope', activation='gated-silu',
                         scan_layers=True),
}


def tiny(**overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
                num_decoder_layers=2, max_length=32, dropout=0.0)
  return ModelConfig(**{**fields, **overrides})


def random_model(cfg: ModelConfig, seed: int = 1):
  """Every parameter scaled by a random factor; the EOS output row raised so EOS comes up."""
  model = build(cfg, nnx.Rngs(seed))
  rng = np.random.RandomState(seed)
  params = jax.tree.map(lambda x: np.asarray(x) * (1 + 0.3 * rng.randn(*x.shape)),
                        get_params(model))
  head = params['lm_head']['kernel'] if 'lm_head' in params else params['embed']['embedding'].T
  head[:, decoding.EOS_ID] *= 1.6
  load_params(model, params)
  return model


def random_inputs(seed: int = 2) -> np.ndarray:
  """BATCH rows of 0-padded tokens of lengths INPUT_LENGTH, 6 and 3."""
  inputs = np.random.RandomState(seed).randint(2, 128, (BATCH, INPUT_LENGTH)).astype(np.int32)
  inputs[1, 6:] = 0
  inputs[2, 3:] = 0
  return inputs


@nnx.jit
def forward(model, batch):
  return model(batch)


def reference_features(cfg: ModelConfig, inputs: np.ndarray) -> tuple[dict, int]:
  """The batch of a full forward pass over prompt and MAX_DECODE_LENGTH tokens (decoded tokens
  still 0), and the position of the first decoded token. Decoder-only prompts sit behind left
  padding as `decoding.prompt_tokens` puts them, the padding made a segment of its own."""
  if cfg.arch == 'encoder_decoder':
    return {'encoder_input_tokens': inputs,
            'decoder_input_tokens': np.zeros((len(inputs), 1 + MAX_DECODE_LENGTH), np.int32)}, 1
  prompt, start = map(np.asarray, decoding.prompt_tokens(jnp.asarray(inputs)))
  tokens = np.pad(prompt, ((0, 0), (0, MAX_DECODE_LENGTH)))
  columns = np.arange(tokens.shape[1])[None, :]
  return {'decoder_input_tokens': tokens,
          'decoder_segment_ids': (columns >= start[:, None]).astype(np.int32),
          'decoder_positions': np.maximum(columns - start[:, None], 0).astype(np.int32)
          }, prompt.shape[1]


def full_recompute_greedy(model, inputs: np.ndarray) -> np.ndarray:
  """Greedy decoding without a cache: the whole model runs over all tokens at every step."""
  batch, first = reference_features(model.cfg, inputs)
  tokens = batch['decoder_input_tokens'].copy()
  out = np.zeros((len(inputs), MAX_DECODE_LENGTH), np.int32)
  finished = np.zeros(len(inputs), bool)
  for i in range(MAX_DECODE_LENGTH):
    logits = forward(model, {**batch, 'decoder_input_tokens': tokens})
    out[:, i] = np.where(finished, 0, np.argmax(logits[:, first - 1 + i], axis=-1))
    tokens[:, first + i] = out[:, i]
    finished |= out[:, i] == decoding.EOS_ID
  return out


def teacher_forced_log_probs(model, inputs: np.ndarray, decoded: np.ndarray) -> np.ndarray:
  """log p(next token) over the vocabulary at each decoded position: (b, MAX_DECODE_LENGTH, v)."""
  batch, first = reference_features(model.cfg, inputs)
  batch['decoder_input_tokens'][:, first:] = decoded
  logits = forward(model, batch)[:, first - 1:first - 1 + MAX_DECODE_LENGTH]
  return np.asarray(jax.nn.log_softmax(logits))


def lengths(decoded: np.ndarray) -> np.ndarray:
  """Tokens up to and including the first EOS (all of them without one)."""
  eos = decoded == decoding.EOS_ID
  return np.where(eos.any(1), eos.argmax(1) + 1, decoded.shape[1])


def sequence_scores(model, inputs, decoded, alpha: float) -> np.ndarray:
  """Sum of the tokens' log-probabilities through EOS / length_penalty, from the full model."""
  log_probs = teacher_forced_log_probs(model, inputs, decoded)
  token_log_probs = np.take_along_axis(log_probs, decoded[:, :, None], axis=2)[:, :, 0]
  n = lengths(decoded)
  kept = np.arange(decoded.shape[1])[None, :] < n[:, None]
  return (token_log_probs * kept).sum(1) / np.asarray(decoding.length_penalty(n, alpha))


def run(model, inputs, **options) -> np.ndarray:
  return np.asarray(decoding.generate(model, inputs, max_decode_length=MAX_DECODE_LENGTH,
                                      **options))


@nnx.jit(static_argnames='beam_size')
def beam(model, inputs, *, beam_size, alpha):
  """Beam search's (tokens, scores), which `generate` leaves at tokens."""
  logits, cache, index = decoding.prefill(model, inputs, MAX_DECODE_LENGTH)
  return decoding.beam_search(decoding.cached_step(model), logits, cache, index,
                              MAX_DECODE_LENGTH, beam_size=beam_size, alpha=alpha)


@functools.cache
def decoded(case: str):
  """(random model, padded batch, its cached greedy decoding) of one CASES entry."""
  model, inputs = random_model(tiny(**CASES[case])), random_inputs()
  return model, inputs, run(model, inputs)


@pytest.fixture(scope='module')
def t5():
  return decoded('t5_1_1')


@pytest.mark.parametrize('case', sorted(CASES))
def test_cached_decoding_matches_full_recomputation(case):
  model, inputs, cached = decoded(case)
  cfg = model.cfg
  np.testing.assert_array_equal(cached, full_recompute_greedy(model, inputs))
  assert cached.shape == (BATCH, MAX_DECODE_LENGTH)
  n = lengths(cached)
  assert (cached[np.arange(MAX_DECODE_LENGTH)[None, :] >= n[:, None]] == 0).all()  # 0 after EOS
  if cfg.position == 'learned':  # the most padded prompt alone, unpadded: the same tokens
    alone = inputs[2][inputs[2] > 0][None]
    np.testing.assert_array_equal(full_recompute_greedy(model, alone)[0], cached[2])


def test_greedy_stops_rows_at_eos_independently(t5):
  n = lengths(t5[2])
  assert n.min() < MAX_DECODE_LENGTH and n.max() == MAX_DECODE_LENGTH, n


def test_prompt_tokens_left_pad_behind_the_start_token():
  tokens, start = decoding.prompt_tokens(jnp.asarray([[5, 6, 7], [8, 0, 0]]))
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 7], [0, 0, 0, 8]])
  np.testing.assert_array_equal(start, [0, 2])


def test_beam_of_one_is_greedy(t5):
  model, inputs, greedy = t5
  np.testing.assert_array_equal(run(model, inputs, method='beam', beam_size=1, alpha=0.0), greedy)


@pytest.mark.parametrize('case', ['t5_1_1', 'rope_scanned'])
def test_beam_search_scores_at_least_greedy(case):
  """Beam search copies and reorders cache rows (scanned: layers on axis 1); a wrong parent's
  keys would show as scores that the full model does not give its tokens."""
  model, inputs, greedy = decoded(case)
  tokens, scores = beam(model, inputs, beam_size=4, alpha=0.6)
  greedy_scores = sequence_scores(model, inputs, greedy, alpha=0.6)
  # The scores beam search reports are those of its tokens under the full model.
  np.testing.assert_allclose(scores, sequence_scores(model, inputs, tokens, alpha=0.6),
                             rtol=1e-5, atol=1e-5)
  assert (scores >= greedy_scores - 1e-6).all(), (scores, greedy_scores)
  assert (scores > greedy_scores + 1e-3).any()  # and it finds something better than greedy


def test_top_k_one_sampling_is_greedy(t5):
  model, inputs, greedy = t5
  np.testing.assert_array_equal(
      run(model, inputs, method='sample', top_k=1, temperature=5.0, rng=jax.random.key(3)),
      greedy)


def test_sampling_is_reproducible_and_stays_in_the_top_k(t5):
  model, inputs, greedy = t5
  options = dict(method='sample', top_k=3, temperature=2.0)
  tokens = run(model, inputs, rng=jax.random.key(7), **options)
  np.testing.assert_array_equal(run(model, inputs, rng=jax.random.key(7), **options), tokens)
  assert (run(model, inputs, rng=jax.random.key(8), **options) != tokens).any()
  assert (tokens != greedy).any()
  log_probs = teacher_forced_log_probs(model, inputs, tokens)
  third = np.sort(log_probs, axis=-1)[:, :, -3]
  chosen = np.take_along_axis(log_probs, tokens[:, :, None], axis=2)[:, :, 0]
  decoded = np.arange(MAX_DECODE_LENGTH)[None, :] < lengths(tokens)[:, None]
  assert (chosen >= third)[decoded].all()


def test_filter_logits_top_k_and_top_p():
  logits = jnp.log(jnp.asarray([[0.05, 0.5, 0.15, 0.3]]))
  kept = lambda **kw: np.isfinite(decoding.filter_logits(logits, **kw))[0].tolist()
  assert kept(top_k=2) == [False, True, False, True]
  assert kept(top_p=0.9) == [False, True, True, True]
  assert kept(top_p=0.4) == [False, True, False, False]
  assert kept(top_k=2, top_p=0.9) == [False, True, False, True]
  assert kept() == [True] * 4


@pytest.mark.parametrize('options, message', [
    (dict(method='nucleus'), "method 'nucleus' is not one of greedy, sample, beam"),
    (dict(method='sample', temperature=0.0), 'temperature must be > 0'),
    (dict(method='sample', top_p=1.5), r'top_p must be in \(0, 1\]'),
    (dict(method='beam', beam_size=0), 'beam_size must be >= 1'),
    (dict(max_decode_length=40), 'exceeds model.max_length=32'),
])
def test_bad_decoding_options_fail_with_one_line(options, message):
  model = build(tiny(**CASES['gpt_learned']), nnx.Rngs(0))
  with pytest.raises(ValueError, match=message):
    decoding.generate(model, random_inputs(), **{'max_decode_length': 4, **options})


# Hugging Face's generate on the same weights: an independent implementation of both searches.

@pytest.fixture(scope='module')
def hf(t5, tmp_path_factory):
  transformers = pytest.importorskip('transformers')
  folder = str(tmp_path_factory.mktemp('decoding_hf'))
  export_hf(get_params(t5[0]), t5[0].cfg, folder)
  return transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()


def hf_generate(hf, inputs, **options):
  import torch
  ids = torch.as_tensor(inputs, dtype=torch.long)
  with torch.no_grad():
    out = hf.generate(input_ids=ids, attention_mask=(ids > 0).long(), do_sample=False,
                      max_new_tokens=MAX_DECODE_LENGTH, return_dict_in_generate=True,
                      output_scores=True, **options)
  tokens = out.sequences.numpy()[:, 1:]  # drop the start token; pad to the full length
  tokens = np.pad(tokens, ((0, 0), (0, MAX_DECODE_LENGTH - tokens.shape[1])))
  # HF's beam search fills with EOS, not pad, after EOS (`pad_token_id or eos_token_id`)
  return np.where(np.arange(MAX_DECODE_LENGTH) < lengths(tokens)[:, None], tokens, 0), out


def test_greedy_matches_transformers_generate(t5, hf):
  tokens, _ = hf_generate(hf, t5[1], num_beams=1)
  np.testing.assert_array_equal(t5[2], tokens)


def test_beam_search_matches_transformers_generate(t5, hf):
  """With alpha 0 both rank by log-probability alone; HF's len**length_penalty and GNMT's
  ((5 + len) / 6)**alpha differ for any other value, so only alpha 0 compares."""
  model, inputs, _ = t5
  tokens, scores = beam(model, inputs, beam_size=4, alpha=0.0)
  theirs, out = hf_generate(hf, inputs, num_beams=4, length_penalty=0.0, early_stopping=False)
  np.testing.assert_array_equal(np.asarray(tokens), theirs)
  assert (theirs != t5[2]).any()  # a search that differs from greedy on these inputs
  np.testing.assert_allclose(scores, out.sequences_scores.numpy(), rtol=1e-4, atol=1e-4)

