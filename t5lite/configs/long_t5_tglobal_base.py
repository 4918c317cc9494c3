"""LongT5-TGlobal base (Guo et al. 2022; 248M parameters): T5 v1.1 base's layers
(`t5_1_1_base`) with a transient-global encoder, pretrained as the paper: 4,096 input and
910 target tokens of PEGASUS's principal sentences. `:span_corruption` pretrains with T5's span
corruption at the same lengths instead.

  t5lite train --config=long_t5_tglobal_base --workdir=runs/long_t5_tglobal_base \
      --config.data.source=stores/c4
"""

from t5lite import config as t5config


def get_config(objective: str = 'principal_sentences'):
  return t5config.long_t5('t5_1_1_base', 'transient_global', objective)
