"""t5_tiny distilled (Hinton et al. 2015) into a student of half its depth: 2+2 layers, 8.9M
parameters against the teacher's 13.6M, same width and vocabulary.

The argument is the teacher's workdir (a trained t5_tiny, e.g. from `make demo`); its latest
parameters stay frozen. The student minimises, per target token, 0.5 x cross entropy on the
span-corruption targets + 0.5 x T^2 KL(teacher || student) at temperature T = 2 + 1.0 x
(1 - cos) between the decoders' final hidden states (DistilBERT's cosine loss).

  t5lite train --config=t5_tiny_distill:runs/demo --workdir=runs/tiny_distill
"""

import os

from t5lite import config as t5config

TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 't5_tiny.py')


def get_config(teacher_workdir: str = 'runs/demo'):
  config = t5config.load(TINY)
  config.model.update(num_encoder_layers=2, num_decoder_layers=2)
  config.train.update(teacher_workdir=teacher_workdir, distill_alpha=0.5, distill_temperature=2.0,
                      distill_hidden_weight=1.0)
  return config
