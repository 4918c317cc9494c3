"""`t5lite eval`: held-out metrics of a workdir's latest checkpoint."""

import ml_collections

from t5lite.inputs import batches as batches_lib
from t5lite.train import loop
from t5lite.train import run as run_lib


def evaluate_workdir(config: ml_collections.ConfigDict, workdir: str, data: str | None = None,
                     num_batches: int | None = None, inputs: loop.Inputs | None = None) -> dict:
  """Held-out loss/accuracy of the latest checkpoint on the validation split or a given file,
  or on the held-out batches of `inputs` (a fine-tuning task's, with exact match).

  A distilled student is evaluated on its own (its teacher need not exist any more); an ELECTRA
  run reports its generator's and discriminator's metrics; a mixture's, each component's too. A
  given file is one source, read with data.objective and data's settings, a mixture's or not."""
  split = 'validation'
  if data:
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.source, config.data.mixture, split = data, ml_collections.ConfigDict(), 'all'
  run = run_lib.make_run(config)
  step, params = run.restore_params(workdir)
  with run.sharding():
    loss = run.loss(exact_match=bool(inputs and inputs.exact_match))
    batches, count = inputs.held_out() if inputs else (
        batches_lib.make_batches(config.data, split), config.train.eval_batches)
    metrics = loop.evaluate(run.jit_eval_step(loss), loss, params, batches,
                            num_batches or count, run.batch_sharding, run.components)
  return {'step': step, **metrics}
