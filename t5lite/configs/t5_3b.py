"""T5 v1.0 3B (2.85B parameters): 32 heads of width 128 over d_model 1024.

  t5lite train --config=t5_3b --workdir=runs/t5_3b
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_0,
      vocab_size=32128,
      d_model=1024,
      d_ff=16384,
      num_heads=32,
      d_kv=128,
      num_encoder_layers=24,
      num_decoder_layers=24)
  return config
