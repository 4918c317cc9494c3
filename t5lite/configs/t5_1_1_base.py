"""T5 v1.1 base (248M parameters).

  t5lite train --config=t5_1_1_base --workdir=runs/t5_1_1_base
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=32128,
      d_model=768,
      d_ff=2048,
      num_heads=12,
      d_kv=64,
      num_encoder_layers=12,
      num_decoder_layers=12)
  return config
