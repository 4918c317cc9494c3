"""ByT5 xl (3.74B parameters): T5 v1.1 over UTF-8 bytes, 36 encoder layers and 12 decoder.

  t5lite train --config=byt5_xl --workdir=runs/byt5_xl \
      --config.data.source=stores/bytes
"""

from t5lite import config as t5config


def get_config():
  return t5config.byt5(d_model=2560, d_ff=6720, num_heads=32,
                       num_encoder_layers=36, num_decoder_layers=12)
