"""T5 v1.1 large (783M parameters).

  t5lite train --config=t5_1_1_large --workdir=runs/t5_1_1_large
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=32128,
      d_model=1024,
      d_ff=2816,
      num_heads=16,
      d_kv=64,
      num_encoder_layers=24,
      num_decoder_layers=24)
  return config
