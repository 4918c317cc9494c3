"""LongT5's blockwise local and transient-global attention against dense references, its global
blocks against Hugging Face's and a loop over examples, and packed rows: two examples in a row
compute what each computes alone, and neither's loss has any gradient from the other's tokens."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import Features, ModelConfig, build, get_params, load_params, stack_layers
from t5lite.models import flash_attention as flash_lib
from t5lite.models import long_attention
from t5lite.models.attention import attention_mask, dot_product_attention
from t5lite.models.positions import BucketedBias, RelativeBuckets
from tests.models.test_transformer import loss_and_grads

HEADS, WIDTH, RADIUS, GLOBAL_BLOCK = 3, 4, 3, 4  # blocks of 4 local tokens, 4 per global token
BUCKETS = RelativeBuckets(bidirectional=True, num_buckets=32, max_distance=128)


def config(attention: str, **overrides) -> ModelConfig:
  fields = dict(vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_encoder_layers=2,
                num_decoder_layers=2, activation='gated-gelu', tie_embeddings=False,
                encoder_attention=attention, local_radius=RADIUS, global_block_size=GLOBAL_BLOCK)
  return ModelConfig(**{**fields, **overrides})


def reference_blocks(examples: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
  """global_blocks by a loop over each row's examples (runs of one id; -1 is padding)."""
  slots = np.full(examples.shape, -1)
  owners = np.full((examples.shape[0], examples.shape[1] // block_size), -1)
  for row, ids in enumerate(examples):
    next_slot, start = 0, 0
    while start < len(ids):
      end = start
      while end < len(ids) and ids[end] == ids[start]:
        end += 1
      full = (end - start) // block_size
      if ids[start] >= 0 and full:
        for i in range(start, end):
          slots[row, i] = next_slot + min((i - start) // block_size, full - 1)
        owners[row, next_slot:next_slot + full] = ids[start]
        next_slot += full
      start = end
  return slots, owners


def random_heads(seed, batch, length, count=3):
  keys = jax.random.split(jax.random.PRNGKey(seed), count)
  return [jax.random.normal(key, (batch, length, HEADS, WIDTH)) for key in keys]


def tables(seed):
  local, side = jax.random.split(jax.random.PRNGKey(seed + 100))
  return (BucketedBias(jax.random.normal(local, (32, HEADS)), BUCKETS),
          BucketedBias(jax.random.normal(side, (32, HEADS)), BUCKETS))


def layout_of(valid, segment_ids, attention):
  return long_attention.long_layout(jnp.asarray(valid), None if segment_ids is None
                                    else jnp.asarray(segment_ids), config(attention))


def dense_reference(query, key, value, valid, segment_ids, local, side=None):
  """The same attention as one dense (q, k) softmax: `attention_mask` and the window over the
  tokens; for TGlobal the global tokens appended as keys, each seen by its example's tokens, with
  the side table's bias of (slot - the token's slot), slots from the loop above."""
  length = query.shape[1]
  index = np.arange(length)
  segments = None if segment_ids is None else jnp.asarray(segment_ids)
  mask = attention_mask(length, jnp.asarray(valid), query_segment_ids=segments,
                        key_segment_ids=segments) & (np.abs(index[:, None] - index) <= RADIUS)
  bias = jnp.broadcast_to(local.dense(length, length), (query.shape[0], HEADS, length, length))
  if side is not None:
    table, side_key, side_value = side
    examples = np.where(valid, 0 if segment_ids is None else segment_ids, -1)
    slots, owners = reference_blocks(examples, GLOBAL_BLOCK)
    seen = (examples[:, :, None] == owners[:, None, :]) & (owners[:, None, :] >= 0)  # (b, l, g)
    mask = jnp.concatenate([jnp.broadcast_to(mask, (*seen.shape[:1], 1, length, length)),
                            jnp.asarray(seen)[:, None]], axis=-1)
    relative = np.arange(owners.shape[1])[None, None, :] - slots[:, :, None]  # (b, l, g)
    side_bias = jnp.take(table.table, table.buckets(jnp.asarray(relative)), axis=0)  # (b, l, g, h)
    bias = jnp.concatenate([bias, jnp.moveaxis(side_bias, -1, 1)], axis=-1)
    key = jnp.concatenate([key, side_key], axis=1)
    value = jnp.concatenate([value, side_value], axis=1)
  return dot_product_attention(query, key, value, mask=mask, bias=bias, implementation='einsum')


# rows of 24 tokens (6 local blocks) and 23 (a partial one), a padded row, packed rows
ROWS = {
    'full': (np.ones((2, 24), bool), None),
    'partial_padded': (np.arange(23) < np.array([[23], [14]]), None),
    'packed': (np.array([[1] * 21 + [0] * 2] * 2, bool),
               np.array([[1] * 9 + [2] * 5 + [3] * 7 + [0] * 2,
                         [1] * 2 + [2] * 19 + [0] * 2])),
}


@pytest.mark.parametrize('rows', sorted(ROWS))
@pytest.mark.parametrize('attention', ['local', 'transient_global'])
def test_blockwise_attention_matches_the_dense_reference(attention, rows):
  valid, segment_ids = ROWS[rows]
  batch, length = valid.shape
  query, key, value = random_heads(0, batch, length)
  local, side = tables(0)
  layout = layout_of(valid, segment_ids, attention)
  tglobal = attention == 'transient_global'
  side_kv = random_heads(1, batch, length // GLOBAL_BLOCK, 2) if tglobal else [None, None]
  weights = jax.random.normal(jax.random.PRNGKey(2), query.shape) * valid[:, :, None, None]

  def blockwise(query, key, value, local_table, side_table, side_key, side_value):
    bias = long_attention.long_bias(
        layout, BucketedBias(local_table, BUCKETS),
        BucketedBias(side_table, BUCKETS) if tglobal else None)
    out = long_attention.blockwise_attention(query, key, value, layout, bias, side_key,
                                             side_value)
    return jnp.sum(out * weights), out

  def dense(query, key, value, local_table, side_table, side_key, side_value):
    side_args = (BucketedBias(side_table, BUCKETS), side_key, side_value) if tglobal else None
    out = dense_reference(query, key, value, valid, segment_ids, BucketedBias(local_table, BUCKETS),
                          side_args)
    return jnp.sum(out * weights), out

  args = (query, key, value, local.table, side.table, *side_kv)
  argnums = tuple(range(7 if tglobal else 4))
  (_, out), grads = jax.jit(jax.value_and_grad(blockwise, argnums, has_aux=True))(*args)
  (_, expected), expected_grads = jax.jit(jax.value_and_grad(dense, argnums, has_aux=True))(*args)
  real = valid[:, :, None, None]  # a padding query's output is never read
  np.testing.assert_allclose(out * real, expected * real, atol=2e-6)
  for grad, expected_grad in zip(grads, expected_grads):
    np.testing.assert_allclose(grad, expected_grad, atol=2e-5)


@pytest.mark.parametrize('lengths', [[40, 37, 31, 16, 15, 3]])
@pytest.mark.parametrize('block_size', [4, 16])
def test_unpacked_global_blocks_are_hugging_faces(lengths, block_size):
  """Right-padded rows: each token's block and the blocks in use, orphans and short rows too."""
  torch = pytest.importorskip('torch')
  from transformers.models.longt5 import modeling_longt5  # pylint: disable=import-outside-toplevel
  valid = np.arange(40) < np.array(lengths)[:, None]
  slots, owners = jax.jit(long_attention.global_blocks, static_argnums=1)(
      jnp.where(jnp.asarray(valid), 0, -1), block_size)
  hf_slots, hf_used = modeling_longt5._make_global_fixed_block_ids(  # pylint: disable=protected-access
      torch.tensor(valid.astype(np.int64)), block_size)
  np.testing.assert_array_equal(slots, hf_slots.numpy())
  np.testing.assert_array_equal(owners >= 0, hf_used.numpy() == 1)


def test_packed_global_blocks_never_mix_examples():
  examples = np.array([[1] * 9 + [2] * 3 + [3] * 10 + [4] * 8 + [-1] * 2,
                       [5] * 4 + [6] * 4 + [7] * 23 + [-1]])
  slots, owners = jax.jit(long_attention.global_blocks, static_argnums=1)(
      jnp.asarray(examples), GLOBAL_BLOCK)
  expected_slots, expected_owners = reference_blocks(examples, GLOBAL_BLOCK)
  np.testing.assert_array_equal(slots, expected_slots)
  np.testing.assert_array_equal(owners, expected_owners)
  assert expected_owners.tolist() == [[1, 1, 3, 3, 4, 4, -1, -1], [5, 6, 7, 7, 7, 7, 7, -1]]


def test_global_sums_add_each_blocks_inputs():
  examples = jnp.asarray([[1] * 9 + [2] * 6 + [-1]])
  layout = long_attention.LongLayout(examples, *long_attention.global_blocks(examples, 4), RADIUS)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 16, 5))
  sums = long_attention.global_sums(x, layout)
  expected = [x[0, :4].sum(0), x[0, 4:9].sum(0), x[0, 9:15].sum(0), jnp.zeros(5)]
  np.testing.assert_allclose(sums[0], jnp.stack(expected), atol=1e-6)


def packed_and_alone(attention):
  """A model, a row packing an example of 13 tokens and one of 18 (with padding), and each alone."""
  model = build(config(attention), nnx.Rngs(0))
  rng = np.random.RandomState(0)
  first, second = rng.randint(2, 128, 13), rng.randint(2, 128, 18)
  packed = np.concatenate([first, second, [0, 0]])[None]
  segments = np.array([[1] * 13 + [2] * 18 + [0] * 2])
  return model, first, second, jnp.asarray(packed, jnp.int32), jnp.asarray(segments, jnp.int32)


@nnx.jit
def encode(model, tokens, segment_ids=None):
  return model.encode(Features(tokens, segment_ids))


@pytest.mark.parametrize('attention', ['local', 'transient_global'])
def test_a_packed_row_encodes_each_example_as_alone(attention):
  model, first, second, packed, segments = packed_and_alone(attention)
  encoded = encode(model, packed, segments)
  for example, start in ((first, 0), (second, 13)):
    alone = encode(model, jnp.asarray(example[None], jnp.int32))
    np.testing.assert_allclose(encoded[0, start:start + len(example)], alone[0], atol=2e-5)


@pytest.mark.parametrize('attention', ['local', 'transient_global'])
def test_one_examples_loss_has_no_gradient_from_the_others_tokens(attention):
  """Through the encoder, the global tokens and cross-attention: exactly zero."""
  model, _, _, packed, segments = packed_and_alone(attention)
  encoder = Features(packed, segments)
  targets = jnp.asarray([[5, 6, 7, 1, 9, 10, 1, 0]], jnp.int32)
  decoder = Features(targets, jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 0]], jnp.int32))

  def first_example_loss(embedded):
    encoded = model.encoder(embedded, encoder)
    logits = model.decoder_logits(encoded, encoder, decoder)
    return jnp.sum(jax.nn.log_softmax(logits)[0, :4, 3])

  grad = jax.jit(jax.grad(first_example_loss))(model.embed(packed))
  assert float(jnp.abs(grad[0, :13]).max()) > 0
  assert float(jnp.abs(grad[0, 13:]).max()) == 0.0


@pytest.mark.slow  # two models compiled with their gradients: 119 s on 2 cores at a load of 15
def test_scanned_and_rematerialized_layers_compute_the_same():
  """A transient-global model scanned under save_dots remat: the unrolled model's loss and
  gradients, the global layer norms stacked as every layer's weights are."""
  cfg = config('transient_global')
  model, _, _, packed, segments = packed_and_alone('transient_global')
  scanned = build(dataclasses.replace(cfg, scan_layers=True, remat_policy='save_dots'),
                  nnx.Rngs(1))
  load_params(scanned, stack_layers(get_params(model)))
  batch = {'encoder_input_tokens': packed, 'encoder_segment_ids': segments,
           'decoder_input_tokens': jnp.asarray([[0, 5, 0, 7]], jnp.int32),
           'decoder_segment_ids': jnp.asarray([[1, 1, 2, 2]], jnp.int32)}

  @nnx.jit
  def scalar_and_grads(model):
    return nnx.value_and_grad(lambda m: jnp.sum(jax.nn.log_softmax(m(batch))[..., 3]))(model)

  loss, grads = scalar_and_grads(model)
  scanned_loss, scanned_grads = scalar_and_grads(scanned)
  np.testing.assert_allclose(scanned_loss, loss, rtol=1e-5)
  expected = stack_layers(nnx.to_pure_dict(grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5),
               nnx.to_pure_dict(scanned_grads), expected)


def test_bfloat16_scores_biases_and_global_sums_stay_float32():
  """A transient-global model in bfloat16 computes float32 scores (its logits within 0.05 of
  float32's, a bfloat16 model's rounding); the global sums and the side bias are float32."""
  model, _, _, packed, segments = packed_and_alone('transient_global')
  low = build(config('transient_global', dtype='bfloat16'), nnx.Rngs(0))
  load_params(low, get_params(model))
  encoded = encode(model, packed, segments)
  low_encoded = encode(low, packed, segments)
  assert low_encoded.dtype == jnp.bfloat16
  np.testing.assert_allclose(low_encoded.astype(jnp.float32), encoded, atol=0.05)
  layout = long_attention.long_layout(packed > 0, segments, low.cfg)
  sums = long_attention.global_sums(low.embed(packed), layout)
  bias = long_attention.long_bias(layout, low.encoder.relative_bias.bucketed(),
                                  low.encoder.global_bias.bucketed())
  assert sums.dtype == bias.local.dtype == bias.side.dtype == jnp.float32


@pytest.mark.slow  # 11 s (triton), 10 s (mosaic) on 2 cores at a load of 5; 31 s, 20 s at 7
@pytest.mark.parametrize('backend', ['triton', 'mosaic'])
def test_a_local_encoder_under_the_flash_kernel_matches_the_blockwise_one(backend, monkeypatch):
  """model.attention=flash runs a local encoder as the kernel with window=local_radius (Pallas'
  interpreter on CPU): the loss and every gradient of XLA's blockwise path, on a packed row.
  The decoder's row has no padding: a padding query sees no key and both paths give it uniform
  weights, over other keys (the blockwise path's window, the kernel's tiles), which nothing reads
  but a padding query."""
  monkeypatch.setattr(flash_lib, 'INTERPRETED', backend)
  jax.clear_caches()  # the backend is read when tracing: not another backend's compiled step
  _, _, _, packed, segments = packed_and_alone('local')
  cfg = config('local', num_encoder_layers=1, num_decoder_layers=1)
  model, flash = (build(dataclasses.replace(cfg, attention=a), nnx.Rngs(0))
                  for a in ('xla', 'flash'))
  batch = {'encoder_input_tokens': packed, 'encoder_segment_ids': segments,
           'decoder_input_tokens': jnp.asarray([[0, 5, 6, 0, 7, 8, 9]], jnp.int32),
           'decoder_segment_ids': jnp.asarray([[1, 1, 1, 2, 2, 2, 2]], jnp.int32)}
  (loss, grads), (flash_loss, flash_grads) = (loss_and_grads(m, batch) for m in (model, flash))
  np.testing.assert_allclose(flash_loss, loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), flash_grads, grads)
