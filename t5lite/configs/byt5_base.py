"""ByT5 base (582M parameters): T5 v1.1 over UTF-8 bytes, 18 encoder layers and 6 decoder.

  t5lite train --config=byt5_base --workdir=runs/byt5_base \
      --config.data.source=stores/bytes
"""

from t5lite import config as t5config


def get_config():
  return t5config.byt5(d_model=1536, d_ff=3968, num_heads=12,
                       num_encoder_layers=18, num_decoder_layers=6)
