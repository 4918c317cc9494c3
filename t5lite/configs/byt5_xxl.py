"""ByT5 xxl (12.9B parameters): T5 v1.1 over UTF-8 bytes, 36 encoder layers and 12 decoder.

  t5lite train --config=byt5_xxl --workdir=runs/byt5_xxl \
      --config.data.source=stores/bytes
"""

from t5lite import config as t5config


def get_config():
  return t5config.byt5(d_model=4672, d_ff=12352, num_heads=64,
                       num_encoder_layers=36, num_decoder_layers=12)
