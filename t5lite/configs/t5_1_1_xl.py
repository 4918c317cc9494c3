"""T5 v1.1 XL (2.85B parameters).

  t5lite train --config=t5_1_1_xl --workdir=runs/t5_1_1_xl
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=32128,
      d_model=2048,
      d_ff=5120,
      num_heads=32,
      d_kv=64,
      num_encoder_layers=24,
      num_decoder_layers=24)
  return config
