"""T5 v1.1 XXL (11.1B parameters).

  t5lite train --config=t5_1_1_xxl --workdir=runs/t5_1_1_xxl
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=32128,
      d_model=4096,
      d_ff=10240,
      num_heads=64,
      d_kv=64,
      num_encoder_layers=24,
      num_decoder_layers=24)
  return config
