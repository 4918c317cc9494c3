"""Config -> batches: the input pipeline over token stores and sources, mixtures and their
schedule, synthetic batches, and fine-tuning tasks' packed rows.

The floor above the data (text -> tokens: t5lite/data/) and the objectives (tokens -> examples:
t5lite/objectives/); it imports both, neither imports it. Importing the package loads nothing:
the modules that run TensorFlow import it through `data.tf_setup`, which configures it first.
"""
