"""Learning-rate schedules and optimizers, built from the config's `optim` section with optax.

Adafactor with T5's settings is the default (what T5 and T5X pretrain with); AdamW, and nanoT5's
AdamW with Adafactor's parameter-scale step, are the alternatives nanoT5 found to train T5 fast.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

SCHEDULES = ('rsqrt', 'cosine', 'constant')
OPTIMIZERS = ('adafactor', 'adamw', 'adamw_scaled')


def make_schedule(optim_cfg, total_steps: int) -> optax.Schedule:
  """The learning rate at each step (counted from 0).

  rsqrt (T5): `learning_rate` for the first `warmup_steps`, then decaying as
  `learning_rate * sqrt(warmup_steps / step)`; T5's 0.01 and 10k give 1/sqrt(max(step, 1e4)).
  cosine: linear warmup from 0 to `learning_rate`, then cosine decay to 0 at `total_steps`.
  constant: `learning_rate` throughout (warmup_steps unused).
  """
  name = optim_cfg.schedule
  lr, warmup = float(optim_cfg.learning_rate), int(optim_cfg.warmup_steps)
  if name == 'rsqrt':
    if warmup <= 0:
      raise ValueError(f'optim.schedule=rsqrt needs optim.warmup_steps > 0, got {warmup}')
    return lambda step: lr * jnp.sqrt(warmup / jnp.maximum(step, warmup))
  if name == 'cosine':
    if not 0 <= warmup < total_steps:
      raise ValueError(f'optim.warmup_steps={warmup} must be below the {total_steps} training '
                       'steps for the cosine schedule')
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total_steps, end_value=0.0)
  if name == 'constant':
    return optax.constant_schedule(lr)
  raise ValueError(f'optim.schedule={name!r} is not one of {", ".join(SCHEDULES)}')


def adamw_scaled(learning_rate, weight_decay: float = 0.0) -> optax.GradientTransformation:
  """nanoT5's AdamWScale: the Adam step times max(1e-3, RMS(param)), as Adafactor scales its step.

  Makes the step relative to each tensor's size, which lets T5 train with Adafactor-like learning
  rates (nanoT5: 2e-2 with cosine). eps 1e-6 as nanoT5 (which adds it before bias correction; the
  difference is negligible). Weight decay is decoupled and scaled by the learning rate, not by the
  parameter RMS, as in nanoT5.
  """
  return optax.chain(
      optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6),
      optax.scale_by_param_block_rms(min_scale=1e-3),
      optax.add_decayed_weights(weight_decay),
      optax.scale_by_learning_rate(learning_rate))


def view_dims(axes, ndim: int) -> tuple[tuple[int, ...], ...]:
  """The parameter dims behind each dim of the view Adafactor factors: a 'heads' dim and the 'kv'
  dim right after it become one, so attention kernels are the (d_model, heads * d_kv) matrices
  that T5 factors. Other dims, 'layers' included, stay as they are."""
  axes = tuple(axes) + (None,) * (ndim - len(axes))
  dims = []
  for i, name in enumerate(axes):
    if name == 'kv' and i and axes[i - 1] == 'heads':
      dims[-1] += (i,)
    else:
      dims.append((i,))
  return tuple(dims)


def view_shape(shape, axes) -> tuple[int, ...]:
  return tuple(math.prod(shape[i] for i in dims) for dims in view_dims(axes, len(shape)))


def factor_like_t5(adafactor: optax.GradientTransformation, logical_axes,
                   min_dim_size_to_factor: int = 128) -> optax.GradientTransformationExtraArgs:
  """Runs `adafactor` on each parameter reshaped to its `view_shape`; updates get the param's shape.

  optax factors a tensor over its two largest dims, so a q/k/v kernel (d_model, heads, 64) with
  fewer than 128 heads keeps a full second moment; its (d_model, heads * 64) view is factored, as
  in T5 and T5X. A scanned (layers, d_model, heads * 64) is factored over its last two dims, layer
  by layer. With fewer than `min_dim_size_to_factor` layers 'layers' is never factored over: it is
  one of the two largest dims only where neither the stack nor any layer is factored; a stack that
  would be is refused. Clipping and the parameter scale see the whole tensor, as without views;
  a weight-decay mask given as a function is called on the views.

  `logical_axes`: a PartitionSpec of logical names per parameter, in the params' structure.
  """
  inner = optax.with_extra_args_support(adafactor)
  axes = jax.tree.leaves(logical_axes, is_leaf=lambda x: isinstance(x, PartitionSpec))

  def view(x, names):
    shape = view_shape(x.shape, names)
    largest = np.argsort(shape)[-2:]  # what optax factors over, if the smaller one is large enough
    if (names and names[0] == 'layers' and 0 in largest
        and shape[largest[0]] >= min_dim_size_to_factor):
      raise ValueError(f'Adafactor would factor a scanned {x.shape} parameter over its '
                       f'{x.shape[0]} layers; use model.scan_layers=False')
    return x.reshape(shape)

  def views(tree):
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:  # optax.tree_map_params probes init with a placeholder that has no leaves
      return tree
    if len(leaves) != len(axes):
      raise ValueError(f'{len(leaves)} parameters but logical axes for {len(axes)}')
    return treedef.unflatten([view(x, names) for x, names in zip(leaves, axes)])

  def update(updates, state, params=None, **extra_args):
    params = None if params is None else views(params)
    out, state = inner.update(views(updates), state, params, **extra_args)
    return jax.tree.map(lambda u, g: u.reshape(g.shape), out, updates), state

  return optax.GradientTransformationExtraArgs(lambda params: inner.init(views(params)), update)


def make_optimizer(optim_cfg, total_steps: int,
                   logical_axes=None) -> optax.GradientTransformation:
  """The optimizer named by `optim.name`, on `make_schedule`, after global-norm clipping.

  Weight decay applies to every parameter, norms and biases too (nanoT5 exempts those).
  Adafactor's weight decay is not scaled by the learning rate (T5X's default); AdamW's is.
  `logical_axes` (a PartitionSpec of logical names per parameter, e.g. `state.param_axes`) lets
  Adafactor factor attention kernels as T5 does (`factor_like_t5`); None factors each tensor as
  optax does, over its two largest dims.
  """
  schedule = make_schedule(optim_cfg, total_steps)
  weight_decay, name = float(optim_cfg.weight_decay), optim_cfg.name
  if name == 'adafactor':
    # T5's settings: factored second moments for dims >= 128, decay 1 - t^-0.8, update RMS
    # clipped at 1, step relative to max(1e-3, RMS(param)), no momentum.
    # Attention kernels are factored over their (d_model, heads * d_kv) view with logical_axes.
    min_dim = 128
    tx = optax.adafactor(
        schedule, min_dim_size_to_factor=min_dim, decay_rate=0.8, multiply_by_parameter_scale=True,
        clipping_threshold=1.0, momentum=None, eps=1e-30,
        weight_decay_rate=weight_decay or None)
    if logical_axes is not None:
      tx = factor_like_t5(tx, logical_axes, min_dim)
  elif name == 'adamw':
    tx = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=weight_decay)
  elif name == 'adamw_scaled':
    tx = adamw_scaled(schedule, weight_decay)
  else:
    raise ValueError(f'optim.name={name!r} is not one of {", ".join(OPTIMIZERS)}')
  clip = float(optim_cfg.clip_grad_norm)
  return optax.chain(optax.clip_by_global_norm(clip), tx) if clip > 0 else tx
