"""mT5 base (582M parameters): T5 v1.1 base with mT5's 250,112-id vocabulary.

Bring its SentencePiece model, or train one on your corpora (`t5lite tokenizer --alpha=0.3
--character_coverage=0.99999`), and mix the languages by size (data.mixture_rule='size').
Exports as MT5ForConditionalGeneration.

  t5lite train --config=mt5_base --workdir=runs/mt5_base \
      --config.data.vocabulary=spm/vocab.model
"""

from t5lite import config as t5config


def get_config():
  return t5config.multilingual('t5_1_1_base')
