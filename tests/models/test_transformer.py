"""The three stacks: shapes, masks (padding, packing, causality), kernels, scan, remat, dropout.

Compile time dominates on a 2-core CPU, so unrolled models run eagerly on batches of one shape
(the per-op compilations are shared by every config), and scanned models and gradients run under
`nnx.jit`, each compiled once.
"""

import dataclasses

from flax import nnx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import (Features, ModelConfig, build, get_params, load_params, stack_layers,
                           unstack_layers)
from t5lite.models.attention import (attention_mask, dot_product_attention, kernel_for,
                                     padded_rows)

ARCHS = ('encoder_decoder', 'encoder', 'decoder')
ENCODER_LENGTH, DECODER_LENGTH = 12, 8  # every batch here has 2 rows of these lengths


def tiny(**overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
                num_decoder_layers=2, max_length=32)
  return ModelConfig(**{**fields, **overrides})


def tokens(rng, *shape) -> np.ndarray:
  return rng.randint(2, 128, shape).astype(np.int32)


def batch_of(encoder, decoder, **extra) -> dict:
  features = {'encoder_input_tokens': encoder, 'decoder_input_tokens': decoder, **extra}
  return {k: jnp.asarray(v, jnp.int32) for k, v in features.items()}


def random_batch(seed: int) -> dict:
  rng = np.random.RandomState(seed)
  return batch_of(tokens(rng, 2, ENCODER_LENGTH), tokens(rng, 2, DECODER_LENGTH))


@nnx.jit
def jit_forward_train(model, batch, rngs):
  return model(batch, deterministic=False, rngs=rngs)


@pytest.mark.parametrize('arch, options', [
    ('encoder_decoder', {}),
    ('encoder_decoder', dict(position='rope', activation='gated-silu')),
    ('encoder_decoder', dict(position='sinusoidal', norm='layer', norm_position='post',
                             use_bias=True)),
    ('encoder', dict(position='learned', activation='gelu', norm='layer', norm_position='post',
                     use_bias=True)),
    ('decoder', dict(position='learned', activation='gelu', tie_embeddings=False)),
    ('decoder', dict(position='rope', activation='gated-gelu', dtype='bfloat16')),
])
def test_logits_shape_and_dtype(arch, options):
  cfg = tiny(arch=arch, **options)
  model = build(cfg, nnx.Rngs(0))
  batch = random_batch(0)
  logits = model(batch)
  length = ENCODER_LENGTH if arch == 'encoder' else DECODER_LENGTH
  assert logits.shape == (2, length, cfg.vocab_size)
  assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(get_params(model)))


def equations(jaxpr):
  """Every equation of a jaxpr, including those of nested jaxprs (pjit, scan, remat)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          yield from equations(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from equations(sub)


@pytest.mark.parametrize('position', ['t5_relative', 'sinusoidal', 'learned', 'rope'])
def test_bfloat16_compute_keeps_the_residual_stream_in_bfloat16(position):
  """No float32 (b, l, d_model) sum anywhere (norms and softmax may use float32 inside)."""
  model = nnx.eval_shape(lambda: build(tiny(position=position, dtype='bfloat16'), nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  batch = random_batch(0)
  jaxpr = jax.make_jaxpr(lambda state: nnx.merge(graphdef, state)(batch))(state)
  assert jaxpr.out_avals[0].dtype == jnp.float32  # logits
  stream_shapes = {(2, ENCODER_LENGTH, 32), (2, DECODER_LENGTH, 32)}
  sums = [v.aval for e in equations(jaxpr.jaxpr) if e.primitive.name == 'add' for v in e.outvars]
  assert {a.dtype for a in sums if a.shape in stream_shapes} == {jnp.dtype(jnp.bfloat16)}


def pack(rng, lengths):
  """Two examples of (encoder, decoder) lengths packed in row 0 (row 1 repeats it), and alone."""
  examples = [(tokens(rng, e), tokens(rng, d)) for e, d in lengths]
  packed, alone = {}, []
  for side, index, total in (('encoder', 0, ENCODER_LENGTH), ('decoder', 1, DECODER_LENGTH)):
    parts = [example[index] for example in examples]
    pad = (0, total - sum(map(len, parts)))
    packed[f'{side}_input_tokens'] = np.pad(np.concatenate(parts), pad)
    packed[f'{side}_segment_ids'] = np.pad(np.repeat([1, 2], list(map(len, parts))), pad)
    packed[f'{side}_positions'] = np.pad(np.concatenate([np.arange(len(p)) for p in parts]), pad)
    alone.append(np.stack([np.pad(p, (0, total - len(p))) for p in parts]))
  packed = {k: jnp.asarray(np.stack([v, v]), jnp.int32) for k, v in packed.items()}
  return packed, batch_of(*alone)


@pytest.mark.parametrize('arch, position', [
    ('encoder_decoder', 't5_relative'), ('decoder', 't5_relative'), ('encoder', 't5_relative'),
    ('encoder_decoder', 'rope'), ('decoder', 'learned'), ('encoder', 'sinusoidal'),
])
def test_packed_segments_match_separate_runs(arch, position):
  """Each packed example gets the logits it gets alone, padded, without segment features."""
  model = build(tiny(arch=arch, position=position), nnx.Rngs(1))
  lengths = ((7, 3), (5, 4))  # (encoder, decoder) tokens of the two examples
  packed, alone = pack(np.random.RandomState(1), lengths)
  packed_logits, alone_logits = model(packed), model(alone)
  side = 0 if arch == 'encoder' else 1
  first, second = (length[side] for length in lengths)
  np.testing.assert_allclose(packed_logits[0, :first], alone_logits[0, :first], atol=2e-5)
  np.testing.assert_allclose(packed_logits[0, first:first + second], alone_logits[1, :second],
                             atol=2e-5)


@pytest.mark.parametrize('arch', ARCHS)
def test_padding_does_not_reach_real_positions(arch):
  """Changing what a pad (token 0) embeds to changes nothing at the real positions."""
  model = build(tiny(arch=arch), nnx.Rngs(2))
  batch = random_batch(2)
  side = 'decoder' if arch == 'decoder' else 'encoder'
  length = DECODER_LENGTH if side == 'decoder' else ENCODER_LENGTH
  real = np.arange(length) < np.array([[length - 3], [length - 5]])  # right padding, per row
  batch[f'{side}_input_tokens'] = jnp.where(real, batch[f'{side}_input_tokens'], 0)
  before = model(batch)
  params = get_params(model)
  embedding = params['embed']['embedding']
  params['embed']['embedding'] = embedding.at[0].set(np.random.RandomState(2).randn(32) * 10)
  load_params(model, params)
  after = model(batch)
  if arch != 'encoder_decoder':  # logits of the padded side itself: real positions only
    before, after = before[real], after[real]
  np.testing.assert_allclose(after[..., 1:], before[..., 1:], atol=2e-5)  # id 0's logit moves


@pytest.mark.parametrize('arch', ['encoder_decoder', 'decoder'])
def test_decoder_is_causal(arch):
  model = build(tiny(arch=arch), nnx.Rngs(3))
  batch = random_batch(3)
  changed = dict(batch, decoder_input_tokens=batch['decoder_input_tokens'].at[:, 4:].set(7))
  before, after = model(batch), model(changed)
  np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-6)
  assert not np.allclose(before[:, 4:], after[:, 4:])


def test_prefix_lm_attends_bidirectionally_over_its_prefix():
  """seqio's decoder_causal_attention, 1 on the first 4 positions: those see each other whatever
  the order; later positions stay causal; all 0 is the causal model."""
  model = build(tiny(arch='decoder'), nnx.Rngs(3))
  batch = random_batch(3)
  prefix = dict(batch, decoder_causal_attention=jnp.asarray([[1] * 4 + [0] * 4] * 2, jnp.int32))
  tokens = batch['decoder_input_tokens']
  before = model(prefix)
  in_prefix = model(dict(prefix, decoder_input_tokens=tokens.at[:, 3].set(1)))
  assert not np.allclose(before[:, :3], in_prefix[:, :3], atol=1e-3)  # seen from before it
  after_prefix = model(dict(prefix, decoder_input_tokens=tokens.at[:, 5].set(1)))
  np.testing.assert_allclose(before[:, :5], after_prefix[:, :5], atol=1e-6)
  causal = dict(batch, decoder_causal_attention=jnp.zeros_like(tokens))
  np.testing.assert_allclose(model(causal), model(batch), atol=1e-6)
  mask = attention_mask(3, causal=True, prefix=jnp.asarray([[1, 1, 0]]))
  assert mask[0, 0].tolist() == [[True, True, False], [True, True, False], [True, True, True]]


def test_encode_and_decoder_logits_compose_to_call():
  model = build(tiny(), nnx.Rngs(0))
  batch = random_batch(0)
  encoder = Features.from_batch(batch, 'encoder')
  logits = model.decoder_logits(model.encode(encoder), encoder,
                                Features.from_batch(batch, 'decoder'))
  np.testing.assert_allclose(logits, model(batch), atol=1e-6)


def test_xla_and_einsum_attention_agree():
  rng = np.random.RandomState(5)
  q, k, v = (jnp.asarray(rng.randn(2, ENCODER_LENGTH, 4, 8), jnp.float32) for _ in range(3))
  bias = jnp.asarray(rng.randn(1, 4, ENCODER_LENGTH, ENCODER_LENGTH), jnp.float32)
  segments = jnp.asarray([[1] * 5 + [2] * 4 + [0] * 3, [1] * 12])
  mask = attention_mask(ENCODER_LENGTH, segments > 0, query_segment_ids=segments,
                        key_segment_ids=segments, causal=True)
  outputs = [dot_product_attention(q, k, v, mask=mask, bias=bias, implementation=impl)
             for impl in ('xla', 'einsum')]
  np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-6)


@pytest.mark.parametrize('case', ['encoder', 'decoder', 'cross'])
@pytest.mark.parametrize('implementation', ['xla', 'einsum'])
def test_padded_rows_attend_as_their_mask_does(case, implementation):
  """Lengths and a causal flag (rows of one example, cuDNN's fast path) give what the (b, 1, q,
  k) mask gives, forward and every gradient, the bias at (1, heads, q, k)."""
  rng = np.random.RandomState(11)
  q_len = DECODER_LENGTH if case != 'encoder' else ENCODER_LENGTH
  k_len = DECODER_LENGTH if case == 'decoder' else ENCODER_LENGTH
  q = jnp.asarray(rng.randn(3, q_len, 4, 8), jnp.float32)
  k, v = (jnp.asarray(rng.randn(3, k_len, 4, 8), jnp.float32) for _ in range(2))
  bias = jnp.asarray(rng.randn(1, 4, q_len, k_len), jnp.float32)
  key_valid = None if case == 'decoder' else jnp.arange(k_len) < jnp.asarray([[k_len], [5], [1]])
  causal = case == 'decoder'
  rows = padded_rows(q_len, key_valid, causal=causal)
  if key_valid is not None:
    np.testing.assert_array_equal(rows.key_lengths, [k_len, 5, 1])

  def loss(mask, impl):
    return lambda *args: jnp.sum(dot_product_attention(*args[:3], mask=mask, bias=args[3],
                                                       implementation=impl) ** 2)
  got = jax.value_and_grad(loss(rows, implementation), argnums=(0, 1, 2, 3))(q, k, v, bias)
  want = jax.value_and_grad(loss(attention_mask(q_len, key_valid, causal=causal), 'einsum'),
                            argnums=(0, 1, 2, 3))(q, k, v, bias)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-5), got, want)


def test_padded_rows_are_for_one_example_a_row():
  segments = jnp.ones((2, ENCODER_LENGTH), jnp.int32)
  with pytest.raises(ValueError, match='one example each'):
    padded_rows(ENCODER_LENGTH, segments > 0, query_segment_ids=segments,
                key_segment_ids=segments)


@pytest.mark.parametrize('arch', ARCHS)
def test_rows_without_segment_ids_train_as_with_them(arch):
  """A batch of one example a row (trailing padding) without segment ids and positions (the
  lengths path) gives the loss and gradients it gives with them (the mask path), scanned with
  remat as a pretraining run is."""
  model = build(tiny(arch=arch, scan_layers=True, remat_policy='save_dots'), nnx.Rngs(12))
  rng = np.random.RandomState(12)
  lengths = {'encoder': [[ENCODER_LENGTH], [7]], 'decoder': [[DECODER_LENGTH], [5]]}
  plain, packed = {}, {}
  for side, length in ((s, ENCODER_LENGTH if s == 'encoder' else DECODER_LENGTH)
                       for s in ('encoder', 'decoder')):
    real = np.arange(length) < np.asarray(lengths[side])
    plain[f'{side}_input_tokens'] = np.where(real, tokens(rng, 2, length), 0)
    packed.update({f'{side}_input_tokens': plain[f'{side}_input_tokens'],
                   f'{side}_segment_ids': real.astype(np.int32),
                   f'{side}_positions': np.where(real, np.arange(length), 0)})
  plain, packed = ({k: jnp.asarray(v, jnp.int32) for k, v in b.items()} for b in (plain, packed))
  side = 'encoder' if arch == 'encoder' else 'decoder'
  real = np.asarray(packed[f'{side}_segment_ids'] > 0)
  weights = jnp.asarray(np.random.RandomState(7).randn(model.cfg.vocab_size), jnp.float32)

  @nnx.jit
  def loss_and_grads(model, batch):  # real positions only: padding's logits differ, unread
    return nnx.value_and_grad(lambda m: jnp.sum(jnp.where(real[..., None], m(batch), 0) * weights))(
        model)
  (loss, grads), (loss_packed, grads_packed) = (loss_and_grads(model, b) for b in (plain, packed))
  np.testing.assert_allclose(loss, loss_packed, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               grads.to_pure_dict(), grads_packed.to_pure_dict())


def test_auto_attention_is_cudnn_on_nvidia_gpus_in_16_bits_only():
  assert kernel_for('auto', 'bfloat16', 'gpu', 'cuda 13.0') == 'cudnn'
  assert kernel_for('auto', 'float16', 'gpu') == 'cudnn'
  assert kernel_for('auto', 'float32', 'gpu') == 'xla'  # cuDNN's fused kernel takes no float32
  assert kernel_for('auto', 'bfloat16', 'gpu', 'rocm 6.2') == 'xla'
  assert kernel_for('auto', 'bfloat16', 'tpu') == kernel_for('auto', 'bfloat16', 'cpu') == 'xla'
  assert kernel_for('flash', 'bfloat16', 'tpu') == 'flash'  # a kernel named is that kernel
  # a model built outside make_run takes the default backend's: XLA's on this CPU
  assert kernel_for('auto', 'bfloat16') == 'xla'
  model = build(tiny(attention='auto', dtype='bfloat16'), nnx.Rngs(0))
  assert model.encoder.layers[0].self_attention.implementation == 'xla'


def test_xla_and_einsum_models_agree():
  cfg = tiny()
  rng = np.random.RandomState(6)
  batch = batch_of(np.pad(tokens(rng, 2, 9), ((0, 0), (0, 3))), tokens(rng, 2, DECODER_LENGTH))
  xla = build(cfg, nnx.Rngs(0))
  einsum = build(dataclasses.replace(cfg, attention='einsum'), nnx.Rngs(0))
  np.testing.assert_allclose(xla(batch), einsum(batch), atol=1e-5)


@nnx.jit
def value_and_grad(model, batch, weights):
  return nnx.value_and_grad(lambda m: jnp.mean(m(batch) * weights))(model)


def loss_and_grads(model, batch):
  """A scalar of the logits and its gradients in the unrolled layout, for comparisons."""
  weights = jnp.asarray(np.random.RandomState(7).randn(model.cfg.vocab_size), jnp.float32)
  loss, grads = value_and_grad(model, batch, weights)
  grads = grads.to_pure_dict()
  if model.cfg.scan_layers:
    grads = unstack_layers(grads)
  return loss, grads


def test_scanned_encoder_decoder_matches_unrolled():
  cfg = tiny()
  batch = random_batch(7)
  unrolled = build(cfg, nnx.Rngs(7))
  scanned = build(dataclasses.replace(cfg, scan_layers=True), nnx.Rngs(8))
  load_params(scanned, stack_layers(get_params(unrolled)))
  np.testing.assert_allclose(nnx.jit(lambda m, b: m(b))(scanned, batch), unrolled(batch),
                             atol=1e-5)


def test_scan_and_remat_match_unrolled_gradients():
  """Same weights give the same loss and gradients, scanned or not, under each remat policy."""
  cfg = tiny(arch='decoder')
  batch = random_batch(7)
  reference = build(cfg, nnx.Rngs(7))
  params = get_params(reference)
  loss, grads = loss_and_grads(reference, batch)
  for scan, policy in ((True, 'save_dots'), (False, 'full')):
    variant = build(dataclasses.replace(cfg, scan_layers=scan, remat_policy=policy), nnx.Rngs(8))
    load_params(variant, stack_layers(params) if scan else params)
    variant_loss, variant_grads = loss_and_grads(variant, batch)
    np.testing.assert_allclose(variant_loss, loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), variant_grads, grads)


def test_stack_unstack_round_trip():
  params = get_params(build(tiny(), nnx.Rngs(0)))
  stacked = stack_layers(params)
  assert stacked['encoder']['layers']['mlp']['wi']['kernel'].shape == (2, 32, 64)
  back = unstack_layers(stacked)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_scanned_electra_stack_unstack_round_trip():
  """Both of ELECTRA's stacks, generator and discriminator, change layout; the result loads."""
  cfg = tiny(arch='electra', generator_size=0.5)
  params = get_params(build(cfg, nnx.Rngs(0)))
  stacked = stack_layers(params)
  for stack, width, d_ff in (('generator', 16, 32), ('discriminator', 32, 64)):
    assert stacked[stack]['layers']['mlp']['wi']['kernel'].shape == (2, width, d_ff)
  load_params(build(dataclasses.replace(cfg, scan_layers=True), nnx.Rngs(1)), stacked)
  jax.tree.map(np.testing.assert_array_equal, unstack_layers(stacked), params)


def test_load_params_rejects_a_wrong_layout():
  model = build(tiny(), nnx.Rngs(0))
  with pytest.raises(ValueError, match='scan_layers'):
    load_params(model, stack_layers(get_params(model)))
  params = get_params(model)
  params['embed']['embedding'] = np.zeros((7, 32), np.float32)
  with pytest.raises(ValueError, match='embed/embedding has shape'):
    load_params(model, params)


def test_dropout():
  model = build(tiny(dropout=0.3), nnx.Rngs(11))
  batch = random_batch(11)
  clean = model(batch)
  noisy = [model(batch, deterministic=False, rngs=nnx.Rngs(dropout=seed)) for seed in (1, 1, 2)]
  np.testing.assert_array_equal(noisy[0], noisy[1])
  assert not np.allclose(noisy[0], noisy[2]) and not np.allclose(noisy[0], clean)
  # Without rngs the model's own stream is used: each call advances it, reseeding restarts it.
  assert not np.allclose(model(batch, deterministic=False), model(batch, deterministic=False))
  nnx.reseed(model, dropout=5)
  first = model(batch, deterministic=False)
  nnx.reseed(model, dropout=5)
  np.testing.assert_array_equal(model(batch, deterministic=False), first)


def test_dropout_in_scanned_layers_is_reproducible():
  model = build(tiny(arch='decoder', dropout=0.3, scan_layers=True), nnx.Rngs(11))
  batch = random_batch(11)
  noisy = [jit_forward_train(model, batch, nnx.Rngs(dropout=seed)) for seed in (1, 1, 2)]
  np.testing.assert_array_equal(noisy[0], noisy[1])
  assert not np.allclose(noisy[0], noisy[2])


def test_no_dropout_rate_means_deterministic():
  model = build(tiny(), nnx.Rngs(0))
  batch = random_batch(0)
  np.testing.assert_array_equal(model(batch, deterministic=False), model(batch))
