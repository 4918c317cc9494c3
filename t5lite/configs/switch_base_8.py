"""The Switch Transformer at T5 base (Fedus et al. 2021; Hugging Face's google/switch-base-8):
T5 v1.0 base (configs/t5_base.py) whose every other MLP, from the second layer of each stack, is
8 experts; each token goes to one of them (619M parameters, the compute of t5_base's 223M).

  t5lite train --config=switch_base_8 --workdir=runs/switch_base_8 --config.mesh.expert=8
  t5lite train --config=switch_base_8:16 --workdir=...  # any number of experts (switch_base_16)
"""

import os

from t5lite import config as t5config

T5_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 't5_base.py')


def get_config(experts: str = '8'):
  config = t5config.load(T5_BASE)
  config.model.update(num_experts=int(experts), expert_top_k=1, encoder_sparse_step=2,
                      decoder_sparse_step=2)
  return config
