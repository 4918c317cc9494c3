"""The registry of objectives: `data.objective` -> the one object that owns an objective's data,
features, settings and loss (`base.Objective`), and the loss a run trains with. Mixtures of them
are the input pipeline's (t5lite/inputs/mixture.py), which imports this, not the other way.

Adding an objective: its module here (a `base.Objective` subclass), one line in OBJECTIVES,
a preset in t5lite/configs/ and its test.
"""

import ml_collections

from t5lite.models.config import ModelConfig
from t5lite.objectives import bart
from t5lite.objectives import base
from t5lite.objectives import causal_lm
from t5lite.objectives import distillation
from t5lite.objectives import electra
from t5lite.objectives import mlm
from t5lite.objectives import mlm_nsp
from t5lite.objectives import principal_sentences
from t5lite.objectives import routing
from t5lite.objectives import span_corruption
from t5lite.objectives import ul2
from t5lite.objectives.base import Loss, Objective

OBJECTIVES = {objective.name: objective for objective in (
    span_corruption.OBJECTIVE,
    mlm.OBJECTIVE,
    mlm_nsp.OBJECTIVE,
    causal_lm.CAUSAL_LM,
    causal_lm.PREFIX_LM,
    bart.OBJECTIVE,
    principal_sentences.OBJECTIVE,
    electra.OBJECTIVE,
    ul2.S_DENOISER,
)}


# The settings of data.objective and its transforms, which a mixture component may also set for
# its own (t5lite/inputs/mixture.py)
SETTINGS = {'objective': str, 'noise_density': float, 'mean_noise_span_length': float,
            'mode': str}


def check_settings(settings: ml_collections.ConfigDict, where: str) -> None:
  """The transforms' settings in range: one line naming `where`.setting (config.data, or a
  mixture's component)."""
  density = settings.get('noise_density', 0.0)
  if not 0 <= density < 1:
    raise ValueError(f'{where}.noise_density={density} must be in [0, 1)')
  span = settings.get('mean_noise_span_length', 1.0)
  if not span > 0:
    raise ValueError(f'{where}.mean_noise_span_length={span} must be positive')


def get(name: str) -> Objective:
  """The objective `data.objective` names; one line for an unknown name."""
  if name not in OBJECTIVES:
    raise ValueError(f'data.objective={name!r} is not one of {", ".join(OBJECTIVES)}')
  return OBJECTIVES[name]


def check_reads(settings: ml_collections.ConfigDict, names, objective: Objective,
                where: str) -> None:
  """Refuses, in one line, a setting of `names` that `objective` does not read (a mixture
  component's own, or a mode, which no objective has a default for)."""
  for name in names:
    if name not in objective.settings:
      take = [known.name for known in OBJECTIVES.values() if name in known.settings]
      raise ValueError(f'{where}.{name}={settings[name]!r}: {objective.name} does not read '
                       f'{name} (only {", ".join(take)} do)')


def set_mode(data: ml_collections.ConfigDict) -> list[str]:
  """['mode'] if `data` sets a mode (UL2's mode token, the text inputs start with), else []."""
  return ['mode'] if data.get('mode') else []


def for_run(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> Objective:
  """`config`'s objective, checked against its model and settings: one line if they cannot work
  together, before a run reads data or compiles anything. (A mixture's components are checked
  with theirs by t5lite/inputs/mixture.py: `check_objectives`.)"""
  objective = get(config.data.objective)
  check_reads(config.data, set_mode(config.data), objective, 'data')
  objective.check(config, model_cfg)
  distillation.check(config, objective)
  return objective


def make_loss(config: ml_collections.ConfigDict, model_cfg: ModelConfig,
              teacher: distillation.Teacher | None = None, *, exact_match: bool = False) -> Loss:
  """The loss a run minimises: its objective's, or with a teacher, distilled from it, and with
  experts, the router's losses besides; `exact_match` (token losses only) makes evaluation count
  exact target sequences."""
  objective = for_run(config, model_cfg)
  if teacher is not None:
    loss = distillation.loss(objective, model_cfg, config.train, teacher)
  else:
    loss = objective.loss(model_cfg, config.train, exact_match=exact_match)
  if model_cfg.num_experts:
    loss = routing.with_router_losses(loss, model_cfg, config.train)
  return loss if config.data.task else one_example_rows(loss)


# The features that tell the examples packed in a row apart (seqio's packed feature names end so)
PACKING_FEATURES = ('_segment_ids', '_positions')


def one_example_rows(loss: Loss) -> Loss:
  """`loss` feeding the model its batches without segment ids and positions.

  Every row of a pretraining batch is one example, padded at its end (the pipeline pads each
  example to a row of its own; synthetic rows are one example too; tests/objectives pin it), so
  they say nothing the tokens do not; without them attention takes lengths and a causal flag for
  a (b, 1, q, k) mask, and cuDNN keeps T5's bias at (1, heads, q, k). A fine-tuning task packs
  several examples a row: its loss reads them.
  """
  def sums(model, batch, *args, **kwargs):
    unpacked = {name: value for name, value in batch.items()
                if not name.endswith(PACKING_FEATURES)}
    return loss.sums(model, unpacked, *args, **kwargs)
  return loss._replace(sums=sums)


__all__ = ['OBJECTIVES', 'PACKING_FEATURES', 'SETTINGS', 'Loss', 'Objective', 'base',
           'check_reads', 'check_settings', 'for_run', 'get', 'make_loss', 'one_example_rows',
           'set_mode']
