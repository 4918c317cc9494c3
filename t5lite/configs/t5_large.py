"""T5 v1.0 large (738M parameters).

  t5lite train --config=t5_large --workdir=runs/t5_large
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_0,
      vocab_size=32128,
      d_model=1024,
      d_ff=4096,
      num_heads=16,
      d_kv=64,
      num_encoder_layers=24,
      num_decoder_layers=24)
  return config
