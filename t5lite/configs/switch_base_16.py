"""The Switch Transformer at T5 base with 16 experts (Hugging Face's google/switch-base-16):
configs/switch_base_8.py with 16 experts a sparse layer.

  t5lite train --config=switch_base_16 --workdir=runs/switch_base_16 --config.mesh.expert=8
"""

import os

from t5lite import config as t5config

SWITCH_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'switch_base_8.py')


def get_config():
  return t5config.load(f'{SWITCH_BASE}:16')
