"""RoBERTa base (Liu et al. 2019): BERT base trained longer on bigger batches; masked LM.

124.7M parameters (published: 125M; Hugging Face's RobertaForMaskedLM, which it exports as, has
124,697,433, among them a token-type row and 2 rows before the first position, which ours lack)
with RoBERTa's BPE vocabulary size, 50,265, padded to 50,304 (a multiple of 128); the data still
comes through `data.vocabulary`. The BERT model and objective with what RoBERTa changed: dynamic
masking (a new mask every epoch), full sentences packed across document boundaries (chunks of the
concatenated documents), no next-sentence prediction, 8k-sequence batches; and its MLM head's
exact (erf) GELU.

  t5lite train --config=roberta_base --workdir=runs/roberta_base
"""

import os

from t5lite import config as t5config

BERT_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'bert_base.py')


def get_config():
  config = t5config.load(BERT_BASE)
  config.model.update(vocab_size=50304, norm_eps=1e-5, next_sentence=False,
                      mlm_transform='roberta')
  config.data.update(objective='mlm', batch_size=8192)
  config.train.update(steps=500_000)
  # Adam, peak lr 6e-4 after 24k warmup steps, weight decay 0.01 (the paper: beta2 0.98, linear
  # decay; here optax's adamw with beta2 0.999 and cosine decay)
  config.optim.update(name='adamw', schedule='cosine', learning_rate=6e-4, warmup_steps=24_000,
                      weight_decay=0.01)
  return config
