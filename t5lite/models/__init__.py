"""Flax NNX Transformers of the T5 family, built from one ModelConfig: `build(cfg, rngs)`."""

from t5lite.models.config import ModelConfig
from t5lite.models.params import (get_params, load_params, logical_axes, stack_layers,
                                  unstack_layers)
from t5lite.models.transformer import (DecoderOnly, EncoderDecoder, EncoderOnly, Features,
                                       build)

__all__ = [
    'DecoderOnly', 'EncoderDecoder', 'EncoderOnly', 'Features', 'ModelConfig', 'build',
    'get_params', 'load_params', 'logical_axes', 'stack_layers', 'unstack_layers',
]
