"""Sparse experts in place of an MLP: the Switch Transformer (Fedus et al. 2021) and top-k
token-choice routing (GShard, Lepikhin et al. 2020).

A sparse layer holds `num_experts` MLPs and a router, a float32 (d_model, experts) matrix whatever
the compute dtype (the paper's selective precision). Each token goes to the `expert_top_k`
experts of highest router probability, and its output is the sum of theirs, each times that
probability. The tokens of a group (a row, or `expert_group_size` tokens) are routed together;
an expert takes at most `capacity` of a group's tokens: a token's choices are served in order,
every token's first choice before any second choice, and within a choice by position, as Hugging
Face's and T5X's routers do. A choice past its expert's capacity is dropped; a token with all its
choices dropped leaves the layer as it came (the residual alone). Worked example, one group of 4
tokens, 2 experts, top-1, capacity 1:

  router argmax  [0 0 1 0] -> dispatched to slot 0 of expert 0, dropped, slot 0 of expert 1,
                              dropped; tokens 1 and 3 pass through unchanged

Capacity mode (GShard's einsums) computes the experts over (groups, experts, capacity, d_model)
tensors; an `expert` mesh axis splits the experts' parameters, and the sharding constraints on
those tensors (groups over the batch axes but `expert`, experts over `expert`) make XLA send
each token to its expert's device and back with two all-to-alls. With `expert_dropless` nothing
is dropped: the (token, choice) pairs are sorted by expert and `jax.lax.ragged_dot` runs each
expert over its own.

Training draws multiplicative jitter U(1 - j, 1 + j) on the router's input and uses the training
capacity factor. Each sparse layer also sows, for the router's losses and metrics
(t5lite/objectives/routing.py), its `RouterSums`, when `nnx.capture` collects `RouterStats`.
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig
from t5lite.models.layers import ACTIVATION_FUNCTIONS, constrain, param

GROUPS = ('batch', 'length', 'embed')  # (groups, tokens, d): groups split like rows
# (groups, experts, capacity, d): after the all-to-all, experts over the `expert` axis
EXPERT_SLOTS = ('batch_no_expert', 'expert', None, 'embed')


class RouterStats(nnx.Intermediate):
  """What sparse layers sow for `nnx.capture`: one `RouterSums` per call."""


class RouterSums(NamedTuple):
  """One sparse layer's routing over (groups, tokens): float32 sums."""
  chosen: jax.Array  # (groups, experts): tokens with the expert among their top k
  probability: jax.Array  # (groups, experts): the router's probabilities, summed over tokens
  z_loss: jax.Array  # (): logsumexp(router logits)^2 summed over tokens
  dropped: jax.Array  # (): (token, choice) pairs past their expert's capacity
  load: jax.Array  # (experts,): (token, choice) pairs each expert computed
  confidence: jax.Array  # (): the top probability, summed over tokens
  tokens: jax.Array  # (): tokens routed


class Routing(NamedTuple):
  dispatch: jax.Array  # (groups, tokens, experts, capacity): 1 where a token takes a slot
  combine: jax.Array  # (groups, tokens, experts, capacity) float32: dispatch x probability
  sums: RouterSums


def is_sparse(layer: int, sparse_step: int) -> bool:
  """Whether layer `layer` of a stack is sparse: Hugging Face's rule, 0 never, 1 always.
  sparse_step 2 over 6 layers -> layers 1, 3, 5."""
  return sparse_step > 0 and (sparse_step == 1 or layer % sparse_step == 1)


def num_sparse(num_layers: int, sparse_step: int) -> int:
  return sum(is_sparse(i, sparse_step) for i in range(num_layers))


def sparse_steps(cfg: ModelConfig) -> dict[str, int]:
  """Each stack's sparse_step, 0 for a model without experts."""
  has = cfg.num_experts > 0
  return {'encoder': cfg.encoder_sparse_step * has, 'decoder': cfg.decoder_sparse_step * has}


def check(cfg: ModelConfig, layers: dict[str, int]) -> None:
  """Refuses in one line experts no layer of the stacks (`layers`: stack -> its layers) takes,
  or a scanned stack whose layers do not split into groups of sparse_step."""
  steps = sparse_steps(cfg)
  if cfg.num_experts and not any(num_sparse(n, steps[stack]) for stack, n in layers.items()):
    raise ValueError(f'model.num_experts={cfg.num_experts} but no layer is sparse; set '
                     'model.encoder_sparse_step or model.decoder_sparse_step (2: every other)')
  for stack, n in layers.items():
    if cfg.scan_layers and steps[stack] and n % steps[stack]:
      raise ValueError(f'model.scan_layers scans groups of model.{stack}_sparse_step='
                       f'{steps[stack]} layers, which num_{stack}_layers={n} is not a multiple '
                       'of; change one or set model.scan_layers=false')


def group_shape(rows: int, length: int, group_size: int) -> tuple[int, int]:
  """(groups, tokens per group) of (rows, length) tokens: a row each for group_size 0, else the
  fewest groups of at most group_size tokens that split them evenly. (4, 6, 8) -> (3, 8)."""
  if not group_size:
    return rows, length
  tokens = rows * length
  groups = next(n for n in range(-(-tokens // group_size), tokens + 1) if tokens % n == 0)
  return groups, tokens // groups


def capacity(cfg: ModelConfig, group_tokens: int, train: bool) -> int:
  """Slots per expert in a group: expert_capacity, or the capacity factor's share of its
  (token, choice) pairs, rounded up; never more than the group's tokens."""
  factor = cfg.train_capacity_factor if train else cfg.eval_capacity_factor
  slots = cfg.expert_capacity or math.ceil(
      factor * cfg.expert_top_k * group_tokens / cfg.num_experts)
  return min(slots, group_tokens)


def top_choices(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Router logits (..., E) float32 -> probabilities (..., E), and the top k's (..., k) each:
  probabilities and expert ids (the lower id first on ties, as argmax)."""
  probs = jax.nn.softmax(logits, axis=-1)
  top_probs, top_experts = jax.lax.top_k(probs, k)
  return probs, top_probs, top_experts


def expert_weights(top_probs: jax.Array, how: str) -> jax.Array:
  """What each chosen expert's output is weighed by (model.expert_weights), (..., k)."""
  if how == 'normalized':
    return top_probs / jnp.sum(top_probs, axis=-1, keepdims=True)
  return top_probs


def route(logits: jax.Array, k: int, slots: int, weights: str = 'probability') -> Routing:
  """Top-k token-choice routing of router logits (n, G, E) into `slots` per expert and group."""
  n, g, e = logits.shape
  probs, top_probs, top_experts = top_choices(logits, k)
  choice = jax.nn.one_hot(top_experts, e, dtype=jnp.int32)  # (n, G, k, E)
  # Priority: choice-major, then position. (n, G, k, E) -> (n, k, G, E) -> (n, k*G, E)
  ordered = jnp.swapaxes(choice, 1, 2).reshape(n, k * g, e)
  position = jnp.cumsum(ordered, axis=1) - 1  # each pair's slot in its expert, if it fits
  position = jnp.swapaxes(position.reshape(n, k, g, e), 1, 2)  # back to (n, G, k, E)
  kept = choice * (position < slots)
  slot = jax.nn.one_hot(position, slots, dtype=jnp.float32) * kept[..., None]  # (n, G, k, E, C)
  dispatch = jnp.sum(slot, axis=2)  # (n, G, E, C)
  combine = jnp.einsum('ngkec,ngk->ngec', slot, expert_weights(top_probs, weights))
  load = jnp.sum(kept, axis=(0, 1, 2)).astype(jnp.float32)
  return Routing(dispatch, combine, router_sums(logits, probs, top_probs, choice, load))


def router_sums(logits, probs, top_probs, choice, load) -> RouterSums:
  """The sums a layer sows from its routing; choice (..., k, E) one-hot, load (E,)."""
  chosen = jnp.sum(choice, axis=-2).astype(jnp.float32)  # (..., G, E)
  tokens = jnp.asarray(math.prod(logits.shape[:-1]), jnp.float32)
  z = jnp.square(jax.nn.logsumexp(logits, axis=-1))
  return RouterSums(
      chosen=jnp.sum(chosen.reshape(-1, *chosen.shape[-2:]), axis=-2),
      probability=jnp.sum(probs.reshape(-1, *probs.shape[-2:]), axis=-2),
      z_loss=jnp.sum(z), dropped=tokens * choice.shape[-2] - jnp.sum(load), load=load,
      confidence=jnp.sum(top_probs[..., 0]), tokens=tokens)


class SparseMLP(nnx.Module):
  """A router and `num_experts` MLPs of the layer's activation, in place of its MLP."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e, d, f = cfg.num_experts, cfg.d_model, cfg.d_ff

    def weights(d_in, d_out, axes):
      return param(rngs, jax.nn.initializers.normal(d_in**-0.5), (e, d_in, d_out), axes, cfg)

    # small, as T5X's: routing starts near uniform
    self.router = param(rngs, jax.nn.initializers.normal(2e-2), (d, e), ('embed', None), cfg)
    self.act = ACTIVATION_FUNCTIONS[cfg.activation.removeprefix('gated-')]
    names = ('wi_0', 'wi_1') if cfg.is_gated else ('wi',)
    for name in names:
      setattr(self, name, weights(d, f, ('expert', 'embed', 'mlp')))
    self.wo = weights(f, d, ('expert', 'mlp', 'embed'))
    self.dropout = nnx.Dropout(cfg.dropout)

  def __call__(self, x: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
    """x (b, l, d) -> (b, l, d)."""
    b, l, d = x.shape
    n, g = group_shape(b, l, self.cfg.expert_group_size)
    h = constrain(x.reshape(n, g, d), GROUPS)  # (b, l, d) -> (n, G, d)
    logits = self.router_logits(h, None if deterministic else rngs)  # (n, G, E) float32
    if self.cfg.expert_dropless:
      y, sums = self._dropless(h, logits, deterministic, rngs)
    else:
      routing = route(logits, self.cfg.expert_top_k,
                      capacity(self.cfg, g, train=not deterministic), self.cfg.expert_weights)
      y, sums = self._with_capacity(h, routing, deterministic, rngs), routing.sums
    if hasattr(self, '__captures__'):  # inside nnx.capture; outside, sow would keep it for good
      self.sow(RouterStats, 'routing', sums)
    return y.reshape(b, l, d).astype(x.dtype)

  def router_logits(self, h: jax.Array, rngs: nnx.Rngs | None) -> jax.Array:
    """(..., d) -> float32 (..., E); with rngs (training), of the jittered input."""
    h = h.astype(jnp.float32)
    if rngs is not None and self.cfg.router_jitter:
      jitter = self.cfg.router_jitter
      h = h * jax.random.uniform(rngs.dropout(), h.shape, jnp.float32, 1 - jitter, 1 + jitter)
    return h @ self.router[...].astype(jnp.float32)

  def _with_capacity(self, h, routing: Routing, deterministic, rngs) -> jax.Array:
    """GShard's dispatch and combine einsums around the experts."""
    dispatch = routing.dispatch.astype(h.dtype)
    slots = constrain(jnp.einsum('ngd,ngec->necd', h, dispatch), EXPERT_SLOTS)  # (n, E, C, d)
    out = self._experts(slots, lambda x, w: jnp.einsum('necd,edf->necf', x, w), deterministic,
                        rngs)
    out = constrain(out, EXPERT_SLOTS)
    # (n, E, C, d) x (n, G, E, C) -> (n, G, d)
    y = jnp.einsum('necd,ngec->ngd', out, routing.combine.astype(out.dtype))
    return constrain(y, GROUPS)

  def _dropless(self, h, logits, deterministic, rngs) -> tuple[jax.Array, RouterSums]:
    """Every (token, choice) pair of h (n, G, d), sorted by expert, through `ragged_dot`."""
    k, e = self.cfg.expert_top_k, self.cfg.num_experts
    probs, top_probs, top_experts = top_choices(logits, k)  # (n, G, E), 2 x (n, G, k)
    experts = top_experts.reshape(-1)  # (n*G*k,)
    order = jnp.argsort(experts, stable=True)
    token = order // k  # the token of each sorted pair, of the n*G
    sizes = jnp.bincount(experts, length=e).astype(jnp.int32)  # (E,) pairs per expert
    flat = h.reshape(-1, h.shape[-1])  # (n, G, d) -> (n*G, d)
    out = self._experts(flat[token], lambda x, w: jax.lax.ragged_dot(x, w, sizes),
                        deterministic, rngs)  # (n*G*k, d)
    weights = expert_weights(top_probs, self.cfg.expert_weights).reshape(-1)[order]
    weighted = out * weights[:, None].astype(out.dtype)
    y = jnp.zeros_like(flat).at[token].add(weighted).reshape(h.shape)
    choice = jax.nn.one_hot(top_experts, e, dtype=jnp.int32)  # (n, G, k, E)
    return y, router_sums(logits, probs, top_probs, choice, sizes.astype(jnp.float32))

  def _experts(self, x, matmul: Callable[[jax.Array, jax.Array], jax.Array], deterministic,
               rngs) -> jax.Array:
    """Each expert's MLP over its tokens; matmul(x, weights (E, d_in, d_out))."""
    def weights(name):  # gathered over fsdp, as FSDP gathers a dense layer's (else XLA may
      # gather the tokens' slots instead, in the backward pass)
      axes = ('expert', 'mlp', None) if name == 'wo' else ('expert', None, 'mlp')
      return constrain(getattr(self, name)[...].astype(x.dtype), axes)

    if self.cfg.is_gated:
      h = self.act(matmul(x, weights('wi_0'))) * matmul(x, weights('wi_1'))
    else:
      h = self.act(matmul(x, weights('wi')))
    h = self.dropout(h, deterministic=deterministic, rngs=rngs)
    return matmul(h, weights('wo'))


class LayerGroup(nnx.Module):
  """`sparse_step` consecutive layers of a stack, one of them sparse: what a scanned stack with
  experts scans over, since its layers are not all alike. Called as one layer is, with the
  per-layer keys (sparse_step,) and caches (b, sparse_step, ...) stacked."""

  def __init__(self, blocks: Sequence[nnx.Module]):
    # block_0, block_1, ... (an nnx.List would take nnx.capture's str key among its int ones)
    self.size = len(blocks)
    for j, block in enumerate(blocks):
      setattr(self, f'block_{j}', block)

  @property
  def blocks(self) -> list[nnx.Module]:
    return [getattr(self, f'block_{j}') for j in range(self.size)]

  def __call__(self, x: jax.Array, inputs, keys: jax.Array | None, *, deterministic: bool,
               cache=None):
    caches = []
    for j, block in enumerate(self.blocks):
      key = None if keys is None else keys[j]
      if cache is None:
        x = block(x, inputs, key, deterministic=deterministic)
      else:
        x, layer = block(x, inputs, key, deterministic=deterministic,
                         cache=jax.tree.map(lambda c, j=j: c[:, j], cache))
        caches.append(layer)
    if cache is None:
      return x
    return x, jax.tree.map(lambda *layers: jnp.stack(layers, axis=1), *caches)
