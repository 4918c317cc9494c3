"""Flash attention with T5's relative position bias computed inside the kernel (Pallas).

No (q, k) array is ever built: not the bias, not the mask, not the weights. Each tile computes its
bias from the positions it covers with `positions.relative_position_bucket`, the very function
the model's dense bias uses, and reads the (heads, buckets) table; its mask from per-position
segment ids. The reference it is tested against is `attention.dot_product_attention(...,
implementation='einsum')` with the dense mask and bias the model builds from the same features
(tests/models/test_flash_attention.py).

The forward pass, for one (batch row, head) and one block of queries (a program of the grid):

           keys:  0 ... bk ... 2bk ...                lk
        +-------+-------+-------+-------+--   - -+
  q[i]  | tile  | tile  | tile  | tile  |   ...    |   loop over key blocks j: s = q.k + bias,
  (bq)  | (i,0) | (i,1) | (i,2) | (i,3) |          |   mask, online softmax (running max m,
        +-------+-------+-------+-------+--   - -+   sum l, output acc), as FlashAttention-2
  bias[r, c] = table[head, bucket(k_start + c - q_start - r)]   (a gather from a 32-entry row)
  visible[r, c] = qseg[r] == kseg[c] and (not causal or c <= r or both in the prefix)

Causal stacks stop at the block holding the diagonal: the keys after it would add exactly 0.

The backward pass is two kernels, neither with atomics: dq (a program per query block, a loop
over key blocks) and dk, dv (a program per key block, a loop over query blocks), each recomputing
the tile's weights from the m and l the forward saved. The table's gradient is the sum over every
visible entry of ds = p * (dp - rowsum(do * o)), grouped by bucket:

  dq's program (b, h, i) --> partial[b, h, i, n] = sum of ds over its tiles' entries in bucket n
                             (its key blocks in order; per tile a loop over the buckets present:
                             one for a tile whose distances all lie past max_distance)
  XLA then sums partial over b and i (a plain reduction, fixed order) --> d_table (buckets, heads)

so two runs of the same step give the same bits. Softmax and the bias are in float32 (the dense
path rounds the bias to the compute dtype, as T5X does); a query that may see no key gets uniform
weights over the real keys, as `dot_product_attention` does (masked logits are float32's min,
keys past the length -inf). Lengths need not be multiples of the blocks: inputs are padded and
the padding cut off.

On NVIDIA GPUs the kernels are compiled by Triton; elsewhere they run in Pallas' interpret mode
(correct, slow: for tests). A TPU version would need Mosaic's block layout (its tiles in VMEM,
the bucket gather as a one-hot matmul, since Mosaic has no gather from a vector).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from t5lite.models.positions import RelativeBuckets

MASKED = float(jnp.finfo(jnp.float32).min)  # the logit of a hidden key, as the einsum path's


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes (powers of two): queries and keys of the forward and of the backward kernels."""
  q: int = 128
  k: int = 64
  backward_q: int = 64
  backward_k: int = 64


@dataclasses.dataclass(frozen=True)
class _Static:
  """Everything the kernels are specialised on."""
  query_length: int
  key_length: int
  causal: bool
  has_prefix: bool
  buckets: RelativeBuckets | None
  blocks: Blocks
  interpret: bool


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                    query_segments: jax.Array, key_segments: jax.Array, causal: bool = False,
                    prefix: jax.Array | None = None, table: jax.Array | None = None,
                    buckets: RelativeBuckets | None = None, blocks: Blocks = Blocks(),
                    interpret: bool | None = None) -> jax.Array:
  """Unscaled softmax(q.k + bias) v, the bias T5's relative one from `table` (buckets, heads).

  query (b, q, h, d), key and value (b, k, h, d) -> (b, q, h, d). A query sees a key when their
  segment ids (b, q) and (b, k) are equal and, if causal, the key is not after it (or both are
  in the prefix, (b, q) nonzero: a prefix LM). Causal attention is self-attention whose every
  query sees its own key (the same ids for both). The bias's query and key positions are 0, 1, ...
  interpret: Pallas' interpreter; by default wherever the backend is not a GPU.
  """
  if (table is None) != (buckets is None):
    raise ValueError('the relative bias needs both its table and its buckets')
  if causal and query.shape[1] != key.shape[1]:
    raise ValueError(f'causal attention is self-attention: {query.shape[1]} queries, '
                     f'{key.shape[1]} keys')
  if interpret is None:
    interpret = jax.default_backend() != 'gpu'
  static = _Static(query.shape[1], key.shape[1], causal, prefix is not None, buckets, blocks,
                   interpret)
  if prefix is None:
    prefix = jnp.zeros_like(query_segments)
  if table is None:
    table = jnp.zeros((1, query.shape[2]), jnp.float32)
  return _attention(static, query, key, value, table, query_segments, key_segments, prefix)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, query, key, value, table, query_segments, key_segments, prefix):
  return _forward(static, query, key, value, table, query_segments, key_segments, prefix)[0]


def _padded(x: jax.Array, length: int, axis: int = 1, fill=0) -> jax.Array:
  """x padded along axis to length with fill."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad, constant_values=fill)


def _lengths(static: _Static) -> tuple[int, int]:
  """The query and key lengths rounded up to every block size (all powers of two)."""
  blocks = static.blocks
  multiple = max(blocks.q, blocks.k, blocks.backward_q, blocks.backward_k)
  return (pl.cdiv(static.query_length, multiple) * multiple,
          pl.cdiv(static.key_length, multiple) * multiple)


def _kernel_inputs(static, query, key, value, table, query_segments, key_segments, prefix
                   ) -> dict:
  """The kernels' inputs by name, padded: queries past the length in segment -2 (they see
  nothing and are cut off), keys past it excluded by position, heads to a power of 2; the table
  as (heads, buckets) rows, float32, padded to a power of 2."""
  q_length, k_length = _lengths(static)
  head_dim = pl.next_power_of_2(query.shape[-1])
  rows = _padded(table.astype(jnp.float32).T, pl.next_power_of_2(table.shape[0]))
  ids = (_padded(query_segments.astype(jnp.int32), q_length, fill=-2),
         _padded(key_segments.astype(jnp.int32), k_length, fill=-1),
         _padded(prefix.astype(jnp.int32), q_length),
         _padded((prefix if static.has_prefix else jnp.zeros_like(key_segments)).astype(jnp.int32),
                 k_length))
  arrays = [_padded(_padded(x, length), head_dim, axis=3)
            for x, length in ((query, q_length), (key, k_length), (value, k_length))]
  return dict(zip(INPUTS, (*arrays, rows, *ids)))


def _dot(a: jax.Array, b: jax.Array, contract: tuple[int, int] = (1, 0)) -> jax.Array:
  """a . b contracting a's axis contract[0] with b's contract[1] (both 2-D), in float32:
  (1, 0) is a @ b, (1, 1) a @ b.T, (0, 0) a.T @ b."""
  dims = (((contract[0],), (contract[1],)), ((), ()))
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32,
                             precision=jax.lax.Precision.HIGHEST)


class _Tile:
  """One (query block, key block) tile: its mask, buckets and float32 logits and weights.

  q_ids and k_ids: the (segments, prefix) of its queries (bq,) and keys (bk,)."""

  def __init__(self, static: _Static, table_ref, q_start, k_start, q_ids, k_ids):
    q_positions = q_start + jnp.arange(q_ids[0].shape[0])
    k_positions = k_start + jnp.arange(k_ids[0].shape[0])
    self.visible = q_ids[0][:, None] == k_ids[0][None, :]  # (bq, bk)
    if static.causal:
      in_order = k_positions[None, :] <= q_positions[:, None]
      if static.has_prefix:
        in_order = in_order | ((q_ids[1][:, None] != 0) & (k_ids[1][None, :] != 0))
      self.visible = self.visible & in_order
    self.in_range = k_positions < static.key_length  # (bk,)
    self.table_ref, self.bucket = table_ref, None
    if static.buckets is not None:
      self.bucket = static.buckets(k_positions[None, :] - q_positions[:, None])  # (bq, bk)

  def logits(self, query: jax.Array, key: jax.Array) -> jax.Array:
    """(bq, bk): q.k plus the bias where visible, MASKED where not, -inf past the keys."""
    logits = _dot(query, key, (1, 1))
    if self.bucket is not None:
      logits = logits + self.table_ref[self.bucket]  # a gather from the head's row
    logits = jnp.where(self.visible, logits, MASKED)
    return jnp.where(self.in_range[None, :], logits, -jnp.inf)

  def gradients(self, query, key, value, d_out, m, l, delta):
    """The weights p and the logits' gradient ds = p (dp - delta), 0 where hidden; (bq, bk)."""
    p = jnp.exp(self.logits(query, key) - m[:, None]) / l[:, None]
    dp = _dot(d_out, value, (1, 1))
    return p, jnp.where(self.visible, p * (dp - delta[:, None]), 0.0)

  def bucket_sums(self, ds: jax.Array, sums: jax.Array) -> jax.Array:
    """sums (buckets,) plus ds summed by bucket, looping over the buckets the tile holds only."""
    ids = jnp.arange(sums.shape[0])

    def add(n, sums):
      return sums + jnp.where(ids == n, jnp.sum(jnp.where(self.bucket == n, ds, 0.0)), 0.0)

    return jax.lax.fori_loop(jnp.min(self.bucket), jnp.max(self.bucket) + 1, add, sums)


INPUTS = ('query', 'key', 'value', 'table', 'q_segments', 'k_segments', 'q_prefix', 'k_prefix')
ROWS = ('max', 'sum', 'delta')  # float32 per query: the forward's running max and sum, rowsum(do o)
QUERY_SIDE = ('query', 'q_segments', 'q_prefix', 'd_out', 'out', 'd_query', 'd_table') + ROWS


def _ids(refs: dict, side: str, where=slice(None)) -> tuple[jax.Array, jax.Array]:
  """The segments and prefix flags of side 'q' or 'k', at where."""
  return refs[f'{side}_segments'][where], refs[f'{side}_prefix'][where]


def _diagonal_blocks(static: _Static, q_block, bq: int, bk: int, key_blocks: int):
  """How many key blocks the query block q_block reads: causal, up to its diagonal's."""
  if static.causal and not static.has_prefix:
    return jax.lax.div((q_block + 1) * bq + bk - 1, bk)
  return key_blocks


def _forward_kernel(refs: dict, static: _Static):
  """out, and m and l for the backward, for one query block, looping over key blocks."""
  bq, bk = static.blocks.q, static.blocks.k
  i = pl.program_id(2)
  query, q_ids = refs['query'][...], _ids(refs, 'q')  # (bq, d), 2 x (bq,)

  def step(j, carry):
    out, m, l = carry
    keys = pl.ds(j * bk, bk)
    tile = _Tile(static, refs['table'], i * bq, j * bk, q_ids, _ids(refs, 'k', keys))
    logits = tile.logits(query, refs['key'][keys, :])
    m_next = jnp.maximum(m, jnp.max(logits, axis=1))
    correction = jnp.exp(m - m_next)
    p = jnp.exp(logits - m_next[:, None])
    value = refs['value'][keys, :]
    out = correction[:, None] * out + _dot(p.astype(value.dtype), value)
    return out, m_next, correction * l + jnp.sum(p, axis=1)

  carry = (jnp.zeros(query.shape, jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
           jnp.zeros((bq,), jnp.float32))
  blocks = _diagonal_blocks(static, i, bq, bk, refs['key'].shape[0] // bk)
  out, m, l = jax.lax.fori_loop(0, blocks, step, carry)
  refs['out'][...] = (out / l[:, None]).astype(refs['out'].dtype)
  refs['max'][...] = m
  refs['sum'][...] = l


def _d_query_kernel(refs: dict, static: _Static):
  """dq and the table's partial sums for one query block, looping over key blocks in order."""
  bq, bk = static.blocks.backward_q, static.blocks.backward_k
  i = pl.program_id(2)
  query, d_out, q_ids = refs['query'][...], refs['d_out'][...], _ids(refs, 'q')
  m, l, delta = (refs[name][...] for name in ROWS)

  def step(j, carry):
    d_query, sums = carry
    keys = pl.ds(j * bk, bk)
    tile = _Tile(static, refs['table'], i * bq, j * bk, q_ids, _ids(refs, 'k', keys))
    key = refs['key'][keys, :]
    _, ds = tile.gradients(query, key, refs['value'][keys, :], d_out, m, l, delta)
    if tile.bucket is not None:
      sums = tile.bucket_sums(ds, sums)
    return d_query + _dot(ds.astype(key.dtype), key), sums

  carry = (jnp.zeros(query.shape, jnp.float32), jnp.zeros(refs['d_table'].shape, jnp.float32))
  blocks = _diagonal_blocks(static, i, bq, bk, refs['key'].shape[0] // bk)
  d_query, sums = jax.lax.fori_loop(0, blocks, step, carry)
  refs['d_query'][...] = d_query.astype(refs['d_query'].dtype)
  refs['d_table'][...] = sums


def _d_key_value_kernel(refs: dict, static: _Static):
  """dk and dv for one key block, looping over query blocks."""
  bq, bk = static.blocks.backward_q, static.blocks.backward_k
  j = pl.program_id(2)
  key, value, k_ids = refs['key'][...], refs['value'][...], _ids(refs, 'k')

  def step(i, carry):
    d_key, d_value = carry
    queries = pl.ds(i * bq, bq)
    tile = _Tile(static, refs['table'], i * bq, j * bk, _ids(refs, 'q', queries), k_ids)
    query, d_out = refs['query'][queries, :], refs['d_out'][queries, :]
    m, l, delta = (refs[name][queries] for name in ROWS)
    p, ds = tile.gradients(query, key, value, d_out, m, l, delta)
    return (d_key + _dot(ds.astype(query.dtype), query, (0, 0)),
            d_value + _dot(p.astype(d_out.dtype), d_out, (0, 0)))

  # Causal: the query blocks before this key block's first key see none of it.
  first = jax.lax.div(j * bk, bq) if static.causal and not static.has_prefix else 0
  carry = (jnp.zeros(key.shape, jnp.float32), jnp.zeros(value.shape, jnp.float32))
  d_key, d_value = jax.lax.fori_loop(first, refs['query'].shape[0] // bq, step, carry)
  refs['d_key'][...] = d_key.astype(refs['d_key'].dtype)
  refs['d_value'][...] = d_value.astype(refs['d_value'].dtype)


def _spec(name: str, shape: tuple[int, ...], block: int, per: str) -> pl.BlockSpec:
  """The BlockSpec of one kernel array for a grid (batch, heads, blocks of `block` queries or
  keys: per 'q' or 'k'): that side's arrays in blocks, the other side's whole."""
  blocked = (name in QUERY_SIDE) == (per == 'q')
  if name == 'table':  # (h, buckets): the head's row
    return pl.BlockSpec((None, shape[1]), lambda b, h, i: (h, 0))
  if name == 'd_table':  # (b, h, query blocks, buckets)
    return pl.BlockSpec((None, None, None, shape[3]), lambda b, h, i: (b, h, i, 0))
  if len(shape) == 4:  # (b, length, h, d)
    return pl.BlockSpec((None, block if blocked else shape[1], None, shape[3]),
                        lambda b, h, i: (b, i if blocked else 0, h, 0))
  if name in ROWS:  # (b, h, q)
    return pl.BlockSpec((None, None, block if blocked else shape[2]),
                        lambda b, h, i: (b, h, i if blocked else 0))
  return pl.BlockSpec((None, block if blocked else shape[1]),  # ids (b, length)
                      lambda b, h, i: (b, i if blocked else 0))


def _call(kernel, static: _Static, block: int, per: str, inputs: dict, outputs: dict) -> list:
  """The kernel over a grid (batch, heads, blocks of `block` queries or keys); refs by name."""
  names = (*inputs, *outputs)
  batch, _, heads, _ = inputs['query'].shape
  length = inputs['query' if per == 'q' else 'key'].shape[1]
  return pl.pallas_call(
      lambda *refs: kernel(dict(zip(names, refs)), static),
      grid=(batch, heads, length // block),
      in_specs=[_spec(name, x.shape, block, per) for name, x in inputs.items()],
      out_specs=[_spec(name, x.shape, block, per) for name, x in outputs.items()],
      out_shape=list(outputs.values()), interpret=static.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
      name=kernel.__name__.strip('_'))(*inputs.values())


def _forward(static, query, key, value, table, query_segments, key_segments, prefix):
  inputs = _kernel_inputs(static, query, key, value, table, query_segments, key_segments, prefix)
  batch, q_length, heads, _ = inputs['query'].shape
  rows = jax.ShapeDtypeStruct((batch, heads, q_length), jnp.float32)
  out, m, l = _call(_forward_kernel, static, static.blocks.q, 'q', inputs,
                    {'out': jax.ShapeDtypeStruct(inputs['query'].shape, query.dtype),
                     'max': rows, 'sum': rows})
  # the backward reads the padded inputs and output as the kernels have them
  return out[:, :static.query_length, :, :query.shape[-1]], (inputs, out, m, l, table)


def _backward(static, residuals, d_out):
  inputs, out, m, l, table = residuals
  batch, q_length, heads, head_dim = inputs['query'].shape
  d = d_out.shape[-1]
  d_out = _padded(_padded(d_out, q_length), head_dim, axis=3)
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # (b, q, h)
  inputs = {**inputs, 'd_out': d_out, 'max': m, 'sum': l,
            'delta': delta.transpose(0, 2, 1)}  # (b, h, q), 0 on padding
  bq, bk = static.blocks.backward_q, static.blocks.backward_k
  d_query, d_table = _call(
      _d_query_kernel, static, bq, 'q', inputs,
      {'d_query': jax.ShapeDtypeStruct(inputs['query'].shape, inputs['query'].dtype),
       'd_table': jax.ShapeDtypeStruct((batch, heads, q_length // bq, inputs['table'].shape[1]),
                                       jnp.float32)})
  d_key, d_value = _call(
      _d_key_value_kernel, static, bk, 'k', inputs,
      {'d_key': jax.ShapeDtypeStruct(inputs['key'].shape, inputs['key'].dtype),
       'd_value': jax.ShapeDtypeStruct(inputs['value'].shape, inputs['value'].dtype)})
  d_table = jnp.sum(d_table, axis=(0, 2))[:, :table.shape[0]].T  # (h, buckets) -> (buckets, h)
  q_length, k_length = static.query_length, static.key_length
  return (d_query[:, :q_length, :, :d], d_key[:, :k_length, :, :d],
          d_value[:, :k_length, :, :d], d_table.astype(table.dtype), None, None, None)


_attention.defvjp(lambda static, *args: _forward(static, *args), _backward)
