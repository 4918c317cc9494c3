"""BART base (Lewis et al. 2020): encoder-decoder denoising autoencoder, post-LN, GELU, learned
positions; text infilling and sentence permutation.

139.4M parameters (published: 140M) with BART's BPE vocabulary size, 50,265, padded to 50,304 (a
multiple of 128); the data still comes through `data.vocabulary`. Sentences of each chunk shuffled
(split after '.', '!', '?'), then 30% of tokens masked in spans of Poisson(3) lengths, each span one
<extra_id_0> (empty spans insert one); the decoder reconstructs the original chunk.

  t5lite train --config=bart_base --workdir=runs/bart_base
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.BERT,
      arch='encoder_decoder',
      vocab_size=50304,
      d_model=768,
      d_ff=3072,
      num_heads=12,
      d_kv=64,
      num_encoder_layers=6,
      num_decoder_layers=6,
      norm_eps=1e-5,
      max_length=1024)
  config.data.update(objective='bart', inputs_length=512, targets_length=512, batch_size=8192,
                     noise_density=0.3, mean_noise_span_length=3.0)
  config.train.update(steps=500_000)
  # BART large's published run (batch 8000, 500k steps), with RoBERTa's optimizer
  config.optim.update(name='adamw', schedule='cosine', learning_rate=6e-4, warmup_steps=24_000,
                      weight_decay=0.01)
  return config
