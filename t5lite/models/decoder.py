"""model.arch='decoder': GPT-like decoder-only models (and prefix LMs). Not exported to Hugging
Face."""

from collections.abc import Mapping

from flax import nnx
import jax

from t5lite.models import architecture
from t5lite.models.architecture import Family, Shapes, StackShape
from t5lite.models.config import ModelConfig
from t5lite.models.transformer import DecodeCache, Features, LanguageModel, Stack, shared_parts


class DecoderOnly(LanguageModel):
  """GPT-like: one causal stack over `decoder_input_tokens`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed, self.lm_head, self.rngs = shared_parts(cfg, rngs)
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=False,
                         rngs=rngs)

  def hidden_states(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
                    rngs: nnx.Rngs | None = None) -> jax.Array:
    """The batch -> the decoder's final (b, l, d) hidden states."""
    decoder = Features.from_batch(batch, 'decoder')
    return self.decoder(self.embed(decoder.tokens), decoder, deterministic=deterministic,
                        rngs=self.rngs if rngs is None else rngs)

  def init_cache(self, start: jax.Array, length: int) -> DecodeCache:
    """A cache for decoding `length` tokens, prompts included; start (b,) is the position of each
    row's start token, after the left padding of its prompt."""
    return DecodeCache(self.decoder.init_layer_caches(start.shape[0], length), start=start)


def shapes(cfg: ModelConfig, inputs_length: int, targets_length: int) -> Shapes:
  """Everything over one row of inputs and targets, the prefix-LM concatenation (inputs_length 0
  for a plain language model)."""
  length = inputs_length + targets_length
  return Shapes((StackShape(cfg, cfg.num_decoder_layers, length, causal=True),),
                logits_length=length)


def check(cfg: ModelConfig) -> None:
  architecture.require_layers(cfg, 'num_decoder_layers')
  architecture.refuse_next_sentence(cfg)


FAMILY = Family(
    arch='decoder', model=DecoderOnly, sides=('decoder',), objective=None, stacks=('decoder',),
    shapes=shapes, check=check, prompt='decoder', hf=None)
