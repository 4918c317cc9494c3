"""The flash kernels compiled by Mosaic for TPUs (and run by Pallas' interpreter).

A grid step is one tile: (batch row, head, outer block, step), the outer block a block of
queries (forward, dq) or of keys (dk and dv), the steps the other side's blocks it reads
(`flash_tiles.key_blocks`; Pallas fetches the next tile's blocks while this one computes, and a
step past the last block repeats it: no fetch, no work). Running max, sum and accumulators live
in VMEM scratch across the steps, as in JAX's TPU flash attention.

Mosaic has no gather from a vector, so the bias is not looked up per entry. Its value depends on
c - r only, so a tile of bq queries by bk keys is a Toeplitz matrix: one row of bq + bk - 1
distances, bucketed (integer thresholds), becomes one row of biases by a one-hot matmul with the
head's table row, and lane rolls lay it out as the tile, row r the row rolled by r:

  row[t] = bias(k_start - q_start - (bq - 1) + t),   tile[r, c] = row[c - r + bq - 1]

         c:   0        1        2             (bq = bk = 3)
  r 0  [ row[2]   row[3]   row[4] ]     the table's gradient undoes it: the tile of ds widened to
    1  [ row[1]   row[2]   row[3] ]     bq + bk lanes, row r rolled back by r, summed over rows:
    2  [ row[0]   row[1]   row[2] ]     one sum per diagonal (per distance); a one-hot matmul adds
                                        each to its bucket

The table's partial sums are one (1, buckets) row per (batch row, head, query block), written by
the dq kernel after its steps in order, and summed by XLA: no atomics, the same bits every run.
The dk/dv kernel holds its tiles transposed (keys along sublanes), so that the per-query max, sum
and rowsum(do * o), kept as lane-dense rows (b, h, 1, q) in HBM, broadcast without a transpose;
the forward and dq kernels transpose them (and the query ids) once per query block. Tested, in
Pallas' interpreter, against the dense einsum path (tests/models/test_flash_attention.py), and
compiled by libtpu for TPU v4, v5e, v5p and v6e (tests/models/test_flash_tpu_compile.py).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from t5lite.models.flash_tiles import (MASKED, Static, dot, key_blocks, lengths, most_blocks,
                                       padded, padded_ids, query_blocks, visible)

LANES = 128  # a vector register's lanes: the table's row is padded to them
IDS = ('q_segments', 'k_segments', 'q_prefix', 'k_prefix')  # (b, 1, length) int32
ROWS = ('max', 'inverse_sum', 'delta')  # (b, h, 1, q) float32: m, 1/l, rowsum(do * o)


def _column(row: jax.Array) -> jax.Array:
  """(1, n) -> (n, LANES), each row the entry repeated: a transpose Mosaic lays out natively."""
  return jnp.transpose(jnp.broadcast_to(row, (LANES, row.shape[1])))


def _toeplitz(row: jax.Array, rows: int, columns: int) -> jax.Array:
  """(1, rows + columns) -> (rows, columns) with tile[r, c] = row[c - r + rows - 1].

  Plain lane rolls: the first 8 rows (a vector register's sublanes) the row rolled by 0, 1, ...,
  7, each next 8 those rolled by 8 more. (Mosaic's strided roll does it in one on v5 and v6 but
  not on v4, and only within 8 sublanes.)"""
  width = row.shape[1]
  first = jnp.concatenate([pltpu.roll(row, b, 1) for b in range(8)], axis=0)  # (8, width)
  eights = [pltpu.roll(first, (8 * g - rows + 1) % width, 1) for g in range(rows // 8)]
  return jnp.concatenate(eights, axis=0)[:, :columns]


def _diagonal_sums(tile: jax.Array) -> jax.Array:
  """(rows, columns) -> (1, rows + columns): sums[t] = sum of tile[r, c] over c - r + rows - 1 = t,
  `_toeplitz`'s transpose: row r rolled back by r, in two plain rolls (Mosaic has no negative
  stride): each 8 rows by their first's, summed, then each of the 8 by its place among them."""
  rows, columns = tile.shape
  width = rows + columns
  wide = jnp.concatenate([tile, jnp.zeros((rows, rows), tile.dtype)], axis=1)  # (rows, width)
  eights = sum(pltpu.roll(wide[8 * g:8 * g + 8], (rows - 1 - 8 * g) % width, 1)
               for g in range(rows // 8))  # (8, width)
  return sum(pltpu.roll(eights[b:b + 1], (width - b) % width, 1) for b in range(8))


class _Tile:
  """One tile's mask and bias, queries along rows, or along columns (transposed: dk and dv's).

  q_ids and k_ids: (segments, prefix) as columns or rows to broadcast against each other."""

  def __init__(self, static: Static, table_ref, q_start, k_start, shape, q_ids, k_ids,
               transposed: bool = False):
    q_axis = 1 if transposed else 0
    q_positions = q_start + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
    k_positions = k_start + jax.lax.broadcasted_iota(jnp.int32, shape, 1 - q_axis)
    self.visible = visible(static, q_positions, k_positions, q_ids, k_ids)
    self.in_range = k_positions < static.key_length
    self.bias, self.one_hot = None, None
    if static.buckets is not None:
      rows, columns = shape
      t = jax.lax.broadcasted_iota(jnp.int32, (1, rows + columns), 1)
      # the tile's distances k - q along the Toeplitz row (see the module's figure)
      distance = (k_start - q_start + rows - 1 - t if transposed
                  else k_start - q_start - (rows - 1) + t)
      buckets = jax.lax.broadcasted_iota(jnp.int32, (table_ref.shape[1], rows + columns), 0)
      self.one_hot = (buckets == static.buckets(distance)).astype(jnp.float32)  # (n, width)
      table = jnp.broadcast_to(table_ref[...], (8, table_ref.shape[1]))  # (8, n): 8 sublanes
      self.bias = _toeplitz(dot(table, self.one_hot)[:1], rows, columns)

  def logits(self, a: jax.Array, b: jax.Array) -> jax.Array:
    """a . b (q.k, or k.q transposed) plus the bias where visible, MASKED where not, -inf past
    the keys."""
    logits = dot(a, b, (1, 1))
    if self.bias is not None:
      logits = logits + self.bias
    return jnp.where(self.in_range, jnp.where(self.visible, logits, MASKED), -jnp.inf)

  def bucket_sums(self, ds: jax.Array) -> jax.Array:
    """(1, n): ds (queries along rows) summed by bucket."""
    diagonals = jnp.broadcast_to(_diagonal_sums(ds), (8, self.one_hot.shape[1]))
    return dot(diagonals, self.one_hot, (1, 1))[:1]


def _ids(refs: dict, side: str) -> tuple[jax.Array, jax.Array]:
  """The (1, block) rows of side 'q' or 'k': its segments and prefix flags."""
  return refs[f'{side}_segments'][...], refs[f'{side}_prefix'][...]


def _forward_kernel(static: Static, refs: dict, scratch: dict):
  """out, m and 1/l for one query block, a step per key block."""
  bq, bk = static.blocks.q, static.blocks.k
  i, step = pl.program_id(2), pl.program_id(3)
  first, end = key_blocks(static, i, bq, bk, lengths(static)[1] // bk)

  @pl.when(step == 0)
  def _start():
    scratch['max'][...] = jnp.full(scratch['max'].shape, -jnp.inf, jnp.float32)
    scratch['sum'][...] = jnp.zeros(scratch['sum'].shape, jnp.float32)
    scratch['out'][...] = jnp.zeros(scratch['out'].shape, jnp.float32)
    for name, row in zip(('segments', 'prefix'), _ids(refs, 'q')):
      scratch[name][...] = _column(row)

  @pl.when(first + step < end)
  def _tile():
    q_ids = scratch['segments'][:, :1], scratch['prefix'][:, :1]
    tile = _Tile(static, refs['table'], i * bq, (first + step) * bk, (bq, bk), q_ids,
                 _ids(refs, 'k'))
    logits = tile.logits(refs['query'][...], refs['key'][...])
    m = scratch['max'][:, :1]
    m_next = jnp.maximum(m, jnp.max(logits, axis=1, keepdims=True))
    correction = jnp.exp(m - m_next)
    p = jnp.exp(logits - m_next)
    value = refs['value'][...]
    scratch['out'][...] = correction * scratch['out'][...] + dot(p.astype(value.dtype), value)
    total = correction * scratch['sum'][:, :1] + jnp.sum(p, axis=1, keepdims=True)
    scratch['max'][...] = jnp.broadcast_to(m_next, scratch['max'].shape)
    scratch['sum'][...] = jnp.broadcast_to(total, scratch['sum'].shape)

  @pl.when(step == pl.num_programs(3) - 1)
  def _finish():
    total = scratch['sum'][...]
    inverse = jnp.where(total == 0, 0.0, 1 / total)  # 0: no key read (a query past them all)
    refs['out'][...] = (scratch['out'][...] * inverse[:, :1]).astype(refs['out'].dtype)
    refs['max'][...] = jnp.transpose(jnp.maximum(scratch['max'][...], MASKED))[:1]
    refs['inverse_sum'][...] = jnp.transpose(inverse)[:1]


def _d_query_kernel(static: Static, refs: dict, scratch: dict):
  """dq and the table's partial sums for one query block, a step per key block in order."""
  bq, bk = static.blocks.backward_q, static.blocks.backward_k
  i, step = pl.program_id(2), pl.program_id(3)
  first, end = key_blocks(static, i, bq, bk, lengths(static)[1] // bk)

  @pl.when(step == 0)
  def _start():
    scratch['d_query'][...] = jnp.zeros(scratch['d_query'].shape, jnp.float32)
    scratch['d_table'][...] = jnp.zeros(scratch['d_table'].shape, jnp.float32)
    for name in ROWS:
      scratch[name][...] = _column(refs[name][...])
    for name, row in zip(('segments', 'prefix'), _ids(refs, 'q')):
      scratch[name][...] = _column(row)

  @pl.when(first + step < end)
  def _tile():
    q_ids = scratch['segments'][:, :1], scratch['prefix'][:, :1]
    tile = _Tile(static, refs['table'], i * bq, (first + step) * bk, (bq, bk), q_ids,
                 _ids(refs, 'k'))
    key, value = refs['key'][...], refs['value'][...]
    m, inverse, delta = (scratch[name][:, :1] for name in ROWS)
    p = jnp.exp(tile.logits(refs['query'][...], key) - m) * inverse
    dp = dot(refs['d_out'][...], value, (1, 1))
    ds = jnp.where(tile.visible, p * (dp - delta), 0.0)
    scratch['d_query'][...] += dot(ds.astype(key.dtype), key)
    if tile.one_hot is not None:
      scratch['d_table'][...] += tile.bucket_sums(ds)

  @pl.when(step == pl.num_programs(3) - 1)
  def _finish():
    refs['d_query'][...] = scratch['d_query'][...].astype(refs['d_query'].dtype)
    refs['d_table'][...] = scratch['d_table'][...]


def _d_key_value_kernel(static: Static, refs: dict, scratch: dict):
  """dk and dv for one key block, a step per query block, the tiles transposed (bk, bq)."""
  bq, bk = static.blocks.backward_q, static.blocks.backward_k
  j, step = pl.program_id(2), pl.program_id(3)
  first, end = query_blocks(static, j, bq, bk, lengths(static)[0] // bq)

  @pl.when(step == 0)
  def _start():
    scratch['d_key'][...] = jnp.zeros(scratch['d_key'].shape, jnp.float32)
    scratch['d_value'][...] = jnp.zeros(scratch['d_value'].shape, jnp.float32)
    for name, row in zip(('segments', 'prefix'), _ids(refs, 'k')):
      scratch[name][...] = _column(row)

  @pl.when(first + step < end)
  def _tile():
    k_ids = scratch['segments'][:, :1], scratch['prefix'][:, :1]
    tile = _Tile(static, refs['table'], (first + step) * bq, j * bk, (bk, bq), _ids(refs, 'q'),
                 k_ids, transposed=True)
    query, d_out = refs['query'][...], refs['d_out'][...]
    m, inverse, delta = (refs[name][...] for name in ROWS)  # (1, bq) rows
    p = jnp.exp(tile.logits(refs['key'][...], query) - m) * inverse  # (bk, bq)
    dp = dot(refs['value'][...], d_out, (1, 1))
    ds = jnp.where(tile.visible, p * (dp - delta), 0.0)
    scratch['d_value'][...] += dot(p.astype(d_out.dtype), d_out)
    scratch['d_key'][...] += dot(ds.astype(query.dtype), query)

  @pl.when(step == pl.num_programs(3) - 1)
  def _finish():
    refs['d_key'][...] = scratch['d_key'][...].astype(refs['d_key'].dtype)
    refs['d_value'][...] = scratch['d_value'][...].astype(refs['d_value'].dtype)


Q_SIDE = ('query', 'd_out', 'out', 'd_query', 'q_segments', 'q_prefix', 'd_table') + ROWS


def _spec(name: str, shape: tuple[int, ...], blocks: tuple[int, int], tile_of) -> pl.BlockSpec:
  """The BlockSpec of one kernel array on a grid (b, h, outer, step); tile_of(outer, step) is the
  (query block, key block) of a step."""
  q_side = name in Q_SIDE
  block = blocks[0] if q_side else blocks[1]

  def index(b, h, outer, step):
    return tile_of(outer, step)[0 if q_side else 1]

  if name == 'table':  # (h, 1, n): the head's row
    return pl.BlockSpec((None, 1, shape[2]), lambda b, h, o, s: (h, 0, 0))
  if name == 'd_table':  # (b, h, query blocks, 1, n)
    return pl.BlockSpec((None, None, None, 1, shape[4]),
                        lambda b, h, o, s: (b, h, index(b, h, o, s), 0, 0))
  if name in ROWS:  # (b, h, 1, q)
    return pl.BlockSpec((None, None, 1, block), lambda b, h, o, s: (b, h, 0, index(b, h, o, s)))
  if name in IDS:  # (b, 1, length)
    return pl.BlockSpec((None, 1, block), lambda b, h, o, s: (b, 0, index(b, h, o, s)))
  return pl.BlockSpec((None, None, block, shape[3]),  # (b, h, length, d)
                      lambda b, h, o, s: (b, h, index(b, h, o, s), 0))


def _call(kernel, static: Static, blocks: tuple[int, int], per: str, inputs: dict,
          outputs: dict, scratch: dict) -> list:
  """The kernel on a grid (batch, heads, blocks of queries or keys (per 'q' or 'k'), steps over
  the other side's blocks); refs and scratch by name."""
  batch, heads, q_length, _ = inputs['query'].shape
  counts = (q_length // blocks[0], inputs['key'].shape[2] // blocks[1])
  if per == 'q':
    steps = most_blocks(static, blocks[0], blocks[1], counts[1])
    ranges = functools.partial(key_blocks, static, bq=blocks[0], bk=blocks[1], count=counts[1])
  else:
    steps = most_blocks(static, blocks[1], blocks[0], counts[0])
    ranges = functools.partial(query_blocks, static, bq=blocks[0], bk=blocks[1], count=counts[0])

  def tile_of(outer, step):  # a step past the last block repeats it: nothing new is fetched
    first, end = ranges(outer)
    other = jnp.maximum(jnp.minimum(first + step, end - 1), 0)
    return (outer, other) if per == 'q' else (other, outer)

  names = (*inputs, *outputs)

  def body(*refs):
    kernel(static, dict(zip(names, refs)), dict(zip(scratch, refs[len(names):])))

  return pl.pallas_call(
      body, grid=(batch, heads, counts[0] if per == 'q' else counts[1], steps),
      in_specs=[_spec(name, x.shape, blocks, tile_of) for name, x in inputs.items()],
      out_specs=[_spec(name, x.shape, blocks, tile_of) for name, x in outputs.items()],
      out_shape=list(outputs.values()), scratch_shapes=list(scratch.values()),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary')),
      interpret=static.interpret, name=kernel.__name__.strip('_'))(*inputs.values())


def _kernel_inputs(static, query, key, value, table, query_segments, key_segments, prefix):
  """The kernels' inputs by name: heads first (b, h, length, d), padded to whole blocks; ids as
  (b, 1, length) rows (`flash_tiles.padded_ids`); the table as (h, 1, buckets padded to lanes)."""
  q_length, k_length = lengths(static)
  arrays = [padded(x, length).transpose(0, 2, 1, 3)
            for x, length in ((query, q_length), (key, k_length), (value, k_length))]
  buckets = pl.cdiv(table.shape[0], LANES) * LANES
  rows = padded(table.astype(jnp.float32).T, buckets)[:, None, :]  # (h, 1, n)
  ids = [x[:, None, :] for x in padded_ids(static, query_segments, key_segments, prefix)]
  return dict(zip(('query', 'key', 'value', 'table', *IDS), (*arrays, rows, *ids)))


def _scratch(rows: int, **shapes) -> dict:
  """VMEM scratch: the named float32 arrays, and a block of `rows` ids as columns."""
  scratch = {name: pltpu.VMEM(shape, jnp.float32) for name, shape in shapes.items()}
  return {**scratch, 'segments': pltpu.VMEM((rows, LANES), jnp.int32),
          'prefix': pltpu.VMEM((rows, LANES), jnp.int32)}


def forward(static, query, key, value, table, query_segments, key_segments, prefix):
  """The output (b, q, h, d) and what the backward reads."""
  inputs = _kernel_inputs(static, query, key, value, table, query_segments, key_segments, prefix)
  batch, heads, q_length, d = inputs['query'].shape
  row = jax.ShapeDtypeStruct((batch, heads, 1, q_length), jnp.float32)
  blocks = (static.blocks.q, static.blocks.k)
  out, m, inverse = _call(
      _forward_kernel, static, blocks, 'q', inputs,
      {'out': jax.ShapeDtypeStruct(inputs['query'].shape, query.dtype), 'max': row,
       'inverse_sum': row},
      _scratch(blocks[0], max=(blocks[0], LANES), sum=(blocks[0], LANES), out=(blocks[0], d)))
  result = out.transpose(0, 2, 1, 3)[:, :static.query_length]  # (b, h, q, d) -> (b, q, h, d)
  return result, (inputs, out, m, inverse, table)


def backward(static, residuals, d_out):
  """The gradients of query, key, value and table."""
  inputs, out, m, inverse, table = residuals
  batch, heads, q_length, d = inputs['query'].shape
  d_out = padded(d_out, q_length).transpose(0, 2, 1, 3)  # (b, h, q, d)
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # (b, h, q)
  inputs = {**inputs, 'd_out': d_out, 'max': m, 'inverse_sum': inverse,
            'delta': delta[:, :, None, :]}
  blocks = (static.blocks.backward_q, static.blocks.backward_k)
  buckets = inputs['table'].shape[2]
  d_query, d_table = _call(
      _d_query_kernel, static, blocks, 'q', inputs,
      {'d_query': jax.ShapeDtypeStruct(inputs['query'].shape, inputs['query'].dtype),
       'd_table': jax.ShapeDtypeStruct((batch, heads, q_length // blocks[0], 1, buckets),
                                       jnp.float32)},
      _scratch(blocks[0], d_query=(blocks[0], d), d_table=(1, buckets),
               **dict.fromkeys(ROWS, (blocks[0], LANES))))
  d_key, d_value = _call(
      _d_key_value_kernel, static, blocks, 'k', inputs,
      {'d_key': jax.ShapeDtypeStruct(inputs['key'].shape, inputs['key'].dtype),
       'd_value': jax.ShapeDtypeStruct(inputs['value'].shape, inputs['value'].dtype)},
      _scratch(blocks[1], d_key=(blocks[1], d), d_value=(blocks[1], d)))
  d_table = jnp.sum(d_table, axis=(0, 2, 3))[:, :table.shape[0]].T  # (h, n) -> (buckets, h)
  q_length, k_length = static.query_length, static.key_length
  return (d_query.transpose(0, 2, 1, 3)[:, :q_length], d_key.transpose(0, 2, 1, 3)[:, :k_length],
          d_value.transpose(0, 2, 1, 3)[:, :k_length], d_table.astype(table.dtype))
