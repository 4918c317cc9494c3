"""ModelConfig: every architecture of the family described by its knobs.

One frozen dataclass, hashable so that it can be a static argument to `jax.jit`
(the Flax wmt example's "minimize obnoxious kwarg plumbing"). Invalid
combinations fail here, at construction, with one line that says what to change; `arch` and
what each architecture needs are checked by its family (models/registry.py `check`, which
`build` and `t5lite.config.model_config` call).
"""

import dataclasses

ACTIVATIONS = ('relu', 'gelu', 'gelu_erf', 'gated-gelu', 'gated-silu')
NORMS = ('rms', 'layer')
NORM_POSITIONS = ('pre', 'post')
POSITIONS = ('t5_relative', 'sinusoidal', 'learned', 'rope')
ATTENTIONS = ('auto', 'xla', 'cudnn', 'einsum', 'flash')
REMAT_POLICIES = ('none', 'full', 'save_dots')
DTYPES = ('float32', 'bfloat16', 'float16')
MLM_TRANSFORMS = ('none', 'bert', 'roberta')
EXPERT_WEIGHTS = ('probability', 'normalized')
TYPE_NAMES = {int: 'an integer', float: 'a number', bool: 'true or false', str: 'a string'}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of one Transformer; defaults are T5 v1.0 small."""

  # the family, models/registry.py: encoder_decoder (T5, BART) | encoder (BERT) | decoder (GPT) |
  # electra
  arch: str = 'encoder_decoder'
  vocab_size: int = 32128  # padded to a multiple of 128 (32k SentencePiece + 100 sentinels)
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  d_kv: int = 64  # per-head width; num_heads * d_kv need not equal d_model (T5 3B, 11B, v1.1 small)
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  # relu | gelu (the tanh approximation: GPT-2, HF's gelu_new) | gelu_erf (the exact GELU: BERT,
  # BART, ELECTRA, HF's gelu) | gated-gelu | gated-silu
  activation: str = 'relu'
  norm: str = 'rms'  # rms (T5: scale only, no mean) | layer (BERT, GPT, Vaswani)
  norm_position: str = 'pre'  # pre (T5, GPT-2) | post (BERT, Vaswani)
  norm_eps: float = 1e-6
  position: str = 't5_relative'  # t5_relative | sinusoidal | learned | rope
  relative_buckets: int = 32
  relative_max_distance: int = 128
  # UMT5: a relative bias table in every layer's self-attention, instead of one per stack
  relative_bias_per_layer: bool = False
  max_length: int = 512  # table size for learned positions; unused otherwise
  tie_embeddings: bool = True  # v1.0: lm head = embedding, logits scaled by d_model**-0.5
  embed_norm: bool = False  # BERT, ELECTRA, BART: LayerNorm over token + position embeddings
  # BERT's next-sentence prediction (encoder only): token-type (segment A/B) embeddings and a
  # pooled [CLS] classifier beside the MLM head
  next_sentence: bool = False
  # The MLM head's transform (encoder only), as Hugging Face's: dense d_model -> d_model,
  # activation and norm before the tied output, and a bias per vocabulary entry after it. none
  # (T5's head) | bert (the layers' activation, as BertPredictionHeadTransform's hidden_act) |
  # roberta (the exact erf GELU that RobertaLMHead fixes, whatever the layers')
  mlm_transform: str = 'none'
  use_bias: bool = False  # T5 has no biases; BERT, GPT-2 and Vaswani do
  dropout: float = 0.0
  dtype: str = 'float32'  # compute dtype (bfloat16 on accelerators)
  param_dtype: str = 'float32'
  # auto (what the devices do fastest: cudnn on NVIDIA GPUs in bfloat16 or float16, else xla;
  # `models.attention.kernel_for`, for a run's mesh by make_run) | xla | cudnn
  # (jax.nn.dot_product_attention) | einsum (plain) | flash (Pallas, T5's bias computed in the
  # kernel, Triton's on GPUs and Mosaic's on TPUs: models/flash_attention.py)
  attention: str = 'auto'
  scan_layers: bool = False  # one compiled layer scanned over depth: faster compiles
  scan_unroll: int = 1  # layers per scanned loop iteration (fewer iterations, their slicing)
  remat_policy: str = 'none'  # none | full | save_dots
  # ELECTRA: the generator's heads and d_ff as a fraction of the discriminator's (the paper's
  # "generator size", 1/4 for small and large, 1/3 for base); same d_model and depth
  generator_size: float = 0.25
  # Sparse experts (models/experts.py, the Switch Transformer): num_experts MLPs in place of the
  # MLP of a stack's sparse layers (0: a dense model), each token routed to its expert_top_k most
  # probable ones. Layer i is sparse where i % step == 1 (every layer for step 1), as Hugging
  # Face's SwitchTransformers places them: 2, every other layer from the second; 0, none.
  num_experts: int = 0
  expert_top_k: int = 1
  encoder_sparse_step: int = 2
  decoder_sparse_step: int = 2
  # An expert takes ceil(factor * top_k * group tokens / num_experts) tokens of a group (in
  # training, in evaluation), or expert_capacity of them where > 0 (Hugging Face's fixed one);
  # the others pass through the residual alone.
  train_capacity_factor: float = 1.25
  eval_capacity_factor: float = 2.0
  expert_capacity: int = 0
  expert_group_size: int = 0  # tokens routed together, at most; 0: a row (Hugging Face's)
  expert_dropless: bool = False  # no capacity: every token reaches its experts (ragged matmuls)
  router_jitter: float = 0.01  # training multiplies the router's input by U(1 - j, 1 + j)
  # What an expert's output is weighed by: its router probability (Switch, Hugging Face's) |
  # normalized, divided by the sum over the token's top k (GShard; with top-1 a weight of 1, and
  # a router learnt from its losses alone): an upcycled model then starts as the dense one
  expert_weights: str = 'probability'
  # The Hugging Face model_type an export writes where several fit the same weights (mt5:
  # MT5ForConditionalGeneration for a T5 v1.1); '': the family's first that fits
  hf_model_type: str = ''

  def __post_init__(self):
    for field in dataclasses.fields(self):  # a value read from a JSON file may be of any type
      value = getattr(self, field.name)
      allowed = (int, float) if field.type is float else field.type
      if isinstance(value, bool) and field.type is not bool or not isinstance(value, allowed):
        raise ValueError(f'model.{field.name}={value!r} is not {TYPE_NAMES[field.type]}')

    def choice(name, allowed):
      value = getattr(self, name)
      if value not in allowed:
        raise ValueError(f'model.{name}={value!r} is not one of {", ".join(allowed)}')

    choice('activation', ACTIVATIONS)
    choice('norm', NORMS)
    choice('norm_position', NORM_POSITIONS)
    choice('position', POSITIONS)
    choice('attention', ATTENTIONS)
    choice('remat_policy', REMAT_POLICIES)
    choice('mlm_transform', MLM_TRANSFORMS)
    choice('expert_weights', EXPERT_WEIGHTS)
    choice('dtype', DTYPES)
    choice('param_dtype', DTYPES)
    for name in ('vocab_size', 'd_model', 'd_ff', 'num_heads', 'd_kv', 'max_length',
                 'scan_unroll'):
      if getattr(self, name) <= 0:
        raise ValueError(f'model.{name} must be positive, got {getattr(self, name)}')
    if self.relative_bias_per_layer and self.position != 't5_relative':
      raise ValueError(f'model.relative_bias_per_layer needs position=t5_relative, got '
                       f'{self.position!r}')
    if self.position == 'rope' and self.d_kv % 2:
      raise ValueError(f'rope positions need an even model.d_kv, got {self.d_kv}')
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f'model.dropout must be in [0, 1), got {self.dropout}')
    if not 0.0 < self.generator_size <= 1.0:
      raise ValueError(f'model.generator_size must be in (0, 1], got {self.generator_size}')
    self._check_experts()

  def _check_experts(self):
    for name in ('num_experts', 'encoder_sparse_step', 'decoder_sparse_step', 'expert_capacity',
                 'expert_group_size'):
      if getattr(self, name) < 0:
        raise ValueError(f'model.{name} must be at least 0, got {getattr(self, name)}')
    for name in ('train_capacity_factor', 'eval_capacity_factor'):
      if not getattr(self, name) > 0:
        raise ValueError(f'model.{name} must be positive, got {getattr(self, name)}')
    if not 1 <= self.expert_top_k <= max(self.num_experts, 1):
      raise ValueError(f'model.expert_top_k={self.expert_top_k} must be between 1 and '
                       f'model.num_experts={self.num_experts}')
    if not 0.0 <= self.router_jitter < 1.0:
      raise ValueError(f'model.router_jitter must be in [0, 1), got {self.router_jitter}')

  @property
  def is_gated(self) -> bool:
    return self.activation.startswith('gated-')

  @property
  def differs_in_training(self) -> bool:
    """Whether a training forward pass computes otherwise than evaluation: dropout, and experts'
    capacity and jitter; its loss then runs the model with deterministic=False and a key."""
    return self.dropout > 0 or self.num_experts > 0
