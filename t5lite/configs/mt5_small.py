"""mT5 small (300M parameters): T5 v1.1 with a 250,112-id multilingual vocabulary.

mT5 (Xue et al. 2021); bring its SentencePiece model, or train one on your corpora
(`t5lite tokenizer --alpha=0.3 --character_coverage=0.99999`), and mix the languages by
size (data.mixture_rule='size', data.mixture_alpha=0.3). Exports as MT5ForConditionalGeneration.

  t5lite train --config=mt5_small --workdir=runs/mt5_small
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=t5config.MT5_VOCAB_SIZE,
      hf_model_type='mt5',
      d_model=512,
      d_ff=1024,
      num_heads=6,
      d_kv=64,
      num_encoder_layers=8,
      num_decoder_layers=8)
  config.data.update(t5config.MT5_DATA)
  return config
