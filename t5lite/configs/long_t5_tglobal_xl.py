"""LongT5-TGlobal xl (Guo et al. 2022; 2.85B parameters): T5 v1.1 xl's layers
(`t5_1_1_xl`) with a transient-global encoder, pretrained as the paper: 4,096 input and
910 target tokens of PEGASUS's principal sentences. `:span_corruption` pretrains with T5's span
corruption at the same lengths instead.

  t5lite train --config=long_t5_tglobal_xl --workdir=runs/long_t5_tglobal_xl \
      --config.data.source=stores/c4
"""

from t5lite import config as t5config


def get_config(objective: str = 'principal_sentences'):
  return t5config.long_t5('t5_1_1_xl', 'transient_global', objective)
