"""ELECTRA-small (Clark et al. 2020): a discriminator learns to spot the tokens a small masked-LM
generator replaced; the discriminator is the model kept.

Discriminator: 12 layers, d_model 256, 4 heads of 64, d_ff 1024, BERT's layers (post-LN, GELU,
learned positions, biases). Generator: the same depth with 1/4 of the heads and d_ff, so 64 wide,
reading the token and position embeddings it shares with the discriminator through a projection
(t5lite/models/electra.py). 12.4M parameters with the bundled 8,192-id vocabulary, 11.8M of them
the discriminator's (the paper's discriminator: 14M with BERT's 30,522 ids and 128-wide
embeddings projected to 256). Inputs are masked as `mlm`'s:
15% selected, 80% <extra_id_0> / 10% random / 10% kept (the paper keeps 15% and masks the rest),
128 tokens. Loss: generator MLM + 50 x the discriminator's replaced-token cross entropy.
Pretraining as the paper's Table 6: Adam, lr 5e-4, 10k warmup steps, weight decay 0.01,
dropout 0.1, batch 128, 1M steps (the paper decays linearly, not cosine).

  t5lite train --config=electra_small --workdir=runs/electra_small
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.BERT,
      arch='electra',
      vocab_size=8192,
      d_model=256,
      d_ff=1024,
      num_heads=4,
      d_kv=64,
      num_encoder_layers=12,
      num_decoder_layers=0,
      max_length=512,
      generator_size=0.25)
  config.data.update(objective='electra', inputs_length=128, targets_length=0, batch_size=128,
                     noise_density=0.15)
  config.train.update(steps=1_000_000)
  config.optim.update(name='adamw', schedule='cosine', learning_rate=5e-4, warmup_steps=10_000,
                      weight_decay=0.01)
  return config
