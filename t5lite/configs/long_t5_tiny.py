"""LongT5-TGlobal small enough to pretrain on a laptop CPU (3.3M parameters): t5_tiny's
vocabulary and training settings (configs/t5_tiny.py), 128 wide, 2 + 2 layers, and LongT5's
transient-global encoder and pretraining recipe: 4,096 input and 910 target tokens of PEGASUS's
principal sentences (`:span_corruption` for T5's span corruption at the same lengths).

  t5lite train --config=long_t5_tiny --workdir=runs/long_t5_tiny
"""

from t5lite import config as t5config


def get_config(objective: str = 'principal_sentences'):
  config = t5config.long_t5('t5_tiny', 'transient_global', objective)
  config.model.update(d_model=128, d_ff=512, num_heads=4, d_kv=32, num_encoder_layers=2,
                      num_decoder_layers=2)
  config.data.update(batch_size=4)
  config.train.update(log_every=10, eval_every=100, eval_batches=2)
  return config
