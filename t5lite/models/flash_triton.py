"""The flash kernels compiled by Triton for NVIDIA GPUs (and run by Pallas' interpreter).

The forward pass, for one (batch row, head) and one block of queries (a program of the grid):

           keys:  0 ... bk ... 2bk ...                lk
        +-------+-------+-------+-------+--   - -+
  q[i]  | tile  | tile  | tile  | tile  |   ...    |   loop over key blocks j: s = q.k + bias,
  (bq)  | (i,0) | (i,1) | (i,2) | (i,3) |          |   mask, online softmax (running max m,
        +-------+-------+-------+-------+--   - -+   sum l, output acc), as FlashAttention-2
  bias[r, c] = table[head, bucket(k_start + c - q_start - r)]   (a gather from a 32-entry row)

The loop covers only the key blocks `flash_tiles.key_blocks` names: a causal stack stops at the
block holding the diagonal, a window reads the blocks it reaches; the others add exactly 0.

The backward pass is two kernels, neither with atomics: dq (a program per query block, a loop
over key blocks) and dk, dv (a program per key block, a loop over query blocks), each recomputing
the tile's weights from the m and l the forward saved. The table's gradient is the sum over every
visible entry of ds = p * (dp - rowsum(do * o)), grouped by bucket:

  dq's program (b, h, i) --> partial[b, h, i, n] = sum of ds over its tiles' entries in bucket n
                             (its key blocks in order; per tile a loop over the buckets present:
                             one for a tile whose distances all lie past max_distance)
  XLA then sums partial over b and i (a plain reduction, fixed order) --> d_table (buckets, heads)
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from t5lite.models.flash_tiles import (MASKED, Static, dot, key_blocks, lengths, padded,
                                       padded_ids, query_blocks, visible)


def _kernel_inputs(static, query, key, value, table, query_segments, key_segments, prefix
                   ) -> dict:
  """The kernels' inputs by name, padded (`flash_tiles.padded_ids`), heads to a power of 2; the
  table as (heads, buckets) rows, float32, padded to a power of 2."""
  q_length, k_length = lengths(static)
  head_dim = pl.next_power_of_2(query.shape[-1])
  rows = padded(table.astype(jnp.float32).T, pl.next_power_of_2(table.shape[0]))
  ids = padded_ids(static, query_segments, key_segments, prefix)
  arrays = [padded(padded(x, length), head_dim, axis=3)
            for x, length in ((query, q_length), (key, k_length), (value, k_length))]
  return dict(zip(INPUTS, (*arrays, rows, *ids)))


class _Tile:
  """One (query block, key block) tile: its mask, buckets and float32 logits and weights.

  q_ids and k_ids: the (segments, prefix) of its queries (bq,) and keys (bk,)."""

  def __init__(self, static: Static, table_ref, q_start, k_start, q_ids, k_ids):
    q_positions = q_start + jnp.arange(q_ids[0].shape[0])
    k_positions = k_start + jnp.arange(k_ids[0].shape[0])
    self.visible = visible(static, q_positions[:, None], k_positions[None, :],
                           [x[:, None] for x in q_ids], [x[None, :] for x in k_ids])  # (bq, bk)
    self.in_range = k_positions < static.key_length  # (bk,)
    self.table_ref, self.bucket = table_ref, None
    if static.buckets is not None:
      self.bucket = static.buckets(k_positions[None, :] - q_positions[:, None])  # (bq, bk)

  def logits(self, query: jax.Array, key: jax.Array) -> jax.Array:
    """(bq, bk): q.k plus the bias where visible, MASKED where not, -inf past the keys."""
    logits = dot(query, key, (1, 1))
    if self.bucket is not None:
      logits = logits + self.table_ref[self.bucket]  # a gather from the head's row
    logits = jnp.where(self.visible, logits, MASKED)
    return jnp.where(self.in_range[None, :], logits, -jnp.inf)

  def gradients(self, query, key, value, d_out, m, l, delta):
    """The weights p and the logits' gradient ds = p (dp - delta), 0 where hidden; (bq, bk)."""
    p = jnp.exp(self.logits(query, key) - m[:, None]) / l[:, None]
    dp = dot(d_out, value, (1, 1))
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


def _forward_kernel(refs: dict, static: Static):
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
    out = correction[:, None] * out + dot(p.astype(value.dtype), value)
    return out, m_next, correction * l + jnp.sum(p, axis=1)

  carry = (jnp.zeros(query.shape, jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
           jnp.zeros((bq,), jnp.float32))
  first, end = key_blocks(static, i, bq, bk, refs['key'].shape[0] // bk)
  out, m, l = jax.lax.fori_loop(first, end, step, carry)
  total = jnp.where(l == 0, 1.0, l)  # 0: no key read (a query past them all)
  refs['out'][...] = (out / total[:, None]).astype(refs['out'].dtype)
  refs['max'][...] = m
  refs['sum'][...] = l


def _d_query_kernel(refs: dict, static: Static):
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
    return d_query + dot(ds.astype(key.dtype), key), sums

  carry = (jnp.zeros(query.shape, jnp.float32), jnp.zeros(refs['d_table'].shape, jnp.float32))
  first, end = key_blocks(static, i, bq, bk, refs['key'].shape[0] // bk)
  d_query, sums = jax.lax.fori_loop(first, end, step, carry)
  refs['d_query'][...] = d_query.astype(refs['d_query'].dtype)
  refs['d_table'][...] = sums


def _d_key_value_kernel(refs: dict, static: Static):
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
    return (d_key + dot(ds.astype(query.dtype), query, (0, 0)),
            d_value + dot(p.astype(d_out.dtype), d_out, (0, 0)))

  carry = (jnp.zeros(key.shape, jnp.float32), jnp.zeros(value.shape, jnp.float32))
  first, end = query_blocks(static, j, bq, bk, refs['query'].shape[0] // bq)
  d_key, d_value = jax.lax.fori_loop(first, end, step, carry)
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


def _call(kernel, static: Static, block: int, per: str, inputs: dict, outputs: dict) -> list:
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


def forward(static, query, key, value, table, query_segments, key_segments, prefix):
  """The output (b, q, h, d) and what the backward reads."""
  inputs = _kernel_inputs(static, query, key, value, table, query_segments, key_segments, prefix)
  batch, q_length, heads, _ = inputs['query'].shape
  rows = jax.ShapeDtypeStruct((batch, heads, q_length), jnp.float32)
  out, m, l = _call(_forward_kernel, static, static.blocks.q, 'q', inputs,
                    {'out': jax.ShapeDtypeStruct(inputs['query'].shape, query.dtype),
                     'max': rows, 'sum': rows})
  # the backward reads the padded inputs and output as the kernels have them
  return out[:, :static.query_length, :, :query.shape[-1]], (inputs, out, m, l, table)


def backward(static, residuals, d_out):
  """The gradients of query, key, value and table."""
  inputs, out, m, l, table = residuals
  batch, q_length, heads, head_dim = inputs['query'].shape
  d = d_out.shape[-1]
  d_out = padded(padded(d_out, q_length), head_dim, axis=3)
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
          d_value[:, :k_length, :, :d], d_table.astype(table.dtype))

