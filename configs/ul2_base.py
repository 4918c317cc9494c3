"""UL2 (Tay et al. 2022) at T5 v1.1 base shape (248M parameters): the mixture of seven denoisers
of t5lite/objectives/ul2.py over `data.source`, with mode tokens, at UL2's lengths (512 inputs,
512 targets). `:ul2r` gives UL2R's rates (S 50%, R 25%, X 25%) in place of UL2's (S 20%).

  t5lite train --config=configs/ul2_base.py --workdir=runs/ul2_base \
      --config.data.source=stores/c4
  t5lite train --config=configs/ul2_base.py:ul2r --workdir=runs/ul2r_base --config.data.source=...
"""

from t5lite import config as t5config
from t5lite.objectives import ul2


def get_config(rates: str = 'ul2'):
  config = t5config.base_config()
  config.model.update(
      t5config.T5_1_1,
      vocab_size=32128,
      d_model=768,
      d_ff=2048,
      num_heads=12,
      d_kv=64,
      num_encoder_layers=12,
      num_decoder_layers=12)
  config.data.update(inputs_length=512, targets_length=512, mixture=ul2.mixture(rates))
  return config
