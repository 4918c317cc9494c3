"""The flash kernels (Pallas, interpret mode on CPU) against the einsum path they replace.

The reference is `dot_product_attention(..., implementation='einsum')` with the dense mask
(`attention_mask`) and the dense bias (`RelativePositionBias`'s one-hot product) built from the
same arguments that build the kernel's layout (`attention_layout`) and table: so these tests
check the layout and the kernel together, for both backends (Triton's, GPUs'; Mosaic's, TPUs').
Lengths are not multiples of the 16-wide test tiles.
"""

import dataclasses

from flax import nnx
import jax
from jax.sharding import AxisType
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models import build
from t5lite.models.attention import attention_layout, attention_mask, dot_product_attention
from t5lite.models import flash_attention as flash_lib
from t5lite.models.flash_attention import Blocks, flash_attention
from t5lite.models.flash_tiles import Static, key_blocks, most_blocks, query_blocks
from t5lite.models.positions import BucketedBias, RelativeBuckets
from tests.models.test_transformer import loss_and_grads, pack, tiny

BLOCKS = Blocks(q=16, k=16, backward_q=16, backward_k=16)
HEADS, D_KV = 3, 8
BACKENDS = ('triton', 'mosaic')


def packed_ids(rng, batch: int, length: int, most: int = 4) -> np.ndarray:
  """Segment ids (batch, length): row r packs 1 to `most` examples then trailing padding; the
  last row is all padding."""
  rows = []
  for r in range(batch):
    count = 1 + r % most
    cuts = np.sort(rng.choice(np.arange(1, length - 2), size=count, replace=False))
    ids = 1 + np.searchsorted(cuts[:-1], np.arange(length), side='right')
    rows.append(np.where(np.arange(length) < cuts[-1] + 2, ids, 0))
  rows[-1][:] = 0
  return np.array(rows, np.int32)


@dataclasses.dataclass
class Case:
  """One attention: its arguments as the model gives them to attention_mask/attention_layout."""
  q_len: int
  k_len: int
  causal: bool
  biased: bool = True
  segments: bool = True
  prefix: bool = False
  batch: int = 4
  seed: int = 0
  window: int | None = None

  def arrays(self, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(self.seed), 5)
    q, cotangent = (jax.random.normal(key, (self.batch, self.q_len, HEADS, D_KV))
                    for key in keys[:2])
    k, v = (jax.random.normal(key, (self.batch, self.k_len, HEADS, D_KV)) for key in keys[2:4])
    table = jax.random.normal(keys[4], (32, HEADS))
    return [x.astype(dtype) for x in (q, k, v)] + [table, cotangent]

  def mask_args(self) -> tuple[tuple, dict]:
    rng = np.random.default_rng(self.seed)
    q_ids = packed_ids(rng, self.batch, self.q_len)
    k_ids = q_ids if self.causal else packed_ids(rng, self.batch, self.k_len)
    kwargs = dict(causal=self.causal, window=self.window)
    if self.segments:
      kwargs.update(query_segment_ids=jnp.asarray(q_ids), key_segment_ids=jnp.asarray(k_ids))
    if self.prefix:
      kwargs['prefix'] = jnp.asarray(np.arange(self.q_len)[None] < 1 + np.arange(
          self.batch)[:, None] * 5, jnp.int32)
    key_valid = None if self.causal else jnp.asarray(k_ids > 0)
    return (self.q_len, key_valid), kwargs

  @property
  def buckets(self) -> RelativeBuckets:
    return RelativeBuckets(not self.causal, 32, 20)

  def loss(self, flash: bool, backend: str = 'triton'):
    """(q, k, v, table) -> sum(out * cotangent): flash, or einsum with the dense mask and bias.
    In a window, queries that see no key (padding) are left out: the kernel averages the keys of
    the tiles it reads for them, the dense path all keys, and no real query reads either."""
    args, kwargs = self.mask_args()
    layout, mask = attention_layout(*args, **kwargs), attention_mask(*args, **kwargs)
    *_, cotangent = self.arrays()
    if self.window is not None:
      sees = jnp.any(jnp.broadcast_to(mask, (self.batch, 1, self.q_len, self.k_len)), axis=-1)
      cotangent = jnp.where(sees[:, 0, :, None, None], cotangent, 0.0)  # (b, q, 1, 1)

    def loss(q, k, v, table):
      if flash:
        bias = BucketedBias(table, self.buckets) if self.biased else None
        out = flash_attention(
            q, k, v, query_segments=jnp.broadcast_to(layout.query_segments, q.shape[:2]),
            key_segments=jnp.broadcast_to(layout.key_segments, k.shape[:2]),
            causal=layout.causal, prefix=layout.prefix, window=layout.window,
            table=table if self.biased else None, buckets=bias and bias.buckets, blocks=BLOCKS,
            backend=backend)
      else:
        bias = (BucketedBias(table, self.buckets).dense(self.q_len, self.k_len) if self.biased
                else None)
        out = dot_product_attention(q, k, v, mask=mask, bias=bias, implementation='einsum')
      return jnp.sum(out.astype(jnp.float32) * cotangent)
    return loss


def value_and_grads(case: Case, flash: bool, dtype=jnp.float32, backend: str = 'triton'):
  q, k, v, table, _ = case.arrays(dtype)
  loss = case.loss(flash, backend)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, table)


CASES = {
    'encoder': Case(37, 37, causal=False),
    'encoder_unpacked': Case(23, 23, causal=False, segments=False),
    'decoder': Case(37, 37, causal=True),
    'decoder_unpacked': Case(29, 29, causal=True, segments=False),
    'prefix_lm': Case(37, 37, causal=True, prefix=True),
    'cross_longer_keys': Case(21, 45, causal=False, biased=False),
    'cross_longer_queries': Case(45, 19, causal=False, biased=False),
    'encoder_bias_cross_shapes': Case(19, 50, causal=False),
    # local attention: 5 blocks, each reading at most 3 (2 for the decoder)
    'encoder_window': Case(70, 70, causal=False, window=6),
    'decoder_window': Case(75, 75, causal=True, window=9, batch=2),
    'cross_window': Case(40, 66, causal=False, window=3, batch=2),
}


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', CASES)
def test_forward_and_every_gradient_match_einsum_in_float32(name, backend):
  case = CASES[name]
  (want, want_grads), (got, got_grads) = (value_and_grads(case, flash, backend=backend)
                                          for flash in (False, True))
  np.testing.assert_allclose(got, want, atol=1e-4)  # a sum of about 2,000 terms of order 1
  for grad_name, a, b in zip(('q', 'k', 'v', 'table'), got_grads, want_grads):
    scale = float(jnp.max(jnp.abs(b)))
    if grad_name == 'table' and not case.biased:
      assert scale == 0.0 and float(jnp.max(jnp.abs(a))) == 0.0
      continue
    assert scale > 0.1, grad_name  # the gradient is real, not a zero that any kernel matches
    np.testing.assert_allclose(a, b, atol=2e-5 * scale, err_msg=grad_name)


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_query_that_sees_no_key_gets_uniform_weights_over_the_real_keys(backend):
  """The last row is all padding: its queries see nothing, and average the 37 real keys' values
  (not the padded tile's 48), as dot_product_attention does."""
  case = CASES['encoder']
  q, k, v, table, _ = case.arrays()
  args, kwargs = case.mask_args()
  layout = attention_layout(*args, **kwargs)
  out = flash_attention(q, k, v, query_segments=layout.query_segments,
                        key_segments=layout.key_segments, table=table, buckets=case.buckets,
                        blocks=BLOCKS, backend=backend)
  np.testing.assert_allclose(out[-1], jnp.broadcast_to(v[-1].mean(0), out[-1].shape), atol=1e-6)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', ['encoder', 'decoder'])
def test_bfloat16_is_within_the_kernel_checks_tolerance(name, backend):
  """bench/gpu.py's attention check allows 2e-2 (relative to the largest entry) in bfloat16."""
  case = CASES[name]
  want = value_and_grads(case, False)
  got = value_and_grads(case, True, jnp.bfloat16, backend)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    error = float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)) / jnp.max(jnp.abs(b)))
    assert error <= 2e-2


@pytest.mark.parametrize('backend', BACKENDS)
def test_no_gradient_leaks_between_packed_examples(backend):
  """The loss of segment 1 of each row has exactly zero gradient with respect to every other
  segment's queries, keys and values."""
  case = CASES['encoder']
  q, k, v, table, cotangent = case.arrays()
  args, kwargs = case.mask_args()
  layout = attention_layout(*args, **kwargs)
  q_ids, k_ids = kwargs['query_segment_ids'], kwargs['key_segment_ids']

  def first_segment_loss(q, k, v):
    out = flash_attention(q, k, v, query_segments=layout.query_segments,
                          key_segments=layout.key_segments, table=table, buckets=case.buckets,
                          blocks=BLOCKS, backend=backend)
    return jnp.sum(jnp.where((q_ids == 1)[:, :, None, None], out * cotangent, 0.0))

  d_q, d_k, d_v = jax.jit(jax.grad(first_segment_loss, argnums=(0, 1, 2)))(q, k, v)
  for grad, ids in ((d_q, q_ids), (d_k, k_ids), (d_v, k_ids)):
    others = (ids != 1)[:, :, None, None]
    assert float(jnp.max(jnp.abs(jnp.where(others, grad, 0.0)))) == 0.0
    assert float(jnp.max(jnp.abs(jnp.where(others, 0.0, grad)))) > 0.01  # and some where due


@pytest.mark.parametrize('backend', BACKENDS)
def test_two_runs_are_bit_equal(backend):
  case = CASES['decoder']
  first, second = (value_and_grads(case, True, backend=backend) for _ in range(2))
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
    np.testing.assert_array_equal(a, b)


def test_the_kernels_lower_for_nvidia_gpus():
  """Triton lowering runs on any host (compiling it needs the GPU): the forward and both backward
  kernels become Triton calls at t5_1_1_base's shapes, causal and not."""
  q = jax.ShapeDtypeStruct((2, 512, 12, 64), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((2, 512), jnp.int32)
  for causal in (False, True):
    def loss(q, k, v, table, ids):
      out = flash_attention(q, k, v, query_segments=ids, key_segments=ids, causal=causal,
                            table=table, buckets=RelativeBuckets(not causal, 32, 128),
                            interpret=False)
      return jnp.sum(out.astype(jnp.float32))
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
        q, q, q, jax.ShapeDtypeStruct((32, 12), jnp.float32), ids).lower(
            lowering_platforms=('cuda',))
    assert lowered.as_text().count('@__gpu$xla.gpu.triton') == 3


@pytest.mark.parametrize('causal, prefix, window', [
    (False, False, None), (True, False, None), (True, True, None), (False, False, 5),
    (True, False, 21), (False, False, 0)])
def test_the_tiles_read_are_those_holding_a_visible_key(causal, prefix, window):
  """key_blocks and query_blocks against every tile of a 96 x 96 attention (blocks of 8 queries
  by 16 keys): the tiles they name are the same from both sides, no more than most_blocks of
  them, and every tile left out holds no key any query may see whatever the segments."""
  static = Static(96, 96, causal, prefix, window, None, BLOCKS, True)
  bq, bk = 8, 16
  q, k = np.arange(96)[:, None], np.arange(96)[None, :]
  seen = (k <= q) | prefix if causal else np.ones((96, 96), bool)
  if window is not None:
    seen = seen & (np.abs(k - q) <= window)
  read_by_queries = set()
  for i in range(12):
    first, end = (int(x) for x in key_blocks(static, i, bq, bk, 6))
    assert end - first <= most_blocks(static, bq, bk, 6)
    read_by_queries |= {(i, j) for j in range(first, end)}
  read_by_keys = set()
  for j in range(6):
    first, end = (int(x) for x in query_blocks(static, j, bq, bk, 12))
    assert end - first <= most_blocks(static, bk, bq, 12)
    read_by_keys |= {(i, j) for i in range(first, end)}
  assert read_by_queries == read_by_keys
  for i in range(12):
    for j in range(6):
      holds = seen[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk].any()
      assert holds == ((i, j) in read_by_queries), (i, j)


def grids(loss, *args) -> dict:
  """{kernel name: its grid} of every pallas_call in loss's gradient."""
  found = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'pallas_call':
        found[eqn.params['name']] = eqn.params['grid_mapping'].grid
      for param in eqn.params.values():
        inner = getattr(param, 'jaxpr', param)
        if hasattr(inner, 'eqns'):
          walk(inner)

  walk(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3)))(*args).jaxpr)
  return found


def test_the_kernels_lower_for_tpus_and_a_window_reads_only_its_tiles():
  """Mosaic lowering runs on any host (compiling needs libtpu: tests/commands/test_plan.py): the
  forward and both backward kernels become TPU custom calls. At 16,384 tokens in blocks of 256,
  a window of 127 reads 3 key blocks of 64 per query block (and 3 query blocks per key block)."""
  length = 16_384
  q = jax.ShapeDtypeStruct((1, length, 12, 64), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((1, length), jnp.int32)
  table = jax.ShapeDtypeStruct((32, 12), jnp.float32)

  def loss(q, k, v, table, ids):
    out = flash_attention(q, k, v, query_segments=ids, key_segments=ids, window=127,
                          table=table, buckets=RelativeBuckets(True, 32, 128), backend='mosaic',
                          interpret=False)
    return jnp.sum(out.astype(jnp.float32))

  assert grids(loss, q, q, q, table, ids) == {
      'forward_kernel': (1, 12, 64, 3), 'd_query_kernel': (1, 12, 64, 3),
      'd_key_value_kernel': (1, 12, 64, 3)}
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(q, q, q, table, ids).lower(
      lowering_platforms=('tpu',))
  assert lowered.as_text().count('tpu_custom_call') == 3


@pytest.mark.slow  # 10-28 s each on 2 cores, Mosaic's alike: interpret mode compiles slowly
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('arch', ['encoder_decoder', 'decoder', 'umt5'])
def test_models_with_flash_attention_match_xla_on_packed_rows(arch, backend, monkeypatch):
  """Loss and every parameter's gradient, the relative bias tables included, packed and not,
  scanned with remat for the decoder; UMT5's table in every layer, scanned."""
  monkeypatch.setattr(flash_lib, 'INTERPRETED', backend)
  options = {'encoder_decoder': {}, 'decoder': dict(scan_layers=True, remat_policy='save_dots'),
             'umt5': dict(scan_layers=True, relative_bias_per_layer=True)}[arch]
  cfg = tiny(arch='decoder' if arch == 'decoder' else 'encoder_decoder', **options)
  xla, flash = (build(dataclasses.replace(cfg, attention=a), nnx.Rngs(0)) for a in ('xla', 'flash'))
  for batch in pack(np.random.RandomState(1), ((7, 3), (5, 4))):
    (loss, grads), (flash_loss, flash_grads) = (loss_and_grads(m, batch) for m in (xla, flash))
    np.testing.assert_allclose(flash_loss, loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7), flash_grads, grads)


@pytest.mark.slow  # 14 s on 2 cores
@pytest.mark.parametrize('backend', BACKENDS)
def test_flash_under_a_mesh_shards_batch_and_heads(backend, monkeypatch):
  """On 8 devices (data 4, tensor 2) the kernel runs per shard (shard_map) and gives the
  unsharded gradients: the table's is summed over the batch shards."""
  monkeypatch.setattr(flash_lib, 'INTERPRETED', backend)
  cfg = tiny()
  packed, _ = pack(np.random.RandomState(1), ((7, 3), (5, 4)))
  batch = {k: jnp.concatenate([v] * 4) for k, v in packed.items()}  # 8 rows
  loss, grads = loss_and_grads(build(cfg, nnx.Rngs(0)), batch)
  mesh = jax.make_mesh((4, 1, 2), ('data', 'fsdp', 'tensor'), axis_types=(AxisType.Auto,) * 3)
  rules = (('batch', ('data', 'fsdp')), ('embed', 'fsdp'), ('mlp', 'tensor'),
           ('heads', 'tensor'), ('vocab', 'tensor'), ('kv', None), ('length', None),
           ('layers', None), ('relpos_buckets', None))
  flash = build(dataclasses.replace(cfg, attention='flash'), nnx.Rngs(0))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    flash_loss, flash_grads = loss_and_grads(flash, batch)
  np.testing.assert_allclose(flash_loss, loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7), flash_grads, grads)
