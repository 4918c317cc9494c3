"""Learning-rate schedules and optimizers, built from the config's `optim` section with optax.

Adafactor with T5's settings is the default (what T5 and T5X pretrain with); AdamW, and nanoT5's
AdamW with Adafactor's parameter-scale step, are the alternatives nanoT5 found to train T5 fast.
"""

import jax.numpy as jnp
import optax

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


def adamw_scaled(learning_rate, weight_decay: float = 0.0,
                 weight_decay_mask=None) -> optax.GradientTransformation:
  """nanoT5's AdamWScale: the Adam step times max(1e-3, RMS(param)), as Adafactor scales its step.

  Makes the step relative to each tensor's size, which lets T5 train with Adafactor-like learning
  rates (nanoT5: 2e-2 with cosine). eps 1e-6 as nanoT5 (which adds it before bias correction; the
  difference is negligible). Weight decay is decoupled and scaled by the learning rate, not by the
  parameter RMS, as in nanoT5.
  """
  return optax.chain(
      optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6),
      optax.scale_by_param_block_rms(min_scale=1e-3),
      optax.add_decayed_weights(weight_decay, weight_decay_mask),
      optax.scale_by_learning_rate(learning_rate))


def make_optimizer(optim_cfg, total_steps: int,
                   weight_decay_mask=None) -> optax.GradientTransformation:
  """The optimizer named by `optim.name`, on `make_schedule`, after global-norm clipping.

  `weight_decay_mask` (a pytree of bools like the params, or a function of them) limits weight
  decay to some parameters; nanoT5 exempts norms and biases. None decays every parameter.
  Adafactor's weight decay is not scaled by the learning rate (T5X's default); AdamW's is.
  """
  schedule = make_schedule(optim_cfg, total_steps)
  weight_decay, name = float(optim_cfg.weight_decay), optim_cfg.name
  if name == 'adafactor':
    # T5's settings: factored second moments for dims >= 128, decay 1 - t^-0.8, update RMS
    # clipped at 1, step relative to max(1e-3, RMS(param)), no momentum.
    tx = optax.adafactor(
        schedule, min_dim_size_to_factor=128, decay_rate=0.8, multiply_by_parameter_scale=True,
        clipping_threshold=1.0, momentum=None, eps=1e-30,
        weight_decay_rate=weight_decay or None, weight_decay_mask=weight_decay_mask)
  elif name == 'adamw':
    tx = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=weight_decay,
                     mask=weight_decay_mask)
  elif name == 'adamw_scaled':
    tx = adamw_scaled(schedule, weight_decay, weight_decay_mask)
  else:
    raise ValueError(f'optim.name={name!r} is not one of {", ".join(OPTIMIZERS)}')
  clip = float(optim_cfg.clip_grad_norm)
  return optax.chain(optax.clip_by_global_norm(clip), tx) if clip > 0 else tx
