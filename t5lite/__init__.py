"""t5lite: T5-family pretraining in JAX/Flax."""
