"""What the Hugging Face parity tests of each family share: perturbed weights (ours and
transformers'), our model built from them, and the comparison of imported params.

transformers runs on CPU in float32 with random weights (no downloads). Every tensor is perturbed
away from its initial value (biases and LayerNorm offsets stop being 0, scales 1) so that a wrong
mapping shows."""

import dataclasses

import jax
import numpy as np
import torch
from flax import nnx

from t5lite.export import import_hf
from t5lite.models import ModelConfig, build, get_params, load_params, stack_layers
from t5lite.models.params import flatten
from t5lite.token_ids import EOS_ID


def perturbed_params(cfg: ModelConfig, seed: int) -> dict:
  """Our unrolled params, every one perturbed. The token embedding shrinks so that the layers,
  not the last token's own embedding, pick the next token (a random tied model repeats its
  input)."""
  rng = np.random.RandomState(seed)
  params = jax.tree.map(lambda x: x * (1 + 0.3 * rng.randn(*x.shape)) + 0.1 * rng.randn(*x.shape),
                        get_params(build(cfg, nnx.Rngs(seed))))
  params['embed']['embedding'] = 0.1 * params['embed']['embedding']
  return params


def our_model(cfg: ModelConfig, params: dict):
  """The model of `cfg` holding unrolled `params` (stacked first if cfg scans its layers)."""
  model = build(cfg, nnx.Rngs(0))
  load_params(model, stack_layers(params) if cfg.scan_layers else params)
  return model


def assert_same_params(ours: dict, expected: dict) -> None:
  ours, expected = dict(flatten(ours)), dict(flatten(expected))
  assert ours.keys() == expected.keys()
  for path, value in expected.items():
    np.testing.assert_array_equal(ours[path], value, err_msg='/'.join(map(str, path)))


def assert_imports_as_exported(folder: str, params: dict, cfg: ModelConfig) -> dict:
  """An exported folder imports as `cfg` with `params`, and scanned as `cfg` scanned with them
  stacked; returns the scanned import's params."""
  imported_cfg, imported = import_hf(folder)
  assert imported_cfg == cfg
  assert_same_params(imported, params)
  imported_cfg, imported = import_hf(folder, scan_layers=True)
  assert imported_cfg == dataclasses.replace(cfg, scan_layers=True)
  assert_same_params(imported, stack_layers(params))
  return imported


def perturb_torch(model, seed: int):
  """`model` (a transformers model) with every parameter perturbed as `perturbed_params` does."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.mul_(1 + 0.3 * torch.randn_like(parameter)).add_(0.1 * torch.randn_like(parameter))
  return model


def swap_with_eos(params: dict, token: int) -> dict:
  """`params` with the embeddings of EOS and `token` swapped: the same model but for two tokens'
  names, so that decoding which emitted `token` now ends there."""
  embedding = params['embed']['embedding'] = np.array(params['embed']['embedding'])
  embedding[[EOS_ID, token]] = embedding[[token, EOS_ID]]
  return params
