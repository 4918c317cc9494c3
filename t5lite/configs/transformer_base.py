"""The Transformer, base (Vaswani et al. 2017): encoder-decoder, sinusoidal positions, post-LN,
ReLU, dropout 0.1, label smoothing 0.1; pretrained here with T5's span corruption.

63.1M parameters (published: 65M) with the paper's shared BPE vocabulary size, 37,000, padded to
37,120 (a multiple of 128); the data still comes through `data.vocabulary`. One embedding shared by
encoder, decoder and output, as the paper. Its schedule was linear warmup then 1/sqrt(step); here
cosine after the same 4k-step warmup, peaking at the paper's d_model**-0.5 * 4000**-0.5 = 7e-4.

  t5lite train --config=transformer_base --workdir=runs/transformer_base
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      arch='encoder_decoder',
      vocab_size=37120,
      d_model=512,
      d_ff=2048,
      num_heads=8,
      d_kv=64,
      num_encoder_layers=6,
      num_decoder_layers=6,
      activation='relu',
      norm='layer',
      norm_position='post',
      position='sinusoidal',
      use_bias=True,
      tie_embeddings=True,
      dropout=0.1)
  config.train.update(steps=100_000, label_smoothing=0.1)
  config.optim.update(name='adamw', schedule='cosine', learning_rate=7e-4, warmup_steps=4000)
  return config
