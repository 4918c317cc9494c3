"""UL2's mixture of denoisers (configs/ul2_base.py) on t5_tiny's model, for a CPU: 128 inputs and
128 targets, as long as the 50% denoisers' need after the mode tokens. `:ul2r` for UL2R's rates.

  t5lite train --config=ul2_tiny --workdir=runs/ul2_tiny
"""

import os

from t5lite import config as t5config
from t5lite.objectives import ul2


TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 't5_tiny.py')


def get_config(rates: str = 'ul2'):
  config = t5config.load(TINY)
  config.data.update(inputs_length=128, targets_length=128, mixture=ul2.mixture(rates))
  return config
