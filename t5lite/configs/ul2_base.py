"""UL2 (Tay et al. 2022) at T5 v1.1 base shape (248M parameters, configs/t5_1_1_base.py): the
mixture of seven denoisers of t5lite/objectives/ul2.py over `data.source`, with mode tokens, at
UL2's lengths (512 inputs, 512 targets). `:ul2r` gives UL2R's rates (S 50%, R 25%, X 25%) in
place of UL2's (S 20%).

  t5lite train --config=ul2_base --workdir=runs/ul2_base \
      --config.data.source=stores/c4
  t5lite train --config=ul2_base:ul2r --workdir=runs/ul2r_base --config.data.source=...
"""

import os

from t5lite import config as t5config
from t5lite.objectives import ul2

T5_1_1_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 't5_1_1_base.py')


def get_config(rates: str = 'ul2'):
  config = t5config.load(T5_1_1_BASE)
  config.data.update(inputs_length=512, targets_length=512, mixture=ul2.mixture(rates))
  return config
