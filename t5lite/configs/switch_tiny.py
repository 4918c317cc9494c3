"""t5_tiny (configs/t5_tiny.py) as a Switch Transformer: every other MLP of each stack, from the
second layer, is 8 experts of t5_tiny's width, each token routed to one; the same compute per
token (the routers aside: +0.1% FLOPs), 4 times the MLP parameters of those layers.

  t5lite train --config=switch_tiny --workdir=runs/switch_tiny
"""

import os

from t5lite import config as t5config

T5_TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 't5_tiny.py')


def get_config():
  config = t5config.load(T5_TINY)
  config.model.update(num_experts=8, expert_top_k=1, encoder_sparse_step=2,
                      decoder_sparse_step=2)
  return config
