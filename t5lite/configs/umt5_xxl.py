"""UMT5 xxl (13.0B parameters): T5 v1.1 xxl with a relative position bias in every layer
and UMT5's 256,384-id vocabulary (Chung et al. 2023). Exports as
UMT5ForConditionalGeneration.

  t5lite train --config=umt5_xxl --workdir=runs/umt5_xxl \
      --config.data.vocabulary=spm/vocab.model
"""

from t5lite import config as t5config


def get_config():
  return t5config.multilingual('t5_1_1_xxl', per_layer_bias=True)
