"""Flax NNX Transformers of the T5 family, built from one ModelConfig: `build(cfg, rngs)`."""

from t5lite.models.config import ModelConfig
from t5lite.models.decoder import DecoderOnly
from t5lite.models.electra import Electra
from t5lite.models.encoder import EncoderOnly
from t5lite.models.encoder_decoder import EncoderDecoder
from t5lite.models.params import (get_params, load_params, logical_axes, stack_layers,
                                  unstack_layers)
from t5lite.models.registry import build, family
from t5lite.models.transformer import Features

__all__ = [
    'DecoderOnly', 'EncoderDecoder', 'EncoderOnly', 'Electra', 'Features', 'ModelConfig', 'build',
    'family', 'get_params', 'load_params', 'logical_axes', 'stack_layers', 'unstack_layers',
]
