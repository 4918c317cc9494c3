"""Decoding with a KV cache: greedy, temperature sampling (top-k, top-p) and beam search.

`generate(model, inputs, max_decode_length=..., method=...)` returns (b, max_decode_length)
tokens for a family that generates, where its `Family.prompt` says:
- 'encoder' (encoder-decoder): inputs (b, m) are encoder tokens (EOS included, 0-padded); the
  decoder starts from token 0, T5's start token;
- 'decoder' (decoder-only): inputs (b, n) are prompts, 0-padded on the right; each is moved
  behind the start token 0 and left padding so that all rows end their prompt at the same cache
  position, and the output is each prompt's continuation.

The algorithms do not know the model (T5X's `tokens_to_logits` interface): they take
`step(tokens, index, cache) -> (logits, cache)`, the logits of the first token to choose and a
cache whose leaves are all batch-major, which beam search copies and reorders with `jnp.take`. A
test can hand them a step that recomputes the whole sequence instead of reading a cache.

All run under `jit` with fixed shapes: one `jax.lax.while_loop` of at most max_decode_length
steps, which ends early once every row has emitted EOS (id 1); after its EOS a row holds 0.
"""

import functools
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig
from t5lite.models.registry import family
from t5lite.models.transformer import next_token_logits
from t5lite.token_ids import EOS_ID, PAD_ID

START_ID = 0  # the decoder's first input, as in training (shifted right)
METHODS = ('greedy', 'sample', 'beam')

# step(tokens (b, l), index, cache) -> (logits (b, vocab) of the token after the last, cache)
Step = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def generate(model, inputs: jax.Array, *, max_decode_length: int, method: str = 'greedy',
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, beam_size: int = 4,
             alpha: float = 0.6, rng: jax.Array | None = None) -> jax.Array:
  """(b, max_decode_length) int32 tokens generated from `inputs` (see the module docstring).

  method: 'greedy'; 'sample' at `temperature` from the top_k most likely tokens (0: all) and
  then the top_p nucleus (1.0: all), drawing from `rng`; 'beam' keeps beam_size hypotheses
  scored by log-probability / ((5 + length) / 6)**alpha.
  """
  check_options(model.cfg, inputs.shape[1], max_decode_length=max_decode_length, method=method,
                temperature=temperature, top_k=top_k, top_p=top_p, beam_size=beam_size,
                alpha=alpha)
  rng = jax.random.key(0) if rng is None else rng
  return _generate(model, jnp.asarray(inputs, jnp.int32), rng, temperature, top_k, top_p, alpha,
                   max_decode_length=max_decode_length, method=method, beam_size=beam_size)


def check_options(cfg: ModelConfig, input_length: int, *, max_decode_length: int,
                  method: str = 'greedy', temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, beam_size: int = 4, alpha: float = 0.6) -> None:
  """Raises ValueError with one line for settings `generate` cannot work with."""
  if method not in METHODS:
    raise ValueError(f'decoding method {method!r} is not one of {", ".join(METHODS)}')
  checks = [(max_decode_length >= 1, f'max_decode_length must be >= 1, got {max_decode_length}'),
            (temperature > 0, f'temperature must be > 0, got {temperature}'),
            (top_k >= 0, f'top_k must be >= 0 (0 keeps all tokens), got {top_k}'),
            (0 < top_p <= 1, f'top_p must be in (0, 1], got {top_p}'),
            (beam_size >= 1, f'beam_size must be >= 1, got {beam_size}'),
            (alpha >= 0, f'alpha must be >= 0, got {alpha}')]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)
  prompt = family(cfg.arch).prompt
  if prompt is None:
    raise ValueError(f'decoding needs a decoder; model.arch={cfg.arch!r} has none')
  length = max_decode_length + 1 + (input_length if prompt == 'decoder' else 0)
  if cfg.position == 'learned' and length > cfg.max_length:
    raise ValueError(f'decoding {length} positions (prompt, start token and max_decode_length) '
                     f'exceeds model.max_length={cfg.max_length} of the learned position table')


@functools.partial(nnx.jit, static_argnames=('max_decode_length', 'method', 'beam_size'))
def _generate(model, inputs, rng, temperature, top_k, top_p, alpha, *, max_decode_length, method,
              beam_size):
  """`generate`, compiled once per method, length and beam size (the others are traced)."""
  step = cached_step(model)
  logits, cache, index = prefill(model, inputs, max_decode_length)
  if method == 'greedy':
    return greedy(step, logits, cache, index, max_decode_length)
  if method == 'sample':
    return sample(step, logits, cache, index, max_decode_length, rng=rng,
                  temperature=temperature, top_k=top_k, top_p=top_p)
  return beam_search(step, logits, cache, index, max_decode_length, beam_size=beam_size,
                     alpha=alpha)[0]


def cached_step(model) -> Step:
  """The Step of a model with a `DecodeCache`. Split here and merged inside the step, the model
  is built afresh in the decoding loop's trace, where Flax transforms (scanned layers) may run."""
  graphdef, state = nnx.split(model)

  def step(tokens, index, cache):
    return next_token_logits(nnx.merge(graphdef, state, copy=True), tokens, index, cache)

  return step


def prompt_tokens(inputs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Right-padded decoder-only prompts (b, n) -> start token and prompt behind left padding
  (b, n + 1), and the position of each row's start token (b,).

  E.g. [[5, 6, 7], [8, 0, 0]] -> [[0, 5, 6, 7], [0, 0, 0, 8]] and [0, 2].
  """
  n = inputs.shape[1]
  start = n - jnp.sum(inputs > 0, axis=1, dtype=jnp.int32)  # (b,)
  source = jnp.arange(n + 1)[None, :] - start[:, None] - 1  # (b, n + 1): prompt index, or < 0
  tokens = jnp.take_along_axis(inputs, jnp.maximum(source, 0), axis=1)
  return jnp.where(source >= 0, tokens, START_ID).astype(jnp.int32), start


def prefill(model, inputs: jax.Array, max_decode_length: int) -> tuple[jax.Array, Any, int]:
  """Runs what comes before the first decoded token through the model in one step.

  Returns the logits of the first token to choose (b, vocab), the filled cache and the cache
  position where the first decoded token goes.
  """
  if family(model.cfg.arch).prompt == 'encoder':
    tokens = jnp.full((inputs.shape[0], 1), START_ID, jnp.int32)
    cache = model.init_cache(inputs, 1 + max_decode_length)
  else:
    tokens, start = prompt_tokens(inputs)
    cache = model.init_cache(start, tokens.shape[1] + max_decode_length)
  logits, cache = next_token_logits(model, tokens, 0, cache)
  return logits, cache, tokens.shape[1]


def _token_loop(choose: Callable[[jax.Array, jax.Array], jax.Array], step: Step,
                logits: jax.Array, cache, index: int, max_decode_length: int) -> jax.Array:
  """One token per row and step, `choose(logits, i)`, until every row has emitted EOS."""
  batch_size = logits.shape[0]

  def not_done(state):
    i, _, _, _, finished = state
    return (i < max_decode_length) & ~jnp.all(finished)

  def body(state):
    i, logits, cache, tokens, finished = state
    token = jnp.where(finished, PAD_ID, choose(logits, i).astype(jnp.int32))  # (b,)
    tokens = tokens.at[:, i].set(token)
    logits, cache = step(token[:, None], index + i, cache)
    return i + 1, logits, cache, tokens, finished | (token == EOS_ID)

  state = (0, logits, cache, jnp.zeros((batch_size, max_decode_length), jnp.int32),
           jnp.zeros((batch_size,), bool))
  return jax.lax.while_loop(not_done, body, state)[3]


def greedy(step: Step, logits: jax.Array, cache, index: int, max_decode_length: int
           ) -> jax.Array:
  """The most likely token at every step: (b, max_decode_length) tokens."""
  return _token_loop(lambda logits, i: jnp.argmax(logits, axis=-1), step, logits, cache, index,
                     max_decode_length)


def filter_logits(logits: jax.Array, top_k: int | jax.Array = 0,
                  top_p: float | jax.Array = 1.0) -> jax.Array:
  """logits (b, vocab) with -inf outside the top_k largest (0: keep all) and then outside the
  nucleus (Holtzman et al. 2020): the fewest most likely tokens whose probability reaches top_p.

  E.g. probabilities [0.5, 0.3, 0.15, 0.05] keep 2 tokens with top_k=2, 3 with top_p=0.9.
  top_k and top_p may be traced: one compiled sampler serves every setting.
  """
  descending = -jnp.sort(-logits, axis=-1)  # (b, vocab)
  kth = jnp.take(descending, jnp.maximum(top_k, 1) - 1, axis=-1)[:, None]  # (b, 1)
  kth = jnp.where(top_k > 0, kth, -jnp.inf)
  descending = jnp.where(descending < kth, -jnp.inf, descending)
  probs = jax.nn.softmax(descending, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
  in_nucleus = (before < top_p) | (top_p >= 1.0)
  smallest = jnp.min(jnp.where(in_nucleus, descending, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits < jnp.maximum(kth, smallest), -jnp.inf, logits)


def sample(step: Step, logits: jax.Array, cache, index: int, max_decode_length: int, *,
           rng: jax.Array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
           ) -> jax.Array:
  """Draws each token from softmax(logits / temperature) restricted by `filter_logits`; step i
  uses fold_in(rng, i), so a key gives the same tokens every time."""
  def choose(logits, i):
    logits = filter_logits(logits / temperature, top_k, top_p)
    return jax.random.categorical(jax.random.fold_in(rng, i), logits, axis=-1)

  return _token_loop(choose, step, logits, cache, index, max_decode_length)


def length_penalty(length: jax.Array | int, alpha: float) -> jax.Array:
  """GNMT's ((5 + length) / 6)**alpha (Wu et al. 2016), as in T5X: the divisor of a hypothesis'
  log-probability; alpha 0 ranks by log-probability alone."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0)**alpha


def beam_search(step: Step, logits: jax.Array, cache, index: int, max_decode_length: int, *,
                beam_size: int = 4, alpha: float = 0.6) -> tuple[jax.Array, jax.Array]:
  """The best of beam_size hypotheses per row: tokens (b, max_decode_length) and their scores
  (b,), log-probability / length_penalty(tokens up to and including EOS).

  Each step ranks the 2k best one-token extensions of the k alive hypotheses; those among the
  best k that end (EOS, or the length limit) join the k finished ones, the best k that go on
  stay alive. A row is done once no alive hypothesis can beat its worst finished one: a
  log-probability only falls, and the penalty at most reaches length_penalty(max_decode_length).
  This is Hugging Face's canonical beam search (with alpha 0 its scores are theirs); T5X lets
  any EOS of the 2k finish, so its beam 1 is not greedy. With alpha 0 beam 1 is greedy.
  """
  batch_size, vocab_size = logits.shape
  k = beam_size
  # Every row becomes k rows (b * k, ...); only the first hypothesis is alive at the start.
  logits, cache = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), (logits, cache))
  alive_log_probs = jnp.tile(jnp.asarray([0.0] + [-jnp.inf] * (k - 1)), (batch_size, 1))
  empty = jnp.zeros((batch_size, k, max_decode_length), jnp.int32)
  max_penalty = length_penalty(max_decode_length, alpha)

  def not_done(state):
    i, _, _, _, alive_log_probs, _, finished_scores = state
    unbeatable = finished_scores[:, -1] >= alive_log_probs[:, 0] / max_penalty  # (b,)
    return (i < max_decode_length) & ~jnp.all(unbeatable)

  def body(state):
    i, logits, cache, alive, alive_log_probs, finished, finished_scores = state
    log_probs = jax.nn.log_softmax(logits).reshape(batch_size, k, vocab_size)
    candidates = (alive_log_probs[:, :, None] + log_probs).reshape(batch_size, k * vocab_size)
    top_log_probs, top = jax.lax.top_k(candidates, 2 * k)  # (b, 2k), best first
    beam, token = top // vocab_size, top % vocab_size
    sequences = jnp.take_along_axis(alive, beam[:, :, None], axis=1).at[:, :, i].set(token)
    ends = (token == EOS_ID) | (i == max_decode_length - 1)
    scores = jnp.where(ends & (jnp.arange(2 * k) < k), top_log_probs / length_penalty(i + 1, alpha),
                       -jnp.inf)
    finished_scores, best = jax.lax.top_k(jnp.concatenate([finished_scores, scores], 1), k)
    finished = jnp.take_along_axis(jnp.concatenate([finished, sequences], 1), best[:, :, None], 1)
    alive_log_probs, going_on = jax.lax.top_k(jnp.where(ends, -jnp.inf, top_log_probs), k)
    alive = jnp.take_along_axis(sequences, going_on[:, :, None], axis=1)  # (b, k, length)
    # Cache row of each new hypothesis' parent: row r's beams are rows r * k, ..., r * k + k - 1.
    parents = jnp.arange(batch_size)[:, None] * k + jnp.take_along_axis(beam, going_on, 1)
    cache = jax.tree.map(lambda x: jnp.take(x, parents.reshape(-1), axis=0), cache)
    logits, cache = step(alive[:, :, i].reshape(-1, 1), index + i, cache)
    return i + 1, logits, cache, alive, alive_log_probs, finished, finished_scores

  state = (0, logits, cache, empty, alive_log_probs, empty, jnp.full((batch_size, k), -jnp.inf))
  _, _, _, _, _, finished, finished_scores = jax.lax.while_loop(not_done, body, state)
  return finished[:, 0], finished_scores[:, 0]
