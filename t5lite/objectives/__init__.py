"""The registry of objectives: `data.objective` -> the one object that owns an objective's data,
features, settings and loss (`base.Objective`), and the loss a run trains with.

Adding an objective: its module here (a `base.Objective` subclass), one line in OBJECTIVES,
a preset in t5lite/configs/ and its test.
"""

import ml_collections

from t5lite.data import mixture
from t5lite.models.config import ModelConfig
from t5lite.objectives import bart
from t5lite.objectives import base
from t5lite.objectives import causal_lm
from t5lite.objectives import distillation
from t5lite.objectives import electra
from t5lite.objectives import mlm
from t5lite.objectives import mlm_nsp
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
    electra.OBJECTIVE,
    ul2.S_DENOISER,
)}


def get(name: str) -> Objective:
  """The objective `data.objective` names; one line for an unknown name."""
  if name not in OBJECTIVES:
    raise ValueError(f'data.objective={name!r} is not one of {", ".join(OBJECTIVES)}')
  return OBJECTIVES[name]


def components(data: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict,
                                                               Objective]]:
  """What the rows are made of: a mixture's components sorted by name, each (name, its data
  settings: `mixture.component_data`, its objective), or [('', data, data.objective's)]. One line,
  naming the component, for an objective that is unknown, takes no mode, computes another loss
  than data.objective's or does not make its features at the run's lengths."""
  main = get(data.objective)
  if not data.get('mixture'):
    _check_mode(data, main, 'data')
    return [('', data, main)]
  declared, listed = main.features(data), []
  for name in sorted(data.mixture):
    where = f'data.mixture.{name}'
    view = mixture.component_data(data, name)
    if view.objective not in OBJECTIVES:
      raise ValueError(f'{where}.objective={view.objective!r} is not one of '
                       f'{", ".join(OBJECTIVES)}')
    objective = OBJECTIVES[view.objective]
    _check_mode(view, objective, where)
    if type(objective).loss is not type(main).loss:
      raise ValueError(f'{where}.objective={objective.name!r} computes another loss than '
                       f'data.objective={main.name!r}; a mixture trains one loss')
    features = objective.features(view)
    if features != declared:
      differ = sorted(set(features.items()) ^ set(declared.items()))[0][0]
      raise ValueError(f'{where}.objective={objective.name!r} makes other features than '
                       f'data.objective={main.name!r} at the run\'s lengths ({differ}); every '
                       'component must give the same')
    listed.append((name, view, objective))
  return listed


def _check_mode(data: ml_collections.ConfigDict, objective: Objective, where: str) -> None:
  """A mode (UL2's, the text inputs start with) only for objectives that carry one per row."""
  if data.get('mode') and 'mode' not in objective.row_settings:
    take = [name for name, known in OBJECTIVES.items() if 'mode' in known.row_settings]
    raise ValueError(f'{where}.mode={data.mode!r}: data.objective={objective.name!r} has no '
                     f'inputs to start with it; only {" and ".join(take)} take a mode')


def for_run(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> Objective:
  """`config`'s objective, checked against its model and settings, and every mixture
  component's: one line if they cannot work together, before a run reads data or compiles
  anything."""
  objective = get(config.data.objective)
  objective.check(config, model_cfg)
  for name, _, component in components(config.data):
    try:
      component.check(config, model_cfg)
    except ValueError as error:
      raise ValueError(f'data.mixture.{name}: {error}') from None
  distillation.check(config, objective)
  return objective


def make_loss(config: ml_collections.ConfigDict, model_cfg: ModelConfig,
              teacher: distillation.Teacher | None = None, *, exact_match: bool = False) -> Loss:
  """The loss a run minimises: its objective's, or with a teacher, distilled from it;
  `exact_match` (token losses only) makes evaluation count exact target sequences."""
  objective = for_run(config, model_cfg)
  if teacher is not None:
    return distillation.loss(objective, model_cfg, config.train, teacher)
  return objective.loss(model_cfg, config.train, exact_match=exact_match)


__all__ = ['OBJECTIVES', 'Loss', 'Objective', 'base', 'components', 'for_run', 'get',
           'make_loss']
