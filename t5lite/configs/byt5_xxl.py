"""ByT5 xxl (12.9B parameters): T5 v1.1 over UTF-8 bytes, 36 encoder layers and 12 decoder.

ByT5 (Xue et al. 2022): the byte vocabulary (data.vocabulary='bytes', no model file), span
corruption of 20 bytes a span on average at 1,024 inputs.

  t5lite train --config=byt5_xxl --workdir=runs/byt5_xxl
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=384,
      d_model=4672,
      d_ff=12352,
      num_heads=64,
      d_kv=64,
      num_encoder_layers=36,
      num_decoder_layers=12)
  config.data.update(t5config.BYT5_DATA)
  return config
