"""What a model family declares once: `Family`, read through the registry (models/registry.py).

A family module (encoder_decoder.py, encoder.py, decoder.py, electra.py) holds its model class and
a `FAMILY`. Whatever depends on `model.arch` (config checks, FLOP counts, the plan's memory
estimate, layout conversion, decoding, Hugging Face export) reads a field of `family(cfg.arch)`
instead of switching on the name, so an architecture is added in its module and one registry line.
"""

from typing import Callable, NamedTuple

from flax import nnx

from t5lite.models.config import ModelConfig
from t5lite.models.hf_mapping import HfModel


class StackShape(NamedTuple):
  """One layer stack over one training example, as FLOP counts and memory estimates read it."""
  cfg: ModelConfig  # the stack's own config (ELECTRA's generator has fewer heads and less d_ff)
  layers: int
  length: int  # positions it runs over: the queries, and the keys of self-attention
  causal: bool  # a causal kernel skips half of the score and value matmuls
  cross_length: int | None = None  # encoder positions its cross-attention reads; None: none
  sparse_layers: int = 0  # layers whose MLP is sparse experts (models/experts.py)
  # A LongT5 encoder: each query scores its 3 local blocks and the global tokens, not every
  # position (models/long_attention.py `sizes`)
  long_inputs: bool = False


class Shapes(NamedTuple):
  """What one training example runs through: the layer stacks and the heads on top."""
  stacks: tuple[StackShape, ...]
  logits_length: int  # positions with vocabulary logits
  head_flops: float = 0  # matmul FLOPs of the other heads (ELECTRA's discriminator head)


class Family(NamedTuple):
  """One architecture, everything code outside its module needs to know about it."""
  arch: str  # its model.arch
  model: Callable[..., nnx.Module]  # model(cfg, rngs=rngs)
  sides: tuple[str, ...]  # the feature sides the model reads: 'encoder', 'decoder'
  objective: str | None  # the one data.objective it is made for; None: any of its sides'
  stacks: tuple[str, ...]  # its layer stacks' names in the parameter tree
  # (cfg, inputs_length, targets_length) -> what an example runs through
  shapes: Callable[[ModelConfig, int, int], Shapes]
  check: Callable[[ModelConfig], None]  # refuses in one line settings the family cannot take
  # Where `decoding.generate` puts its inputs: 'encoder' (ending in EOS, as in training) or
  # 'decoder' (a prefix the decoder continues); None: the family does not generate.
  prompt: str | None
  # The Hugging Face models it exports as: the first one a config `fits`; (): export refuses.
  hf: tuple[HfModel, ...]
  experts: bool = False  # whether its stacks take sparse experts (model.num_experts)


def require_layers(cfg: ModelConfig, *fields: str) -> None:
  """Refuses a stack of the family without layers: fields like 'num_encoder_layers'."""
  for field in fields:
    if getattr(cfg, field) <= 0:
      raise ValueError(f'model.arch={cfg.arch!r} needs {field} > 0')


def refuse_encoder_heads(cfg: ModelConfig) -> None:
  """For the families without BERT's next-sentence heads and MLM transform."""
  if cfg.next_sentence:
    raise ValueError(f"model.next_sentence is BERT's (arch=encoder), not arch={cfg.arch!r}")
  if cfg.mlm_transform != 'none':
    raise ValueError(f"model.mlm_transform is BERT's and RoBERTa's (arch=encoder), not "
                     f"arch={cfg.arch!r}")


def refuse_long_encoder(cfg: ModelConfig) -> None:
  """For the families without an encoder-decoder's encoder, the one LongT5's attention is."""
  if cfg.encoder_attention != 'dense':
    raise ValueError(f"model.encoder_attention={cfg.encoder_attention} is LongT5's encoder "
                     f"(arch=encoder_decoder), not arch={cfg.arch!r}'s")
