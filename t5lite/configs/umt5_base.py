"""UMT5 base (592M parameters): T5 v1.1 base with a relative position bias in every layer
and UMT5's 256,384-id vocabulary (Chung et al. 2023). Exports as
UMT5ForConditionalGeneration.

  t5lite train --config=umt5_base --workdir=runs/umt5_base \
      --config.data.vocabulary=spm/vocab.model
"""

from t5lite import config as t5config


def get_config():
  return t5config.multilingual('t5_1_1_base', per_layer_bias=True)
