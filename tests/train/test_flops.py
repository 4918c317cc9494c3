"""FLOP counts by hand for tiny configs, a 6ND sanity range for T5 v1.1 base, and device peaks."""

import math
import pathlib
import runpy

import jax
import pytest

from t5lite.config import model_config
from t5lite.models.config import ModelConfig
from t5lite.train import flops

CONFIGS = pathlib.Path(__file__).parents[2] / 'configs'
TINY = dict(vocab_size=100, d_model=8, d_ff=16, num_heads=2, d_kv=4, num_encoder_layers=1,
            num_decoder_layers=1)  # num_heads * d_kv = 8


def test_encoder_decoder_by_hand():
  cfg = ModelConfig(arch='encoder_decoder', activation='gated-gelu', **TINY)
  inputs, targets = 10, 6
  encoder = (4 * 2 * 10 * 8 * 8  # Q, K, V, O projections over 10 tokens: 5120
             + 2 * 2 * 10 * 10 * 8  # q.k scores and weighted values, full: 3200
             + 3 * 2 * 10 * 8 * 16)  # gated FFN, 3 matmuls: 7680
  decoder = (4 * 2 * 6 * 8 * 8  # self-attention projections over 6 tokens: 3072
             + 2 * 2 * 6 * 6 * 8 // 2  # causal scores and values, half: 576
             + 2 * 2 * 6 * 8 * 8  # cross-attention Q, O over the 6 decoder tokens: 1536
             + 2 * 2 * 10 * 8 * 8  # cross-attention K, V over the 10 encoder tokens: 2560
             + 2 * 2 * 6 * 10 * 8  # cross scores and values, 6 queries x 10 keys: 1920
             + 3 * 2 * 6 * 8 * 16)  # gated FFN: 4608
  lm_head = 2 * 6 * 8 * 100  # 9600
  assert (encoder, decoder, lm_head) == (16000, 14272, 9600)
  assert flops.flops_per_example(cfg, inputs, targets) == 39872
  assert flops.train_flops_per_step(cfg, inputs, targets, batch_size=4) == 3 * 39872 * 4


@pytest.mark.parametrize('top_k', [1, 2])
def test_experts_count_the_active_parameters(top_k):
  """2 layers a stack, the second sparse: 4 experts, of which each token runs top_k, and the
  router (d_model x 4) over every token; the experts it skips are not counted."""
  tiny = dict(TINY, num_encoder_layers=2, num_decoder_layers=2)
  dense = ModelConfig(arch='encoder_decoder', activation='gated-gelu', **tiny)
  sparse = ModelConfig(arch='encoder_decoder', activation='gated-gelu', num_experts=4,
                       expert_top_k=top_k, **tiny)
  router = 2 * (10 + 6) * 8 * 4
  more_experts = (top_k - 1) * 3 * 2 * (10 + 6) * 8 * 16
  assert (flops.flops_per_example(sparse, 10, 6)
          == flops.flops_per_example(dense, 10, 6) + router + more_experts)


def test_encoder_only_and_decoder_only_by_hand():
  encoder_only = ModelConfig(arch='encoder', activation='relu', **dict(TINY, num_decoder_layers=0))
  # 10 tokens: projections 5120 + full scores 3200 + ReLU FFN 2 * 2*10*8*16 = 5120;
  # lm head over every input 2*10*8*100 = 16000. targets_length is unused.
  assert flops.flops_per_example(encoder_only, 10, 99) == 5120 + 3200 + 5120 + 16000
  decoder_only = ModelConfig(arch='decoder', activation='relu', **dict(TINY, num_encoder_layers=0))
  # A 4 + 6 = 10 token prefix-LM sequence: as above with causal scores 3200 / 2 = 1600.
  assert flops.flops_per_example(decoder_only, 4, 6) == 5120 + 1600 + 5120 + 16000
  assert flops.flops_per_example(decoder_only, 0, 10) == 5120 + 1600 + 5120 + 16000
  # BERT's MLM transform: a d -> d dense before the lm head at every input, 2*10*8*8 = 1280.
  bert = ModelConfig(arch='encoder', activation='relu', mlm_transform='bert',
                     **dict(TINY, num_decoder_layers=0))
  assert flops.flops_per_example(bert, 10, 99) == 5120 + 3200 + 5120 + 1280 + 16000


def test_electra_by_hand():
  cfg = ModelConfig(arch='electra', activation='relu', generator_size=0.5,
                    **dict(TINY, num_decoder_layers=0))
  # 10 tokens. Discriminator: the encoder layer above 5120 + 3200 + 5120, its head (d -> d, then
  # d -> 1) 2*10*8*9 = 1440. Generator, 1 head of 4, so 4 wide, and d_ff 8: the embeddings
  # projected in 2*10*8*4 = 640, Q, K, V, O 4*2*10*4*4 = 1280, scores 2*2*10*10*4 = 1600, FFN
  # 2*2*10*4*8 = 1280, its MLM transform back to 8 wide 640, lm head 16000.
  assert flops.flops_per_example(cfg, 10, 99) == (
      (13440 + 1440) + (640 + 1280 + 1600 + 1280 + 640 + 16000))


def test_t5_1_1_base_against_6nd():
  cfg = model_config(runpy.run_path(str(CONFIGS / 't5_1_1_base.py'))['get_config']())
  n_params = 247_577_856  # T5 v1.1 base as Hugging Face counts it
  train = flops.train_flops_per_step(cfg, 512, 114, batch_size=1)
  ratio = train / (6 * n_params * (512 + 114))
  # 6ND charges every parameter for every token, but encoder weights (85M) only see the 512
  # inputs and decoder weights plus the lm head (138M) only the 114 targets, and the embedding
  # lookup is free: about 0.42 of 6ND, plus about 0.04 for the attention scores.
  assert 0.40 < ratio < 0.50, ratio


@pytest.mark.parametrize('device_kind, peak, name', [
    ('TPU v4', 275e12, 'TPU v4'),
    ('TPU v5 lite', 197e12, 'TPU v5e'),
    ('TPU v5', 459e12, 'TPU v5p'),
    ('TPU v5p', 459e12, 'TPU v5p'),
    ('TPU v6 lite', 918e12, 'TPU v6e'),
    ('NVIDIA A100-SXM4-40GB', 312e12, 'A100'),
    ('NVIDIA A100 80GB PCIe', 312e12, 'A100'),
    ('NVIDIA H100 80GB HBM3', 989e12, 'H100'),
    ('NVIDIA H200', 989e12, 'H200'),
])
def test_published_peaks(device_kind, peak, name):
  assert flops.peak_from_device_kind(device_kind) == (peak, name)


def test_cpu_peak_is_measured_and_shared_by_the_fake_devices():
  assert flops.peak_from_device_kind('cpu') is None
  peak, name = flops.peak_flops_per_device()
  assert name == 'measured cpu'
  host = flops.measured_matmul_flops(jax.devices()[0])
  assert peak == host / jax.device_count()  # cached: the same measurement both times
  assert 1e8 < host < 1e14 and math.isfinite(host)
