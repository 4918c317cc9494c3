"""UL2's mixture of denoisers on many examples: each denoiser's noise density and mean span
length against the paper's table and T5's span arithmetic, the S-denoiser's split, the mode
tokens' frequencies against UL2's and UL2R's rates, every row's lengths; the S-denoiser's
examples; mode tokens typed as text; and the presets' refusals."""

import collections
import json
import os

import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite.data import vocabulary
from t5lite.inputs import batches
from t5lite.inputs import mixture
from t5lite.inputs import pipeline
from t5lite.objectives import span_corruption
from t5lite.objectives import ul2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = vocabulary.load_vocabulary('bundled')
MODE = 1  # a mode's ids in the bundled vocabulary, where each is one piece
RAW = 512 - MODE  # the raw tokens of a 512-token input after its mode
# The paper's table (Tay et al. 2022, section 3.1.2): (noise density r, mean span mu)
PAPER = {'r_3_15': (0.15, 3), 'r_8_15': (0.15, 8), 'x_3_50': (0.5, 3), 'x_8_50': (0.5, 8),
         'x_64_15': (0.15, 64), 'x_64_50': (0.5, 64)}


def ul2_rows(rates: str = 'ul2', batch_size: int = 32, num_batches: int = 32):
  """(component name, encoder tokens, decoder targets) of every row of the first batches of
  configs/ul2_base.py's data (512 inputs, 512 targets) on the bundled corpus."""
  config = config_lib.load(os.path.join(ROOT, 'configs', f'ul2_base.py:{rates}'))
  config.data.batch_size = batch_size
  names = sorted(config.data.mixture)
  rows = []
  for batch in batches.make_batches(config.data, 'train', process_index=0, process_count=1):
    for component, inputs, targets in zip(batch['component'], batch['encoder_input_tokens'],
                                          batch['decoder_target_tokens']):
      rows.append((names[component], inputs[inputs > 0], targets[targets > 0]))
    if len(rows) == batch_size * num_batches:
      return config, rows
  raise AssertionError('unreachable: the pipeline is endless')


@pytest.fixture(scope='module')
def rows():
  return ul2_rows()


def sentinels(tokens) -> int:
  """The sentinels in `tokens`: <extra_id_0>, <extra_id_1>, ... in order. Past T5's 100 they go
  on down into the vocabulary's last pieces, as T5's do ((0.5, 3) at 512 inputs has 126 spans)."""
  count = 0
  for token in tokens:
    count += token == VOCAB.vocab_size - 1 - count
  return count


def test_every_row_starts_with_its_denoisers_mode_tokens_at_the_rates(rows):
  config, rows = rows
  modes = {kind: VOCAB.encode_ids([text])[0] for kind, text in ul2.MODES.items()}
  assert modes == {'R': [3], 'X': [4], 'S': [5]}  # one piece each in the bundled vocabulary
  for name, inputs, _ in rows:
    kind = ul2.DENOISERS[name][0]
    assert inputs[:1].tolist() == modes[kind], name
  counts = collections.Counter(ul2.DENOISERS[name][0] for name, *_ in rows)
  # 1024 rows: the schedule keeps every count within a row or two of its rate (not ±sqrt(n))
  assert abs(counts['R'] - 0.4 * 1024) <= 2 and abs(counts['X'] - 0.4 * 1024) <= 2
  assert abs(counts['S'] - 0.2 * 1024) <= 2
  assert len(rows) == 1024 and config.data.inputs_length == config.data.targets_length == 512


def test_ul2r_rates_are_half_s_a_quarter_r_and_x():
  components = config_lib.load(os.path.join(ROOT, 'configs', 'ul2_tiny.py:ul2r')).data.mixture
  rows = mixture.rows_per_cycle({name: c.weight for name, c in components.items()})
  by_kind = collections.Counter()
  for name, count in rows.items():
    by_kind[ul2.DENOISERS[name][0]] += count
    assert components[name].mode == ul2.MODES[ul2.DENOISERS[name][0]]
  assert dict(by_kind) == {'R': 256, 'X': 256, 'S': 512} and rows['x_64_50'] == 64


@pytest.mark.parametrize('name', sorted(PAPER))
def test_each_denoiser_has_the_papers_noise_density_and_span_arithmetic(rows, name):
  """Per example, noise tokens = round(raw x r) and spans = round(noise / mu), as T5's
  random_spans_helper counts them; over all, the density is r and the mean span mu, except
  where T5's arithmetic gives fewer spans: (0.15, 64) at 512 inputs is one span of 90 tokens."""
  config, rows = rows
  density, span = PAPER[name]
  raw_length, targets_length = span_corruption.random_spans_helper(RAW, density, span)
  noise, spans = [], []
  for row_name, inputs, targets in rows:
    if row_name != name:
      continue
    inputs = inputs[MODE:]  # after the mode token
    assert inputs[-1] == 1 and targets[-1] == 1  # EOS ends both
    count = sentinels(inputs)
    assert count == sentinels(targets) and targets[0] == VOCAB.sentinel_id(0)
    kept, noised = len(inputs) - 1 - count, len(targets) - 1 - count
    assert kept + noised == raw_length  # the whole raw chunk, split between the two
    assert len(targets) == targets_length and len(inputs) + MODE <= config.data.inputs_length
    noise.append(noised)
    spans.append(count)
  assert len(noise) >= 100
  assert set(noise) == {round(raw_length * density)}
  assert set(spans) == {max(1, round(round(raw_length * density) / span))}
  assert abs(np.mean(noise) / raw_length - density) < 0.002
  mean_span = np.sum(noise) / np.sum(spans)
  if name == 'x_64_15':
    assert mean_span == 90
  else:
    assert abs(mean_span - span) / span < 0.05, mean_span


def test_the_s_denoiser_splits_at_a_uniform_prefix(rows):
  """Inputs: [S2S], a prefix of p tokens, EOS; targets: the other RAW - p and EOS; p uniform in
  [1, RAW - 1] (T5's random_prefix_noise_mask)."""
  _, rows = rows
  prefixes = []
  for name, inputs, targets in rows:
    if name == 's':
      assert inputs[-1] == 1 and targets[-1] == 1
      prefix = len(inputs) - MODE - 1
      assert prefix + len(targets) - 1 == RAW
      prefixes.append(prefix)
  prefixes = np.array(prefixes)
  assert abs(len(prefixes) - 0.2 * 1024) <= 2 and prefixes.min() >= 1 and prefixes.max() < RAW
  # uniform on 1..510: mean 255.5, sd 147.2; about 205 draws: standard error 10.3
  assert abs(prefixes.mean() - RAW / 2) < 4 * 10.3
  quartiles = np.histogram(prefixes, bins=np.linspace(1, RAW, 5))[0] / len(prefixes)
  assert np.all(np.abs(quartiles - 0.25) < 0.1), quartiles  # 4 standard errors of 0.03


def test_the_s_denoisers_inputs_and_targets_are_its_chunk_in_order():
  config = config_lib.load(os.path.join(ROOT, 'configs', 't5_tiny.py'))
  config.data.update(objective='seq2seq_lm', inputs_length=24, targets_length=24, batch_size=8)
  causal = config_lib.load(os.path.join(ROOT, 'configs', 't5_tiny.py')).data
  causal.update(objective='causal_lm', inputs_length=0, targets_length=24, batch_size=8)
  split = next(batches.make_batches(config.data, 'train', process_index=0, process_count=1))
  whole = next(batches.make_batches(causal, 'train', process_index=0, process_count=1))
  for row in range(8):  # the same chunk of 24 tokens (the same raw length and keys) either way
    inputs = split['encoder_input_tokens'][row]
    targets = split['decoder_target_tokens'][row]
    prefix, rest = inputs[:np.argmax(inputs == 1)], targets[:np.argmax(targets == 1)]
    assert np.concatenate([prefix, rest]).tolist() == whole['decoder_target_tokens'][row].tolist()
    assert len(prefix) >= 1 and len(rest) >= 1


def test_mode_tokens_typed_as_text_are_the_ids_pretraining_put_there():
  """`t5lite infer` encodes its input text whole: '[NLU] text' is the mode's ids, then the text's."""
  for mode in ul2.MODES.values():
    text = 'The whale <extra_id_0> the sea.'
    assert VOCAB.encode_ids([f'{mode} {text}'])[0] == (VOCAB.encode_ids([mode])[0]
                                                       + VOCAB.encode_ids([text])[0])


def test_the_six_span_corruption_denoisers_are_read_in_one_chain():
  """Their noise and mode are `row_settings`: each chunk carries its own (the rows' statistics
  per denoiser are checked above), so UL2 is two tf.data chains, not seven."""
  data = config_lib.load(os.path.join(ROOT, 'configs', 'ul2_tiny.py')).data
  groups = pipeline._groups(mixture.components(data))
  assert [[name for _, (name, *_) in group] for group in groups] == [
      ['r_3_15', 'r_8_15', 'x_3_50', 'x_64_15', 'x_64_50', 'x_8_50'], ['s']]


def test_targets_too_short_for_a_denoiser_are_refused_naming_it():
  config = config_lib.load(os.path.join(ROOT, 'configs', 'ul2_tiny.py'))
  config.data.targets_length = 100
  with pytest.raises(ValueError, match=r"^data.mixture.x_3_50: data.targets_length=100 is too "
                                       r"short for span corruption of 128 inputs \(density 0.5, "
                                       r"mean span 3.0\): it needs 126$"):
    next(batches.make_batches(config.data, 'train', process_index=0, process_count=1))
  for name in ('x_3_50', 'x_8_50', 'x_64_50'):  # density 0.5 needs 126 too
    del config.data.mixture[name]
  with pytest.raises(ValueError, match=r"^data.mixture.s: data.targets_length=100 is too short "
                                       r"for seq2seq_lm of 128 inputs: its targets take up to 127"):
    next(batches.make_batches(config.data, 'train', process_index=0, process_count=1))
  with pytest.raises(ValueError, match="UL2 rates 'ul3' are not one of ul2, ul2r"):
    ul2.mixture('ul3')


@pytest.mark.slow  # a minute on 2 cores: trains, evaluates, exports, decodes
@pytest.mark.filterwarnings('ignore:Using the model-agnostic default `max_length`')
def test_a_ul2_run_logs_each_denoiser_evaluates_a_file_and_exports_as_t5(tmp_path, capsys):
  """configs/ul2_tiny.py, shrunk: every train and eval row holds each denoiser's loss; `eval
  --data` reads a file as one source; the export is a T5ForConditionalGeneration whose greedy
  decoding of '[S2S] ...' is `t5lite infer`'s."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from t5lite import cli  # pylint: disable=import-outside-toplevel
  workdir, out = tmp_path / 'ul2', tmp_path / 'hf'
  shrunk = ['--config.model.d_model=64', '--config.model.d_ff=128', '--config.model.num_heads=2',
            '--config.model.d_kv=32', '--config.model.num_encoder_layers=1',
            '--config.model.num_decoder_layers=1', '--config.data.batch_size=8']
  assert cli.main(['train', f'--workdir={workdir}',
                   f'--config={os.path.join(ROOT, "configs", "ul2_tiny.py")}', *shrunk,
                   '--config.train.steps=4', '--config.train.log_every=2',
                   '--config.train.eval_every=4', '--config.train.eval_batches=2',
                   '--config.checkpoint.async_save=false']) == 0
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  train_row = next(r for r in rows if r['step'] == 4 and 'loss' in r)
  eval_row = next(r for r in rows if 'eval_loss' in r)
  for name in ul2.DENOISERS:  # 8 rows a step: each denoiser has rows within the 4 steps
    assert 0 < train_row[f'loss/{name}'] < 20 and 0 <= train_row[f'accuracy/{name}'] <= 1
    assert 0 < eval_row[f'eval_loss/{name}'] < 20
  capsys.readouterr()

  text = tmp_path / 'held_out.txt'
  text.write_text(' '.join(['The whale swam far out to sea and did not come back.'] * 40))
  assert cli.main(['eval', f'--workdir={workdir}', f'--data={text}']) == 0
  metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert metrics['step'] == 4 and 0 < metrics['eval_loss'] < 20
  assert not any('/' in key for key in metrics)  # one source: no components

  assert cli.main(['export', f'--workdir={workdir}', f'--out={out}']) == 0
  prompt = '[S2S] The whale swam'
  assert cli.main(['infer', f'--workdir={workdir}', f'--input={prompt}',
                   '--max_decode_length=6']) == 0
  ours = capsys.readouterr().out.strip().splitlines()[-1]
  hf = transformers.T5ForConditionalGeneration.from_pretrained(str(out)).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  ids = tokenizer(prompt, return_tensors='pt').input_ids
  assert ids[0].tolist() == VOCAB.encode_ids([prompt])[0] + [1]  # the mode's ids, then EOS
  with torch.no_grad():
    theirs = hf.generate(ids, max_new_tokens=6, do_sample=False)[0, 1:].tolist()
  assert hf.config.model_type == 't5' and len(theirs) >= 1
  assert VOCAB.decode(theirs) == ours  # the same ids: `generate`'s are infer's
  words = [i for i in theirs if i < VOCAB.num_pieces]  # HF's decode drops the sentinels
  assert tokenizer.decode(words, skip_special_tokens=True) == VOCAB.decode(words)
