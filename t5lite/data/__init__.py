"""Text -> tokens -> objective -> packed, resumable per-process batches of numpy arrays.

Importing the package loads nothing: `vocabulary` needs SentencePiece alone, and the modules
that run TensorFlow import it through `tf_setup`, which configures it first.
"""
