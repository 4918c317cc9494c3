"""BERT base (Devlin et al. 2019): encoder-only, post-LN, GELU, learned positions; masked LM, its
head transformed first (dense, GELU, LayerNorm), and next-sentence prediction.

110.2M parameters (published: 110M; Hugging Face's BertForPreTraining, which it exports as, has
110,106,428) with BERT's vocabulary size, 30,522, padded to 30,592 (a multiple of 128); the data
still comes through `data.vocabulary` (the bundled 8,100-id one uses only the first rows; train a
matching one with `t5lite tokenizer`). Each row is [CLS] A [SEP] B [SEP] (<extra_id_1> and
<extra_id_2> stand for [CLS] and [SEP]), B the text after A or text from elsewhere, half and half,
with token-type embeddings for A and B; 15% of A and B selected, 80% <extra_id_0> as [MASK] / 10%
random / 10% kept, a new mask every epoch. Without next-sentence prediction (BertForMaskedLM):
`--config.model.next_sentence=False --config.data.objective=mlm`.

  t5lite train --config=bert_base --workdir=runs/bert_base
"""

from t5lite import config as t5config


def get_config():
  config = t5config.base_config()
  config.model.update(
      t5config.BERT,
      arch='encoder',
      vocab_size=30592,
      d_model=768,
      d_ff=3072,
      num_heads=12,
      d_kv=64,
      num_encoder_layers=12,
      num_decoder_layers=0,
      max_length=512,
      next_sentence=True,
      mlm_transform='bert')
  config.data.update(objective='mlm_nsp', inputs_length=512, targets_length=0, batch_size=256,
                     noise_density=0.15)
  config.train.update(steps=1_000_000)
  # Adam, lr 1e-4, 10k warmup steps, weight decay 0.01 (the paper decays linearly, not cosine)
  config.optim.update(name='adamw', schedule='cosine', learning_rate=1e-4, warmup_steps=10_000,
                      weight_decay=0.01)
  return config
