"""UMT5 base (592M parameters): mT5 with a relative position bias in every layer.

UMT5 (Chung et al. 2023, UniMax): T5 v1.1 whose every layer has its own relative position
bias, over a 256,384-id vocabulary. Exports as UMT5ForConditionalGeneration.

  t5lite train --config=umt5_base --workdir=runs/umt5_base
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=t5config.UMT5_VOCAB_SIZE,
      relative_bias_per_layer=True,
      d_model=768,
      d_ff=2048,
      num_heads=12,
      d_kv=64,
      num_encoder_layers=12,
      num_decoder_layers=12)
  config.data.update(t5config.MT5_DATA)
  return config
