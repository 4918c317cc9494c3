"""Analytic FLOP counts of a model's training step, and device peaks: what MFU is computed from.

Counts are matmul FLOPs (2 per multiply-accumulate), the convention of PaLM's and MaxText's MFU:
norms, softmax, activations, position biases and the embedding lookup are left out. Causal
self-attention counts half of the full score and value matmuls (MaxText; PaLM counts them
full), since a causal kernel can skip the masked half. Training is 3x the forward pass (the
backward pass is two matmuls per forward one); recomputation under remat is not counted, so
this is MFU, not hardware utilisation.
"""

import functools
import time

import jax
import jax.numpy as jnp

from t5lite.models import family
from t5lite.models import long_attention
from t5lite.models.config import ModelConfig


def attention_flops(cfg: ModelConfig, q_len: int, kv_len: int, causal: bool,
                    scored: int | None = None) -> float:
  """One attention layer over one example: Q and O projections over the queries, K and V over
  the keys (the encoder tokens in cross-attention), q.k scores and the weighted sum of values,
  over `scored` keys per query (default: all kv_len)."""
  inner = cfg.num_heads * cfg.d_kv
  projections = 2 * cfg.d_model * inner * (2 * q_len + 2 * kv_len)
  scores_and_values = 2 * 2 * q_len * (scored or kv_len) * inner
  return projections + (scores_and_values / 2 if causal else scores_and_values)


def long_attention_flops(cfg: ModelConfig, length: int) -> float:
  """A LongT5 encoder layer's attention: keys and values of the tokens and global tokens, each
  query scoring its 3 blocks and the global tokens (the blocks' padding too: what is computed),
  and the sums that make the global tokens."""
  long = long_attention.sizes(cfg, length)
  return (attention_flops(cfg, length, length + long.global_tokens, causal=False,
                          scored=long.scored) + 2 * length * long.global_tokens * cfg.d_model)


def ffn_flops(cfg: ModelConfig, length: int) -> float:
  """One feed-forward layer: d_model -> d_ff (twice when gated) -> d_model."""
  matmuls = 3 if cfg.is_gated else 2
  return 2 * length * cfg.d_model * cfg.d_ff * matmuls


def sparse_extra_flops(cfg: ModelConfig, length: int) -> float:
  """What a sparse layer adds to a dense one: the router, and the expert_top_k - 1 more experts
  each token runs through (the active parameters; not the experts a token skips, nor the
  capacity's empty slots)."""
  return 2 * length * cfg.d_model * cfg.num_experts + (cfg.expert_top_k - 1) * ffn_flops(
      cfg, length)


def lm_head_flops(cfg: ModelConfig, length: int) -> float:
  """Logits over the vocab at every position (tied or not, it is one matmul), after the MLM
  transform's d_model -> d_model dense if the model has one."""
  transform = cfg.d_model if cfg.mlm_transform != 'none' else 0
  return 2 * length * cfg.d_model * (cfg.vocab_size + transform)


def flops_per_example(cfg: ModelConfig, inputs_length: int, targets_length: int) -> float:
  """Forward FLOPs for one example of the given lengths: what its family's `shapes` says it runs
  through (models/architecture.py), each stack's layers, the lm head and any other heads."""
  shapes = family(cfg.arch).shapes(cfg, inputs_length, targets_length)
  total = shapes.head_flops + lm_head_flops(cfg, shapes.logits_length)
  for stack in shapes.stacks:
    attention = (long_attention_flops(stack.cfg, stack.length) if stack.long_inputs else
                 attention_flops(stack.cfg, stack.length, stack.length, causal=stack.causal))
    layer = attention + ffn_flops(stack.cfg, stack.length)
    if stack.cross_length is not None:
      layer += attention_flops(stack.cfg, stack.length, stack.cross_length, causal=False)
    total += stack.layers * layer + stack.sparse_layers * sparse_extra_flops(stack.cfg,
                                                                               stack.length)
  return total


def train_flops_per_step(cfg: ModelConfig, inputs_length: int, targets_length: int, *,
                         batch_size: int) -> float:
  """Training FLOPs of one step over the global batch: forward + backward = 3 x forward."""
  return 3 * flops_per_example(cfg, inputs_length, targets_length) * batch_size


# (device_kind prefix as JAX reports it, name, dense bf16 FLOP/s); the first match wins.
PEAK_BF16_FLOPS = (
    ('TPU v4 lite', 'TPU v4i', 138e12),
    ('TPU v4', 'TPU v4', 275e12),
    ('TPU v5 lite', 'TPU v5e', 197e12),
    ('TPU v5e', 'TPU v5e', 197e12),
    ('TPU v5', 'TPU v5p', 459e12),  # 'TPU v5' and 'TPU v5p'
    ('TPU v6', 'TPU v6e', 918e12),  # 'TPU v6 lite' and 'TPU v6e'
    ('NVIDIA H100 PCIe', 'H100 PCIe', 756e12),
    ('NVIDIA H100', 'H100', 989e12),  # 'NVIDIA H100 80GB HBM3'
    ('NVIDIA H200', 'H200', 989e12),
    ('NVIDIA GH200', 'GH200', 989e12),
    ('NVIDIA A100', 'A100', 312e12),  # 'NVIDIA A100-SXM4-40GB', 'NVIDIA A100 80GB PCIe'
)


def peak_from_device_kind(device_kind: str) -> tuple[float, str] | None:
  """The published dense bf16 peak and a short name for a JAX `device_kind`, if we know it."""
  for prefix, name, peak in PEAK_BF16_FLOPS:
    if device_kind.startswith(prefix):
      return peak, name
  return None


@functools.lru_cache(maxsize=None)
def measured_matmul_flops(device: jax.Device, n: int = 1024, repeats: int = 5) -> float:
  """Best-of-`repeats` rate of a jitted n x n matmul on `device` (float32 on CPU, else bf16)."""
  dtype = jnp.float32 if device.platform == 'cpu' else jnp.bfloat16
  x = jax.device_put(jnp.ones((n, n), dtype), device)
  matmul = jax.jit(lambda a: a @ a)
  matmul(x).block_until_ready()  # compile outside the timing
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def peak_flops_per_device(device: jax.Device | None = None) -> tuple[float, str]:
  """(FLOP/s, name): the published bf16 peak, or a measured matmul rate where none is known.

  CPU "devices" (fake ones in tests included) share the host's cores, so each gets its share
  of the host's measured rate; MFU on CPU is then relative to what the whole host can do.
  """
  device = device or jax.devices()[0]
  known = peak_from_device_kind(device.device_kind)
  if known:
    return known
  rate = measured_matmul_flops(device)
  if device.platform == 'cpu':
    rate /= len(jax.local_devices(backend='cpu'))
  return rate, f'measured {device.device_kind}'

