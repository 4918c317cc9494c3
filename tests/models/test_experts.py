"""Sparse experts: routing, capacity and the drop rule against a plain loop; the layer's output
against a per-token reference; scanned groups of layers against unrolled ones; cached decoding.
"""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import ModelConfig, build, get_params, load_params, stack_layers
from t5lite.models import experts
from t5lite.models.experts import SparseMLP
from tests.models import test_decoding


def tiny(**overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=16, d_ff=24, num_heads=2, d_kv=8, num_encoder_layers=4,
                num_decoder_layers=2, num_experts=4, activation='gated-gelu',
                tie_embeddings=False)
  return ModelConfig(**{**fields, **overrides})


def loop_routing(logits: np.ndarray, k: int, slots: int, normalized: bool = False):
  """route() as a loop: each group's first choices in position order, then its second ones...;
  a choice is taken while its expert has a free slot, weighed by its probability (normalized:
  over the token's k choices)."""
  n, g, e = logits.shape
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  dispatch = np.zeros((n, g, e, slots))
  combine = np.zeros((n, g, e, slots))
  for group in range(n):
    filled = np.zeros(e, int)
    ranked = np.argsort(-probs[group], axis=-1, kind='stable')  # ties: the lower id first
    for choice in range(k):
      for token in range(g):
        expert = ranked[token, choice]
        if filled[expert] < slots:
          total = probs[group, token, ranked[token, :k]].sum() if normalized else 1
          dispatch[group, token, expert, filled[expert]] = 1
          combine[group, token, expert, filled[expert]] = probs[group, token, expert] / total
          filled[expert] += 1
  return dispatch, combine


@pytest.mark.parametrize('k, slots', [(1, 1), (1, 3), (2, 2), (3, 5)])
def test_route_matches_a_loop(k, slots):
  logits = np.random.RandomState(k + slots).randn(3, 7, 4).astype(np.float32)
  logits[0, 2] = logits[0, 3]  # a tie between two tokens' choices
  routing = experts.route(jnp.asarray(logits), k, slots)
  dispatch, combine = loop_routing(logits, k, slots)
  np.testing.assert_array_equal(routing.dispatch, dispatch)
  np.testing.assert_allclose(routing.combine, combine, rtol=1e-6)
  sums = routing.sums
  np.testing.assert_array_equal(sums.load, dispatch.sum((0, 1, 3)))
  assert sums.dropped == 3 * 7 * k - dispatch.sum()
  assert sums.tokens == 21
  np.testing.assert_allclose(sums.chosen.sum(-1), 7 * k)


def test_hand_made_routing():
  """One group of 4 tokens, 2 experts, top-1, capacity 1: tokens 1 and 3 are dropped."""
  logits = jnp.log(jnp.array([[[3., 1.], [2., 1.], [1., 4.], [1., 1.]]]))
  routing = experts.route(logits, 1, 1)
  np.testing.assert_array_equal(routing.dispatch[0, :, :, 0], [[1, 0], [0, 0], [0, 1], [0, 0]])
  np.testing.assert_allclose(routing.combine[0, :, :, 0], [[.75, 0], [0, 0], [0, .8], [0, 0]],
                             rtol=1e-6)
  sums = routing.sums
  np.testing.assert_allclose(sums.chosen, [[3, 1]])
  np.testing.assert_allclose(sums.probability, [[.75 + 2 / 3 + .2 + .5, .25 + 1 / 3 + .8 + .5]],
                             rtol=1e-6)
  np.testing.assert_allclose(sums.z_loss, np.sum(np.log([4., 3., 5., 2.])**2), rtol=1e-6)
  assert (sums.dropped, sums.load.tolist()) == (2, [1, 1])
  np.testing.assert_allclose(sums.confidence, .75 + 2 / 3 + .8 + .5, rtol=1e-6)


@pytest.mark.parametrize('rows, length, group_size, expected', [
    (4, 6, 0, (4, 6)), (4, 6, 8, (3, 8)), (4, 6, 6, (4, 6)), (2, 5, 4, (5, 2)), (1, 1, 8, (1, 1)),
])
def test_group_shape(rows, length, group_size, expected):
  assert experts.group_shape(rows, length, group_size) == expected


def test_capacity():
  cfg = tiny(expert_top_k=2)  # 4 experts
  assert experts.capacity(cfg, 10, train=True) == 7  # ceil(1.25 * 2 * 10 / 4)
  assert experts.capacity(cfg, 10, train=False) == 10  # ceil(2 * 2 * 10 / 4), at most 10
  assert experts.capacity(dataclasses.replace(cfg, expert_capacity=3), 10, train=False) == 3
  assert experts.capacity(dataclasses.replace(cfg, expert_capacity=64), 10, train=True) == 10


def test_sparse_layers_are_hugging_faces():
  assert [i for i in range(6) if experts.is_sparse(i, 2)] == [1, 3, 5]
  assert [i for i in range(7) if experts.is_sparse(i, 3)] == [1, 4]
  assert [i for i in range(3) if experts.is_sparse(i, 1)] == [0, 1, 2]
  assert not any(experts.is_sparse(i, 0) for i in range(4))


def expert_mlp(cfg: ModelConfig, params: dict, e: int, x: np.ndarray) -> np.ndarray:
  act = jax.nn.relu if cfg.activation == 'relu' else lambda v: jax.nn.gelu(v, approximate=True)
  if cfg.is_gated:
    h = act(x @ params['wi_0'][e]) * (x @ params['wi_1'][e])
  else:
    h = act(x @ params['wi'][e])
  return np.asarray(h @ params['wo'][e])


def loop_layer(cfg: ModelConfig, params: dict, x: np.ndarray, slots: int | None) -> np.ndarray:
  """The layer token by token: each kept choice's expert output times its probability; slots
  None keeps every choice (dropless)."""
  b, l, d = x.shape
  logits = (x @ params['router']).reshape(b, l, -1)  # a group per row
  dispatch, combine = loop_routing(logits, cfg.expert_top_k, slots or l,
                                   cfg.expert_weights == 'normalized')
  y = np.zeros_like(x)
  for row in range(b):
    for token in range(l):
      for e in range(cfg.num_experts):
        weight = combine[row, token, e].sum()
        if weight:
          y[row, token] += weight * expert_mlp(cfg, params, e, x[row, token])
  return y


@pytest.mark.parametrize('options', [
    dict(expert_top_k=1, activation='relu', eval_capacity_factor=0.5),  # capacity 1: drops
    dict(expert_top_k=2, eval_capacity_factor=0.6),  # capacity 3 of 10 pairs: drops
    dict(expert_top_k=2, expert_dropless=True),
    dict(expert_top_k=2, expert_weights='normalized', eval_capacity_factor=0.3),  # 1 slot
    dict(expert_top_k=2, expert_weights='normalized', expert_dropless=True),
])
def test_layer_matches_a_per_token_loop(options):
  cfg = tiny(**options)
  layer = SparseMLP(cfg, rngs=nnx.Rngs(0))
  params = {name: np.asarray(value) for name, value in nnx.to_pure_dict(
      nnx.state(layer, nnx.Param)).items()}
  x = np.random.RandomState(1).randn(3, 5, cfg.d_model).astype(np.float32)
  y = np.asarray(layer(jnp.asarray(x), deterministic=True, rngs=None))
  slots = None if cfg.expert_dropless else experts.capacity(cfg, 5, train=False)
  np.testing.assert_allclose(y, loop_layer(cfg, params, x, slots), atol=1e-5)
  if slots:
    dispatch, _ = loop_routing((x @ params['router']), cfg.expert_top_k, slots)
    dropped = dispatch.sum((2, 3)) == 0  # tokens none of whose choices fit
    assert dropped.any()
    assert (y[dropped] == 0).all()  # the layer adds nothing: the residual passes them on


def test_router_is_float32_and_jitters_in_training_alone():
  cfg = tiny(dtype='bfloat16', router_jitter=0.1)
  layer = SparseMLP(cfg, rngs=nnx.Rngs(0))
  h = jnp.asarray(np.random.RandomState(0).randn(2, 5, cfg.d_model), jnp.bfloat16)
  assert layer.router_logits(h, None).dtype == jnp.float32
  np.testing.assert_array_equal(layer.router_logits(h, None), layer.router_logits(h, None))
  jittered = [layer.router_logits(h, nnx.Rngs(dropout=i)) for i in (1, 1, 2)]
  np.testing.assert_array_equal(jittered[0], jittered[1])
  assert not np.allclose(jittered[0], jittered[2])
  ratio = np.asarray(jittered[0] / layer.router_logits(h, None))
  assert 0.5 < np.median(ratio) < 1.5 and not np.allclose(ratio, 1)


def random_batch(seed: int = 0) -> dict:
  rng = np.random.RandomState(seed)
  return {'encoder_input_tokens': jnp.asarray(rng.randint(2, 128, (2, 9)), jnp.int32),
          'decoder_input_tokens': jnp.asarray(rng.randint(2, 128, (2, 6)), jnp.int32)}


@nnx.jit
def loss_and_grads(model, batch, key):
  def loss(model):
    logits, stats = nnx.capture(
        lambda m: m(batch, deterministic=False, rngs=nnx.Rngs(dropout=key)),
        experts.RouterStats)(model)
    z = sum(s.z_loss.sum() for s in jax.tree.leaves(
        stats, is_leaf=lambda x: isinstance(x, experts.RouterSums)))
    return jnp.mean(jax.nn.log_softmax(logits)[..., 3]) + 1e-3 * z
  return nnx.value_and_grad(loss)(model)


@pytest.mark.slow  # 82 s on 2 cores
def test_scanned_groups_match_unrolled_layers():
  """Encoder: 4 layers, sparse every other (groups of 2); decoder: 2, all sparse. Same forward,
  router sums and gradients, in training (jitter, train capacity) too."""
  cfg = tiny(decoder_sparse_step=1, train_capacity_factor=0.5, remat_policy='full')
  batch = random_batch()
  unrolled = build(cfg, nnx.Rngs(0))
  scanned = build(dataclasses.replace(cfg, scan_layers=True), nnx.Rngs(1))
  params = get_params(unrolled)
  load_params(scanned, stack_layers(params))
  assert set(get_params(scanned)['encoder']['layers']) == {'block_0', 'block_1'}
  for train in (False, True):
    run = nnx.jit(lambda m, b, train=train: nnx.capture(
        lambda m: m(b, deterministic=not train, rngs=nnx.Rngs(dropout=3)),
        experts.RouterStats)(m))
    (a, a_stats), (b, b_stats) = run(unrolled, batch), run(scanned, batch)
    np.testing.assert_allclose(a, b, atol=1e-5)
    for stack in ('encoder', 'decoder'):
      def total(stats):
        return sum(float(s.dropped.sum()) for s in jax.tree.leaves(
            stats[stack], is_leaf=lambda x: isinstance(x, experts.RouterSums)))
      assert total(a_stats) == total(b_stats)
  loss, grads = loss_and_grads(unrolled, batch, jax.random.key(4))
  scanned_loss, scanned_grads = loss_and_grads(scanned, batch, jax.random.key(4))
  np.testing.assert_allclose(scanned_loss, loss, rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6),
               nnx.to_pure_dict(scanned_grads), stack_layers(nnx.to_pure_dict(grads)))


def test_no_capture_leaves_no_state_on_the_model():
  """Outside nnx.capture (decoding, a user's call) the layers sow nothing: under nnx.jit, whose
  state changes reach the model, the model keeps the state it had."""
  model = build(tiny(num_encoder_layers=2, num_decoder_layers=1, decoder_sparse_step=1,
                     scan_layers=True), nnx.Rngs(0))
  before = jax.tree.structure(nnx.state(model))
  nnx.jit(lambda m, b: m(b))(model, random_batch())
  assert jax.tree.structure(nnx.state(model)) == before


@pytest.mark.slow  # 27 s each on 2 cores
@pytest.mark.parametrize('scan', [False, True])
def test_cached_decoding_matches_full_recomputation(scan):
  """The default evaluation capacity of top-2 of 4 experts takes every token: one token a step
  and the full forward pass then route alike."""
  cfg = test_decoding.tiny(arch='encoder_decoder', num_experts=4, expert_top_k=2,
                           activation='relu', scan_layers=scan)
  model, inputs = test_decoding.random_model(cfg), test_decoding.random_inputs()
  np.testing.assert_array_equal(test_decoding.run(model, inputs),
                                test_decoding.full_recompute_greedy(model, inputs))


def test_bad_expert_settings_fail_with_one_line():
  for options, message in [
      (dict(expert_top_k=5), 'expert_top_k=5 must be between 1 and model.num_experts=4'),
      (dict(train_capacity_factor=0.0), 'train_capacity_factor must be positive'),
      (dict(eval_capacity_factor=-1.0), 'eval_capacity_factor must be positive'),
      (dict(router_jitter=1.0), 'router_jitter must be in [0, 1)'),
  ]:
    with pytest.raises(ValueError, match=message.replace('[', r'\[').replace(')', r'\)')):
      tiny(**options)
  for options, message in [
      (dict(encoder_sparse_step=0, decoder_sparse_step=0), 'no layer is sparse'),
      (dict(encoder_sparse_step=3, scan_layers=True), 'not a multiple'),
      (dict(arch='decoder'), "model.arch='decoder' has no sparse experts"),
  ]:
    with pytest.raises(ValueError, match=message):
      build(tiny(**options), nnx.Rngs(0))
