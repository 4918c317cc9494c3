"""LongT5-TGlobal xl (Guo et al. 2022; 2.85B parameters): T5 v1.1 xl's layers
(configs/t5_1_1_xl.py) with a transient-global encoder, pretrained as the paper: 4,096 input and
910 target tokens of PEGASUS's principal sentences. `:span_corruption` pretrains with T5's span
corruption at the same lengths instead.

  t5lite train --config=long_t5_tglobal_xl --workdir=runs/long_t5_tglobal_xl \
      --config.data.source=stores/c4
"""

import os

from t5lite import config as t5config

T5_1_1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), 't5_1_1_xl.py')


def get_config(objective: str = 'principal_sentences'):
  return t5config.long_t5(t5config.load(T5_1_1), 'transient_global', objective)
