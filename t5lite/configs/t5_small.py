"""T5 v1.0 small (60.5M parameters).

  t5lite train --config=t5_small --workdir=runs/t5_small
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_0,
      vocab_size=32128,
      d_model=512,
      d_ff=2048,
      num_heads=8,
      d_kv=64,
      num_encoder_layers=6,
      num_decoder_layers=6)
  return config
