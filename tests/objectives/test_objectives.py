"""The objectives registry: every objective's batches (unchanged since they were restructured),
the features each declares, the models each can train, and what adding one takes."""

import hashlib
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import cli
from t5lite import config as config_lib
from t5lite import models
from t5lite import objectives
from t5lite.commands import plan
from t5lite.data import packing
from t5lite.inputs import batches
from t5lite.objectives import base
from t5lite.objectives import causal_lm
from t5lite.train import mesh as mesh_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, 'configs', 't5_tiny.py')
# (inputs_length, targets_length) of each objective's test batches
LENGTHS = {'span_corruption': (32, 8), 'mlm': (32, 0), 'mlm_nsp': (32, 0), 'causal_lm': (0, 32),
           'prefix_lm': (16, 16), 'bart': (32, 32), 'electra': (32, 0), 'seq2seq_lm': (32, 32),
           'principal_sentences': (64, 16)}
# SHA-256 of the first 3 batches of 4 rows (names and bytes of every feature, sorted), made by
# the pipeline before the objectives moved into t5lite/objectives (commit 47ae0b5), and made
# again when the bundled vocabulary was regenerated with UL2's mode tokens (2026-12-04: every
# id moved). A change of TensorFlow's stateless random ops would change them too.
# seq2seq_lm's (UL2's S-denoiser) and principal_sentences' are from the commits that added them.
BATCHES = {'span_corruption': 'ecaa95605a23034c49ec1106', 'mlm': '4e0ad726ae330ab92073cb16',
           'mlm_nsp': 'b240efa98ead7ec0195d753c', 'causal_lm': '7dc2c60c5906f8d64410cedb',
           'prefix_lm': '5de26e3697f5ab1ba44c1b58', 'bart': '1806205cf020528a4e968817',
           'electra': '4e0ad726ae330ab92073cb16',  # ELECTRA reads MLM's batches
           'seq2seq_lm': '8438e96979f74ff1cca2bcef', 'principal_sentences': '1927c8f9c8e2557ca83d5d1f'}


def data_config(objective: str, batch_size: int = 4):
  config = config_lib.load(TINY)
  inputs_length, targets_length = LENGTHS[objective]
  config.data.update(objective=objective, inputs_length=inputs_length,
                     targets_length=targets_length, batch_size=batch_size)
  return config


def test_every_objective_is_tested():
  untested = sorted(set(objectives.OBJECTIVES) - set(LENGTHS))
  assert not untested, f'give {untested[0]} its test lengths in LENGTHS (and its batches in BATCHES)'
  assert set(LENGTHS) == set(BATCHES) == set(objectives.OBJECTIVES)


@pytest.mark.parametrize('objective', sorted(BATCHES))
def test_batches_are_bit_identical_to_before(objective):
  first = batches.make_batches(data_config(objective).data, 'train', process_index=0,
                               process_count=1)
  digest = hashlib.sha256()
  for batch in itertools.islice(first, 3):
    for name in sorted(batch):
      digest.update(name.encode() + batch[name].tobytes())
  assert BATCHES.get(objective) == digest.hexdigest()[:24], (  # a new one's, to pin it
      f'{objective} makes batches {digest.hexdigest()[:24]}')


@pytest.mark.parametrize('objective', sorted(LENGTHS))
def test_synthetic_batches_have_the_pipelines_features(objective):
  data = data_config(objective, batch_size=8).data
  text = next(batches.make_batches(data, 'train', process_index=0, process_count=1))
  data.source = batches.SYNTHETIC
  synthetic = next(batches.make_batches(data, 'train', process_index=0, process_count=1))
  assert {k: (v.shape, v.dtype) for k, v in synthetic.items()} == {
      k: (v.shape, v.dtype) for k, v in text.items()}


@pytest.mark.parametrize('source', ['text', batches.SYNTHETIC])
@pytest.mark.parametrize('objective', sorted(LENGTHS))
def test_every_row_is_one_example_padded_at_its_end(objective, source):
  """What `objectives.one_example_rows` relies on to feed the model no segment ids: in every
  objective's batches (text and synthetic) a row's segment ids are 1 then 0 (padding, at the
  end) and its positions count from 0 over the example. A pipeline that packed two examples a
  row would fail here, not leak one into the other's attention."""
  data = data_config(objective, batch_size=8).data
  if source == batches.SYNTHETIC:
    data.source = source
  for batch in itertools.islice(batches.make_batches(data, 'train', process_index=0,
                                                     process_count=1), 3):
    sides = {name.removesuffix('_segment_ids') for name in batch if name.endswith('_segment_ids')}
    assert sides, f'{objective} has no segment ids to check'
    for side in sides:
      segments, positions = batch[f'{side}_segment_ids'], batch[f'{side}_positions']
      lengths = segments.sum(axis=1)
      expected = np.arange(segments.shape[1])[None, :] < lengths[:, None]
      np.testing.assert_array_equal(segments, expected.astype(segments.dtype), side)
      np.testing.assert_array_equal(positions, np.where(expected, np.arange(segments.shape[1]), 0),
                                    side)


class FeatureRecorder:
  """A stand-in model that records the features it is given and returns zero logits."""

  def __init__(self):
    self.features = None

  def __call__(self, batch, **unused):
    self.features = sorted(batch)
    tokens = batch['decoder_target_tokens']
    return jnp.zeros((*tokens.shape, 8), jnp.float32)


@pytest.mark.parametrize('task', ['', 'sentiment'])
def test_pretraining_models_read_no_segment_ids_a_tasks_do(task):
  """Pretraining rows are one example each (the test above): the loss feeds the model no
  segment ids or positions. A fine-tuning task packs examples: its model reads them."""
  config = data_config('span_corruption')
  config.data.task = task
  loss = objectives.make_loss(config, config_lib.model_config(config))
  batch = next(batches.make_batches(data_config('span_corruption').data, 'train',
                                    process_index=0, process_count=1))
  model = FeatureRecorder()
  loss.sums(model, {k: jnp.asarray(v) for k, v in batch.items()}, None, None, train=False)
  packing_features = [name for name in batch if name.endswith(objectives.PACKING_FEATURES)]
  assert len(packing_features) == 4
  assert model.features == sorted(set(batch) - (set() if task else set(packing_features)))


@pytest.mark.parametrize('objective', sorted(LENGTHS))
def test_plans_abstract_batch_is_what_the_pipeline_feeds(objective):
  data = data_config(objective, batch_size=8).data
  batch = next(batches.make_batches(data, 'train', process_index=0, process_count=1))
  mesh = mesh_lib.make_mesh(config_lib.load(TINY).mesh, jax.devices()[:1])
  abstract = plan.abstract_batch(data, mesh_lib.batch_sharding(
      mesh, mesh_lib.rule_table(config_lib.base_config().mesh.rules)))
  assert {k: (v.shape, v.dtype) for k, v in abstract.items()} == {
      k: (v.shape, v.dtype) for k, v in batch.items()}


def pairing_config(arch: str, objective: str):
  config = data_config(objective)
  config.model.update(arch=arch, next_sentence=objective == 'mlm_nsp' and arch == 'encoder',
                      num_decoder_layers=0 if arch in ('encoder', 'electra') else 2)
  return config


@pytest.mark.parametrize('arch, objective', itertools.product(
    ('encoder_decoder', 'encoder', 'decoder', 'electra'), sorted(LENGTHS)))
def test_impossible_pairings_are_refused_in_one_line(arch, objective):
  config = pairing_config(arch, objective)
  model_cfg = config_lib.model_config(config)
  family, chosen = models.family(arch), objectives.get(objective)
  trainable = (family.sides == chosen.sides and family.objective in (None, objective)
               and chosen.arch in (None, arch))
  if trainable:
    assert objectives.for_run(config, model_cfg) is chosen
    return
  with pytest.raises(ValueError) as error:
    objectives.for_run(config, model_cfg)
  message = str(error.value)
  assert '\n' not in message and 'model.arch=' in message and repr(objective) in message


def test_span_corruption_on_an_encoder_is_refused_before_the_workdir(tmp_path, capsys):
  assert cli.main(['train', f'--workdir={tmp_path / "run"}', f'--config={TINY}',
                   '--config.model.arch=encoder']) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert error == ["t5lite train: error: data.objective='span_corruption' feeds encoder and "
                   "decoder features; model.arch='encoder' reads encoder ones"]
  assert not (tmp_path / 'run').exists()


class ReversedLM(base.Objective):
  """A new objective as a user would add it: GPT's causal LM, reading each chunk backwards."""
  name = 'reversed_lm'
  sides = ('decoder',)

  def raw_length(self, data):
    return base.at_least(data, 'targets_length', 1)

  def row_lengths(self, data):
    return {'targets': data.targets_length}

  def transform(self, examples, data, vocab):
    return causal_lm.causal_examples(examples.map(lambda example: {**example,
                                                         'targets': example['targets'][::-1]}))

  def convert(self, row):
    return packing.decoder_features(row)

  def features(self, data):
    return base.side_features('decoder', data.targets_length, targets=True)


@pytest.mark.slow  # a run of the new objective: about 30 s on 2 cores
def test_a_new_objective_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
  monkeypatch.setitem(objectives.OBJECTIVES, 'reversed_lm', ReversedLM())
  flags = [f'--config={os.path.join(ROOT, "configs", "gpt2_small.py")}',
           '--config.data.objective=reversed_lm', '--config.data.targets_length=16',
           '--config.data.batch_size=8', '--config.model.vocab_size=8192',
           '--config.model.d_model=32', '--config.model.d_ff=64', '--config.model.num_heads=2',
           '--config.model.d_kv=16', '--config.model.num_decoder_layers=1',
           '--config.train.steps=2', '--config.train.eval_every=0', '--config.optim.warmup_steps=0',
           '--config.checkpoint.async_save=false']
  batch = next(batches.make_batches(data_config('causal_lm').data, 'train', process_index=0,
                                      process_count=1))
  config = data_config('causal_lm')
  config.data.objective = 'reversed_lm'
  reversed_batch = next(batches.make_batches(config.data, 'train', process_index=0,
                                               process_count=1))
  np.testing.assert_array_equal(reversed_batch['decoder_target_tokens'],
                                batch['decoder_target_tokens'][:, ::-1])
  assert cli.main(['train', f'--workdir={tmp_path}', *flags]) == 0
  assert (tmp_path / 'checkpoints' / '2').is_dir()
