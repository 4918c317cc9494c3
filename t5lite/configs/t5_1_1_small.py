"""T5 v1.1 small (77M parameters).

  t5lite train --config=t5_1_1_small --workdir=runs/t5_1_1_small
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=32128,
      d_model=512,
      d_ff=1024,
      num_heads=6,
      d_kv=64,
      num_encoder_layers=8,
      num_decoder_layers=8)
  return config
