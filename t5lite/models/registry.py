"""Every architecture `model.arch` names, registered once: the arch -> its module's `Family`.

Code that depends on the architecture reads a field of `family(cfg.arch)` (models/architecture.py)
instead of switching on the name. Adding one takes its module (the model class and a `FAMILY`), a
preset in t5lite/configs/, a test, and one `register` line here.
"""

from flax import nnx

from t5lite.models import decoder, electra, encoder, encoder_decoder
from t5lite.models.architecture import Family
from t5lite.models.config import ModelConfig

FAMILIES: dict[str, Family] = {}


def register(new: Family) -> None:
  """Makes `new` the family that `model.arch=new.arch` names."""
  if new.arch in FAMILIES:
    raise ValueError(f'model.arch={new.arch!r} is registered already')
  FAMILIES[new.arch] = new


register(encoder_decoder.FAMILY)
register(encoder.FAMILY)
register(decoder.FAMILY)
register(electra.FAMILY)


def family(arch: str) -> Family:
  """The family `model.arch=arch` names."""
  if arch not in FAMILIES:
    raise ValueError(f'model.arch={arch!r} is not one of {", ".join(FAMILIES)}')
  return FAMILIES[arch]


def check(cfg: ModelConfig) -> Family:
  """cfg's family, once it has refused in one line an unknown arch or a setting the family cannot
  take (the checks that `ModelConfig`, below the families, cannot make itself)."""
  checked = family(cfg.arch)
  if cfg.num_experts and not checked.experts:
    raise ValueError(f'model.num_experts={cfg.num_experts}: model.arch={cfg.arch!r} has no '
                     'sparse experts (arch=encoder_decoder has); set it to 0')
  checked.check(cfg)
  model_types = [hf.model_type for hf in checked.hf if not hf.folder]
  if cfg.hf_model_type not in ('', *model_types):
    raise ValueError(f'model.hf_model_type={cfg.hf_model_type!r} is none of arch='
                     f'{cfg.arch}\'s: {", ".join(model_types)}')
  return checked


def stack_names() -> tuple[str, ...]:
  """The layer stacks' names of every family, each once."""
  return tuple(dict.fromkeys(name for registered in FAMILIES.values()
                             for name in registered.stacks))


def build(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
  """The model `cfg.arch` names, initialized from `rngs.params`; `nnx.eval_shape` it for shapes."""
  return check(cfg).model(cfg, rngs=rngs)
