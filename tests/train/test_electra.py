"""ELECTRA: replaced-token labels, the discriminator's loss against numpy, the generator's
samples against its softmax, the model's shared embeddings, a mixture's metrics per component
(the generator's), and a 20-step run of the preset."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5lite import cli
from t5lite import config as config_lib
from t5lite.models import ModelConfig, build
from t5lite.objectives import base, electra, losses

from test_loop import ROOT, assert_components_make_up

# configs/electra_small.py shrunk to seconds: one layer of width 64, a generator of one head,
# 32-token MLM rows, AdamW at a constant 3e-3 so that 20 steps show learning.
ELECTRA = ['--config=' + os.path.join(ROOT, 'configs', 'electra_small.py'),
           '--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
           '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
           '--config.model.max_length=64', '--config.model.generator_size=0.5',
           '--config.data.batch_size=8', '--config.data.inputs_length=32',
           '--config.train.steps=20', '--config.train.log_every=1', '--config.train.eval_every=0',
           '--config.optim.schedule=constant', '--config.optim.learning_rate=3e-3',
           '--config.checkpoint.async_save=false']
TINY = ModelConfig(arch='electra', vocab_size=128, d_model=32, d_ff=64, num_heads=4, d_kv=8,
                   num_encoder_layers=1, num_decoder_layers=0, position='learned', max_length=16,
                   norm='layer', norm_position='post', activation='gelu', use_bias=True)


def test_binary_losses_match_numpy():
  logits = np.array([[2.0, -1.0, 0.5], [-3.0, 0.25, 4.0]], np.float32)
  labels = np.array([[True, False, False], [True, True, False]])
  weights = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
  sums = losses.binary_losses(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights))
  p = 1 / (1 + np.exp(-logits.astype(np.float64)))
  bce = -(labels * np.log(p) + (~labels) * np.log(1 - p))
  np.testing.assert_allclose(sums['loss'], np.sum(bce * weights), rtol=1e-6)
  assert float(sums['weight']) == 5
  assert float(sums['correct']) == 3  # 2>0 T, -1<0 F, 0.5>0 vs F wrong; -3 vs T wrong, 0.25 T


def test_a_sample_equal_to_the_original_is_not_replaced():
  # The MLM batch: targets hold the original at the masked positions and 0 elsewhere.
  batch = {'encoder_input_tokens': jnp.array([[5, 99, 99, 8, 0]]),
           'encoder_target_tokens': jnp.array([[0, 6, 7, 0, 0]]),
           'encoder_loss_weights': jnp.array([[0, 1, 1, 0, 0]])}
  original = electra.original_tokens(batch)
  np.testing.assert_array_equal(original, [[5, 6, 7, 8, 0]])
  sampled = jnp.array([[9, 6, 3, 9, 9]])
  inputs, replaced = electra.replace_tokens(original, batch['encoder_loss_weights'] > 0,
                                            sampled)
  np.testing.assert_array_equal(inputs, [[5, 6, 3, 8, 0]])
  np.testing.assert_array_equal(replaced, [[False, False, True, False, False]])


def test_samples_follow_the_generators_softmax_and_are_never_padding():
  logits = jnp.log(jnp.array([0.7, 0.1, 0.2, 0.3, 0.4]))  # the padding id 0 would be likeliest
  samples = np.asarray(electra.sample_tokens(
      jax.random.PRNGKey(0), jnp.broadcast_to(logits, (40, 500, 5))))
  counts = np.bincount(samples.reshape(-1), minlength=5) / samples.size
  expected = np.array([0, 0.1, 0.2, 0.3, 0.4])
  # 20,000 draws: a standard error below 0.0035 per frequency
  np.testing.assert_allclose(counts, expected, atol=0.012)


def test_generator_is_narrower_and_shares_the_embeddings():
  model = nnx.eval_shape(lambda: build(TINY, nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  assert set(params) == {'embed', 'generator', 'generator_head', 'discriminator',
                         'discriminator_dense', 'discriminator_output'}
  # one learned position table, stored once (under the discriminator) and read by both stacks
  assert 'position_embedding' in params['discriminator']
  assert 'position_embedding' not in params['generator']
  assert model.generator.position_embedding is model.discriminator.position_embedding
  # a quarter of the 4 heads of 8, so 8 wide: the 32-wide embeddings are projected in, and the
  # MLM head's transform projects back to the tied embedding
  generator = params['generator']
  assert generator['embed_projection']['kernel'].shape == (32, 8)
  assert generator['layers'][0]['self_attention']['q']['kernel'].shape == (8, 1, 8)
  assert generator['layers'][0]['mlp']['wi']['kernel'].shape == (8, 16)
  assert params['generator_head']['dense']['kernel'].shape == (8, 32)
  assert params['generator_head']['output_bias'].shape == (128,)


def masked_batch():
  """4 rows of 12 tokens, a third of them masked, padding in the last."""
  rng = np.random.RandomState(0)
  original = rng.randint(3, 128, (4, 12)).astype(np.int32)
  original[-1, 8:] = 0  # padding
  masked = (rng.rand(4, 12) < 0.3) & (original > 0)
  return original, masked, {'encoder_input_tokens': np.where(masked, 127, original),
                            'encoder_target_tokens': np.where(masked, original, 0),
                            'encoder_loss_weights': masked.astype(np.int32)}


def test_the_loss_is_mlm_plus_fifty_times_the_discriminators():
  model = build(TINY, nnx.Rngs(0))
  config = config_lib.base_config()
  loss = electra.OBJECTIVE.loss(TINY, config.train)
  original, masked, batch = masked_batch()
  sums = jax.jit(lambda batch: loss.sums(model, batch, None, jax.random.PRNGKey(1),
                                         train=True))(batch)
  assert float(sums['mlm']['weight']) == masked.sum()
  assert float(sums['discriminator']['weight']) == (original > 0).sum()  # every real token
  assert 0 < float(sums['discriminator']['replaced']) <= masked.sum()
  metrics = loss.metrics(sums)
  np.testing.assert_allclose(metrics['loss'],
                             metrics['mlm_loss'] + 50 * metrics['discriminator_loss'], rtol=1e-6)
  np.testing.assert_allclose(loss.minimised(sums, loss.denominators(batch)),
                             metrics['loss'], rtol=1e-6)


def test_a_mixtures_loss_per_component_is_the_generators_mlm_loss():
  model = build(TINY, nnx.Rngs(0))
  loss = electra.OBJECTIVE.loss(TINY, config_lib.base_config().train)
  _, _, batch = masked_batch()
  batch = base.with_component_groups({**batch, 'component': np.array([0, 1, 1, 0])}, 2)
  metrics = loss.metrics(jax.jit(lambda batch: loss.sums(model, batch, None,
                                                         jax.random.PRNGKey(1), train=True))(batch))
  assert_components_make_up(metrics['components'], metrics['target_tokens'],
                            {'loss': metrics['mlm_loss'], 'accuracy': metrics['mlm_accuracy']})


@pytest.mark.slow  # an ELECTRA run, its evaluation and export: 47-59 s on 2 cores
def test_electra_small_trains_and_its_discriminator_evaluates(tmp_path, capsys):
  assert cli.main(['train', f'--workdir={tmp_path}', *ELECTRA]) == 0
  with open(tmp_path / 'metrics.jsonl', encoding='utf-8') as f:
    rows = [row for row in map(json.loads, f) if 'loss' in row]
  loss, mlm = (np.array([row[name] for row in rows]) for name in ('loss', 'mlm_loss'))
  assert len(rows) == 20 and np.isfinite(loss).all()
  # 0.85 of the first steps' loss with the bundled vocabulary: the 50x discriminator term levels
  # off by step 5
  assert np.mean(loss[-3:]) < 0.9 * np.mean(loss[:3]), loss
  assert np.mean(mlm[-3:]) < np.mean(mlm[:3]) - 0.3, mlm
  capsys.readouterr()
  assert cli.main(['eval', f'--workdir={tmp_path}', '--num_batches=2']) == 0
  evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert evaluated['step'] == 20
  assert 0.5 < evaluated['eval_accuracy'] <= 1 and np.isfinite(evaluated['eval_mlm_loss'])
  # the discriminator is the exported model (its parity with transformers: tests/export)
  hf_dir = f'{tmp_path}_hf'  # export refuses a folder inside the workdir
  assert cli.main(['export', f'--workdir={tmp_path}', f'--out={hf_dir}']) == 0
  with open(os.path.join(hf_dir, 'config.json'), encoding='utf-8') as f:
    exported = json.load(f)
  assert exported['architectures'] == ['ElectraForPreTraining']
  assert (exported['hidden_size'], exported['num_hidden_layers']) == (64, 1)
  # the generator beside it, with the tokenizer too; exporting again replaces both
  with open(os.path.join(hf_dir, 'generator', 'config.json'), encoding='utf-8') as f:
    generator = json.load(f)
  assert generator['architectures'] == ['ElectraForMaskedLM']
  assert (generator['hidden_size'], generator['embedding_size']) == (32, 64)
  assert os.path.isfile(os.path.join(hf_dir, 'generator', 'spiece.model'))
  masks = []  # each tokenizer is its model's: the generator's masks, the discriminator's does not
  for folder in ('', 'generator'):
    with open(os.path.join(hf_dir, folder, 'tokenizer_config.json'), encoding='utf-8') as f:
      masks.append(json.load(f).get('mask_token'))
  assert masks == [None, '<extra_id_0>']
  files = sorted(os.listdir(os.path.join(hf_dir, 'generator')))
  assert sorted(os.listdir(hf_dir)) == sorted([*files, 'generator'])
  assert cli.main(['export', f'--workdir={tmp_path}', f'--out={hf_dir}']) == 0
  with open(os.path.join(hf_dir, 'generator', 'notes.txt'), 'w', encoding='utf-8') as f:
    f.write('mine')  # what export did not write, in its subfolder: refused, kept
  capsys.readouterr()
  assert cli.main(['export', f'--workdir={tmp_path}', f'--out={hf_dir}']) == 2
  assert capsys.readouterr().err.startswith(
      f't5lite export: error: --out={hf_dir} holds generator/notes.txt, which this command does '
      'not write; give a new or empty folder, or --overwrite to replace config.json, ')
