"""A T5 v1.1-style model small enough to pretrain on a laptop CPU in minutes (13.6M parameters).

Uses the SentencePiece vocabulary trained on the bundled corpus (8,000 pieces + 100 sentinels,
padded to 8,192) and short sequences, so that `make demo` shows the loss falling in a few minutes.

  t5lite train --config=t5_tiny --workdir=runs/tiny
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=8192,
      d_model=256,
      d_ff=1024,
      num_heads=4,
      d_kv=64,
      num_encoder_layers=4,
      num_decoder_layers=4)
  config.data.update(inputs_length=128, targets_length=29, batch_size=32)
  config.train.update(steps=2000, log_every=50, eval_every=500, eval_batches=10)
  config.optim.update(name='adafactor', schedule='rsqrt', learning_rate=0.01, warmup_steps=500)
  config.checkpoint.update(every_steps=500, keep=2)
  return config
