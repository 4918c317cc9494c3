"""ByT5 small (300M parameters): T5 v1.1 over UTF-8 bytes, 12 encoder layers and 4 decoder.

  t5lite train --config=byt5_small --workdir=runs/byt5_small \
      --config.data.source=stores/bytes
"""

from t5lite import config as t5config


def get_config():
  return t5config.byt5(d_model=1472, d_ff=3584, num_heads=6,
                       num_encoder_layers=12, num_decoder_layers=4)
