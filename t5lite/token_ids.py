"""The ids every T5 SentencePiece vocabulary reserves, which models, data and losses agree on.

A module of its own, importing nothing, so that the models, the train step and the export read
them without loading the input pipeline's TensorFlow.
"""

PAD_ID = 0  # padding, no loss; also the decoder's start token, as in T5
EOS_ID = 1
UNK_ID = 2
