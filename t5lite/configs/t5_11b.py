"""T5 v1.0 11B (11.3B parameters): 128 heads of width 128 over d_model 1024.

  t5lite train --config=t5_11b --workdir=runs/t5_11b
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_0,
      vocab_size=32128,
      d_model=1024,
      d_ff=65536,
      num_heads=128,
      d_kv=128,
      num_encoder_layers=24,
      num_decoder_layers=24)
  return config
