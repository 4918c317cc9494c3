"""The commands `t5lite` runs besides `train`: evaluate, infer, export and import-hf, fine-tune
and plan. Each builds a `t5lite.train.run.Run` from a workdir's or a preset's config and uses the
training library; nothing in `t5lite.train` imports them."""
