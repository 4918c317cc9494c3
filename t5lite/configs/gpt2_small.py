"""GPT-2 small (Radford et al. 2019): decoder-only, pre-LN, GELU, learned positions; causal LM.

124.5M parameters: Hugging Face's GPT2Model exactly, but for GPT-2's BPE vocabulary size 50,257
padded to 50,304 (a multiple of 128, as nanoGPT); the data still comes through `data.vocabulary`.
1024-token rows cut from the concatenated documents. `--config.data.objective=prefix_lm
--config.data.inputs_length=512 --config.data.targets_length=512` trains the same model as a prefix
LM (bidirectional over a random-length prefix, loss on the rest).

  t5lite train --config=gpt2_small --workdir=runs/gpt2_small
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      arch='decoder',
      vocab_size=50304,
      d_model=768,
      d_ff=3072,
      num_heads=12,
      d_kv=64,
      num_encoder_layers=0,
      num_decoder_layers=12,
      activation='gelu',
      norm='layer',
      norm_position='pre',
      norm_eps=1e-5,
      position='learned',
      max_length=1024,
      use_bias=True,
      tie_embeddings=True,
      dropout=0.1)
  config.data.update(objective='causal_lm', inputs_length=0, targets_length=1024, batch_size=512)
  config.train.update(steps=600_000)
  # AdamW with cosine decay as nanoGPT reproduces GPT-2 (OpenAI did not publish its schedule)
  config.optim.update(name='adamw', schedule='cosine', learning_rate=6e-4, warmup_steps=2000,
                      weight_decay=0.1)
  return config
