"""ByT5 large (1.23B parameters): T5 v1.1 over UTF-8 bytes, 36 encoder layers and 12 decoder.

  t5lite train --config=byt5_large --workdir=runs/byt5_large \
      --config.data.source=stores/bytes
"""

from t5lite import config as t5config


def get_config():
  return t5config.byt5(d_model=1536, d_ff=3840, num_heads=16,
                       num_encoder_layers=36, num_decoder_layers=12)
