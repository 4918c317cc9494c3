"""The Switch Transformer as Hugging Face's SwitchTransformersForConditionalGeneration, both ways:
an encoder-decoder with sparse experts (models/experts.py) is T5's mapping with its MLPs named
`mlp` and each sparse layer's router and experts.

What transformers computes, and so what an import reproduces exactly: top-1 routing in float32
with a fixed `expert_capacity` per sequence (our expert_capacity, with a group a row), padding
routed as any token, no router bias; layer i sparse where i % step == 1 (every layer for step 1),
step = num_layers // num_sparse_layers (num_layers for 0). Its experts have no gated
activation (`dense_act_fn`). An export writes `decoder_start_token_id` (0), which transformers'
config lacks and its loss needs, and a model whose capacity comes from a factor as
`expert_capacity` 64, transformers' default. The routers' loss weights are the run's
(`train.router_z_loss`, `train.load_balance_loss`), not the folder's.
"""

from typing import Any

import numpy as np

from t5lite.models import experts, hf_mapping
from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import FEED_FORWARD_PROJ, HfModel, Row

DEFAULT_CAPACITY = 64  # SwitchTransformersConfig's expert_capacity
# What transformers' router can be besides ours: refused on import
ROUTER_FIXED = dict(router_bias=False, router_ignore_padding_tokens=False, router_dtype='float32')
STACK_LAYERS = {'encoder': ('num_layers', 'num_sparse_encoder_layers'),
                'decoder': ('num_decoder_layers', 'num_sparse_decoder_layers')}


def hf_step(num_layers: int, num_sparse: int) -> int:
  """transformers' sparse step of a stack from config.json's counts."""
  return num_layers // num_sparse if num_sparse > 0 else num_layers


def sparse_counts(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
  """Each stack's (layers, sparse layers)."""
  steps = experts.sparse_steps(cfg)
  layers = {'encoder': cfg.num_encoder_layers, 'decoder': cfg.num_decoder_layers}
  return {stack: (n, experts.num_sparse(n, steps[stack])) for stack, n in layers.items()}


def hf_model(t5: HfModel) -> HfModel:
  """Switch's HfModel, built on T5's (`t5`: its check, table, config and load)."""

  def check(cfg: ModelConfig) -> None:
    t5.check(cfg)
    if cfg.is_gated or cfg.expert_top_k != 1 or cfg.expert_weights != 'probability':
      raise ValueError(f'export supports Switch Transformers with top-1 routing, an ungated '
                       f'activation and expert_weights=probability; got expert_top_k='
                       f'{cfg.expert_top_k}, {cfg.activation}, {cfg.expert_weights}')
    steps = experts.sparse_steps(cfg)
    for stack, (n, sparse) in sparse_counts(cfg).items():
      ours = [experts.is_sparse(i, steps[stack]) for i in range(n)]
      if ours != [experts.is_sparse(i, hf_step(n, sparse)) for i in range(n)]:
        raise ValueError(f'export: transformers places {sparse} sparse layers of {n} otherwise '
                         f'than model.{stack}_sparse_step={steps[stack]}')

  def table(cfg: ModelConfig) -> list[Row]:
    steps = experts.sparse_steps(cfg)
    rows = []
    for row in t5.table(cfg):
      if row.path[-3:-2] != ('mlp',):  # the rest of T5's
        rows.append(row)
      elif not experts.is_sparse(row.path[2], steps[row.path[0]]):
        rows.append(row._replace(name=row.name.replace('.DenseReluDense.', '.mlp.')))
      elif row.path[-2] == 'wi':  # once per sparse layer: its router and experts
        ours, theirs = row.path[:-2], row.name.removesuffix('.DenseReluDense.wi.weight')
        rows.append(Row((*ours, 'router'), f'{theirs}.mlp.router.classifier.weight', 1))
        rows += [Row((*ours, w), f'{theirs}.mlp.experts.expert_{e}.{w}.weight', 1, index=e)
                 for e in range(cfg.num_experts) for w in ('wi', 'wo')]
    if not cfg.tie_embeddings:  # transformers 5 then unties each stack's input embedding too
      rows += [Row(('embed', 'embedding'), f'{stack}.embed_tokens.weight', 0)
               for stack in ('encoder', 'decoder')]
    return rows

  def config(cfg: ModelConfig) -> dict[str, Any]:
    counts = sparse_counts(cfg)
    fields = {key: value for key, value in t5.config(cfg).items() if key != 'feed_forward_proj'}
    return {**fields, 'dense_act_fn': FEED_FORWARD_PROJ[cfg.activation],
            'num_experts': cfg.num_experts,
            'expert_capacity': cfg.expert_capacity or DEFAULT_CAPACITY,
            'num_sparse_encoder_layers': counts['encoder'][1],
            'num_sparse_decoder_layers': counts['decoder'][1],
            'router_jitter_noise': cfg.router_jitter, **ROUTER_FIXED}

  def load(config: dict[str, Any], tensors: dict[str, np.ndarray]
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    activation = hf_mapping.check_hf_config(
        config, 'Switch', ('num_layers', 'num_experts'), ROUTER_FIXED, default_activation='relu',
        activation_key='dense_act_fn')
    fields, tensors = t5.load({**config, 'feed_forward_proj': FEED_FORWARD_PROJ[activation]},
                              tensors)
    steps = {}
    for stack, (layers, sparse) in STACK_LAYERS.items():
      num_layers = config.get(layers) or config['num_layers']
      steps[f'{stack}_sparse_step'] = hf_step(num_layers, config.get(sparse, 3))
    return {**fields, **steps, 'num_experts': config['num_experts'], 'expert_top_k': 1,
            'expert_capacity': config.get('expert_capacity', DEFAULT_CAPACITY),
            'expert_group_size': 0,
            'router_jitter': config.get('router_jitter_noise', 0.01)}, tensors

  return HfModel('Switch', 'SwitchTransformersForConditionalGeneration', 'switch_transformers',
                 check=check, config=config, table=table, text=t5.text, load=load,
                 fits=lambda cfg: cfg.num_experts > 0)
