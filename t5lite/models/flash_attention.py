"""Flash attention with T5's relative position bias computed inside the kernel (Pallas).

No (q, k) array is ever built: not the bias, not the mask, not the weights. Each tile computes its
bias from the positions it covers with `positions.relative_position_bucket` (integer thresholds,
the very function the model's dense bias uses) and the head's row of the (heads, buckets) table;
its mask from per-position segment ids (`flash_tiles.visible`). The reference it is tested
against is `attention.dot_product_attention(..., implementation='einsum')` with the dense mask and
bias the model builds from the same features (tests/models/test_flash_attention.py).

Two backends, one interface and the same rules (flash_tiles.py):
- Triton (flash_triton.py) on NVIDIA GPUs: a program per query block looping over key blocks,
  the bias gathered from the table per entry;
- Mosaic (flash_mosaic.py) on TPUs: a grid step per tile, the bias a Toeplitz tile rolled out
  of one row of distances, the table's gradient summed along the tile's diagonals.
Each pass skips the tiles that hold no visible key (after a causal diagonal, outside a window), so
that a local encoder of 16,384 tokens costs what its window costs. Softmax and the bias are in
float32 (the dense path rounds the bias to the compute dtype, as T5X does); a query that may see no
key gets uniform weights over the real keys of the tiles it reads (all of them unless causal or
windowed), as `dot_product_attention` does over all keys (masked logits are float32's min, keys
past the length -inf). The table's gradient is summed without atomics, per query block and then
by XLA in a fixed order: two runs of the same step give the same bits. Lengths need not be
multiples of the blocks: inputs are padded and the padding cut off.

Elsewhere (CPU) the kernels run in Pallas' interpreter: correct, slow, for tests.
"""

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp

from t5lite.models import flash_mosaic, flash_triton
from t5lite.models.flash_tiles import Blocks, Static
from t5lite.models.positions import RelativeBuckets

BACKENDS = {'triton': flash_triton, 'mosaic': flash_mosaic}
# The tiles each backend runs with unless told: Mosaic's lanes are 128 wide
DEFAULT_BLOCKS = {'triton': Blocks(), 'mosaic': Blocks(q=256, k=256, backward_q=256,
                                                       backward_k=256)}
INTERPRETED = 'triton'  # the backend interpreted on CPUs (tests set 'mosaic' to run the TPU one)
_TARGET = contextvars.ContextVar('flash_attention_target', default=None)


def backend_for(platform: str) -> str:
  """The kernels of a jax platform: Mosaic on TPUs, Triton on GPUs, INTERPRETED elsewhere."""
  return {'tpu': 'mosaic', 'gpu': 'triton', 'cuda': 'triton'}.get(platform, INTERPRETED)


@contextlib.contextmanager
def compiling_for(platform: str):
  """Kernels traced inside are `platform`'s ('tpu', 'gpu'), compiled, not interpreted: for
  `t5lite plan`, which compiles for a TPU topology on a host whose default backend is its CPU."""
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                    query_segments: jax.Array, key_segments: jax.Array, causal: bool = False,
                    prefix: jax.Array | None = None, window: int | None = None,
                    table: jax.Array | None = None, buckets: RelativeBuckets | None = None,
                    blocks: Blocks | None = None, backend: str | None = None,
                    interpret: bool | None = None) -> jax.Array:
  """Unscaled softmax(q.k + bias) v, the bias T5's relative one from `table` (buckets, heads).

  query (b, q, h, d), key and value (b, k, h, d) -> (b, q, h, d). A query sees a key when their
  segment ids (b, q) and (b, k) are equal, if causal the key is not after it (or both are in the
  prefix, (b, q) nonzero: a prefix LM), and with a window their positions are at most `window`
  apart. Causal attention is self-attention whose every query sees its own key (the same ids for
  both). The bias's query and key positions are 0, 1, ...
  backend: 'mosaic' or 'triton'; by default the platform's (`backend_for`): `compiling_for`'s,
  else JAX's default backend's.
  interpret: Pallas' interpreter; by default wherever the backend is not the kernels' platform.
  """
  if (table is None) != (buckets is None):
    raise ValueError('the relative bias needs both its table and its buckets')
  if causal and query.shape[1] != key.shape[1]:
    raise ValueError(f'causal attention is self-attention: {query.shape[1]} queries, '
                     f'{key.shape[1]} keys')
  if window is not None and window < 0:
    raise ValueError(f'a window is at least 0 positions wide, got {window}')
  platform = _TARGET.get() or jax.default_backend()
  backend = backend or backend_for(platform)
  if interpret is None:
    interpret = platform != {'mosaic': 'tpu', 'triton': 'gpu'}[backend]
  static = Static(query.shape[1], key.shape[1], causal, prefix is not None, window, buckets,
                  blocks or DEFAULT_BLOCKS[backend], interpret)
  if prefix is None:
    prefix = jnp.zeros_like(query_segments)
  if table is None:
    table = jnp.zeros((1, query.shape[2]), jnp.float32)
  return _attention(backend, static, query, key, value, table, query_segments, key_segments,
                    prefix)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(backend, static, query, key, value, table, query_segments, key_segments, prefix):
  return BACKENDS[backend].forward(static, query, key, value, table, query_segments,
                                   key_segments, prefix)[0]


def _forward(backend, static, *args):
  return BACKENDS[backend].forward(static, *args)


def _backward(backend, static, residuals, d_out):
  return (*BACKENDS[backend].backward(static, residuals, d_out), None, None, None)


_attention.defvjp(_forward, _backward)


@functools.cache
def compile_error(device) -> str | None:
  """Why the kernels (forward and backward, at t5_1_1_base's head size) do not compile for
  `device` (a TPU or a compile-only one of a topology), in one line; None when they do."""
  mesh = jax.sharding.Mesh([device], ('devices',))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  x = jax.ShapeDtypeStruct((1, 512, 1, 64), jnp.bfloat16, sharding=sharding)
  ids = jax.ShapeDtypeStruct((1, 512), jnp.int32, sharding=sharding)
  table = jax.ShapeDtypeStruct((32, 1), jnp.float32, sharding=sharding)

  def loss(q, k, v, table, ids):
    out = flash_attention(q, k, v, query_segments=ids, key_segments=ids, table=table,
                          buckets=RelativeBuckets(True, 32, 128), backend=backend_for(
                              device.platform), interpret=False)
    return jnp.sum(out.astype(jnp.float32))

  try:
    jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(x, x, x, table, ids).compile()
  except Exception as error:  # pylint: disable=broad-exception-caught
    return str(error).strip().splitlines()[0]
  return None
