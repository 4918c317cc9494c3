"""Building blocks of every stack: parameters with logical axes, dense, embedding, norms, MLP.

Every parameter carries its logical axis names (`embed, mlp, heads, kv, vocab, layers,
relpos_buckets`; None for an unsharded dim) as the descriptive `out_sharding` metadata of its
`nnx.Param`, with eager sharding off: building a model needs no mesh, and the trainer maps the
names to mesh axes with its own rule table (see `params.logical_axes`). Activations are pinned at
block boundaries with `constrain`, which maps logical names through the rules in flax's context.
"""

import math
from collections.abc import Sequence

from flax import nnx
import flax.core.spmd
from flax.linen import partitioning
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig


def mesh_spec(logical_axes: Sequence[str | None]) -> jax.sharding.PartitionSpec | None:
  """The mesh axes of logical names, or None without axis rules or a mesh.

  The rules are those set by `nnx.logical_axis_rules(rules)` and the mesh the one set by
  `jax.set_mesh(mesh)`, so the model never needs to know the trainer's table.
  """
  rules = flax.core.spmd.get_logical_axis_rules()
  if not rules or jax.sharding.get_abstract_mesh().empty:
    return None
  return partitioning.logical_to_mesh_axes(tuple(logical_axes), rules)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """Pins an activation's sharding by logical names; a no-op without axis rules or a mesh."""
  spec = mesh_spec(logical_axes)
  return x if spec is None else jax.lax.with_sharding_constraint(x, spec)


def param(rngs: nnx.Rngs, init, shape: Sequence[int], axes: Sequence[str | None],
          cfg: ModelConfig) -> nnx.Param:
  """A parameter with its logical axis names as descriptive metadata (never sharded eagerly)."""
  if len(axes) != len(shape):
    raise ValueError(f'logical axes {axes} do not match parameter shape {shape}')
  value = init(rngs.params(), tuple(shape), jnp.dtype(cfg.param_dtype))
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class Dense(nnx.Module):
  """A bias-optional linear map whose kernel keeps separate (heads, kv) dims for sharding."""

  def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int],
               axes: Sequence[str | None], *, std: float, cfg: ModelConfig, rngs: nnx.Rngs):
    self.num_in = len(in_shape)
    self.dtype = jnp.dtype(cfg.dtype)
    self.kernel = param(rngs, jax.nn.initializers.normal(std), (*in_shape, *out_shape), axes, cfg)
    self.bias = (param(rngs, jax.nn.initializers.zeros, out_shape, axes[self.num_in:], cfg)
                 if cfg.use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.kernel[...].astype(self.dtype)
    in_size = math.prod(kernel.shape[:self.num_in])
    # (..., *in) -> (tokens, in) x (in, out) -> (..., *out): one 2-D matmul, so each weight
    # gradient contracts a single dimension and XLA:CPU copies no transposed activations
    # (22% of a t5_tiny step on CPU; see docs/notes/train-step-cpu.md).
    y = x.astype(self.dtype).reshape(-1, in_size) @ kernel.reshape(in_size, -1)
    y = y.reshape(*x.shape[:x.ndim - self.num_in], *kernel.shape[self.num_in:])
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class Embed(nnx.Module):
  """A lookup table; `attend` reuses it as the output projection (T5's tied lm head)."""

  def __init__(self, num_embeddings: int, features: int, axes: Sequence[str | None], *,
               std: float, cfg: ModelConfig, rngs: nnx.Rngs):
    self.dtype = jnp.dtype(cfg.dtype)
    self.embedding = param(rngs, jax.nn.initializers.normal(std), (num_embeddings, features),
                           axes, cfg)

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)  # (b, l) -> (b, l, d)

  def attend(self, x: jax.Array) -> jax.Array:
    """Float32 logits against every row of the table."""
    table = self.embedding[...].astype(self.dtype)
    # (b, l, d) x (v, d) -> (b, l, v)
    return jnp.einsum('bld,vd->blv', x.astype(self.dtype), table,
                      preferred_element_type=jnp.float32)


class Norm(nnx.Module):
  """RMSNorm (T5: scale only, no mean) or LayerNorm (scale and bias), computed in float32."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.kind, self.eps, self.dtype = cfg.norm, cfg.norm_eps, jnp.dtype(cfg.dtype)
    self.scale = param(rngs, jax.nn.initializers.ones, (cfg.d_model,), ('embed',), cfg)
    self.bias = (param(rngs, jax.nn.initializers.zeros, (cfg.d_model,), ('embed',), cfg)
                 if cfg.norm == 'layer' else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    if self.kind == 'layer':
      x = x - jnp.mean(x, axis=-1, keepdims=True)
    x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
    x = x * self.scale[...].astype(jnp.float32)
    if self.bias is not None:
      x = x + self.bias[...].astype(jnp.float32)
    return x.astype(self.dtype)


ACTIVATION_FUNCTIONS = {
    'relu': jax.nn.relu,
    'gelu': lambda x: jax.nn.gelu(x, approximate=True),
    'gelu_erf': lambda x: jax.nn.gelu(x, approximate=False),
    'silu': jax.nn.silu,
}


class MLP(nnx.Module):
  """The feed-forward block: act(x wi) wo, or T5 v1.1's gated act(x wi_0) * (x wi_1) wo."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    def dense(d_in, d_out, axes):
      return Dense((d_in,), (d_out,), axes, std=d_in**-0.5, cfg=cfg, rngs=rngs)

    self.act = ACTIVATION_FUNCTIONS[cfg.activation.removeprefix('gated-')]
    self.gated = cfg.is_gated
    if self.gated:
      self.wi_0 = dense(cfg.d_model, cfg.d_ff, ('embed', 'mlp'))
      self.wi_1 = dense(cfg.d_model, cfg.d_ff, ('embed', 'mlp'))
    else:
      self.wi = dense(cfg.d_model, cfg.d_ff, ('embed', 'mlp'))
    self.wo = dense(cfg.d_ff, cfg.d_model, ('mlp', 'embed'))
    self.dropout = nnx.Dropout(cfg.dropout)

  def __call__(self, x: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
    if self.gated:
      h = self.act(self.wi_0(x)) * self.wi_1(x)
    else:
      h = self.act(self.wi(x))
    h = constrain(h, ('batch', 'length', 'mlp'))
    h = self.dropout(h, deterministic=deterministic, rngs=rngs)
    return self.wo(h)
