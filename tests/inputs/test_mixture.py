"""Mixtures: the schedule's counts over every window, O(1) lookup against a replay, batches on any
process count, resume, reweighting and adding a component, rate helpers, bad inputs, `data
--out`'s `component`, and a run trained from two token stores."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from t5lite import cli
from t5lite import config as config_lib
from t5lite.inputs import batches
from t5lite.inputs import mixture
from t5lite.inputs import pipeline
from tests.train.test_loop import SMALL

WORDS = ('the whale ship sea captain mind letter house sister ball dance carriage harpoon '
         'congress nation people war peace union states money law year great').split()


def write_text(path, count: int, seed: int) -> str:
  """`count` documents of 20 to 80 random words, separated by blank lines."""
  rng = np.random.default_rng(seed)
  path.write_text('\n\n'.join(' '.join(rng.choice(WORDS, rng.integers(20, 80))) + '.'
                              for _ in range(count)))
  return str(path)


@pytest.fixture(scope='module')
def texts(tmp_path_factory):
  folder = tmp_path_factory.mktemp('texts')
  return {name: write_text(folder / f'{name}.txt', 200, seed)
          for seed, name in enumerate(('books', 'code', 'web'))}


def mixed(small_data, texts, **weights):
  data = small_data()
  for name, weight in weights.items():
    data.mixture[name] = dict(source=texts[name], weight=weight)
  return data


def take(batches_, n):
  return [next(batches_) for _ in range(n)]


def single(data, start=0, split='train'):
  return batches.make_batches(data, split, process_index=0, process_count=1, start=start)


def concatenated(batch_list):
  return {name: np.concatenate([b[name] for b in batch_list]) for name in batch_list[0]}


def counts_in_windows_are_within(weights: dict, longest: int, tolerance: float) -> bool:
  schedule = mixture.Schedule(mixture.rows_per_cycle(weights))
  shares = np.array([weights[n] for n in schedule.names]) / sum(weights.values())
  rows = np.tile(schedule.component, 2)  # windows across the cycle's end too
  seen = np.concatenate([np.zeros((1, len(shares))), np.cumsum(
      rows[:, None] == np.arange(len(shares)), axis=0)])
  return all(np.abs(seen[length:] - seen[:-length] - shares * length).max() <= tolerance
             for length in range(1, longest + 1))


@pytest.mark.parametrize('weights', [dict(a=1, b=2), dict(a=0.7, b=0.2, c=0.1),
                                     dict(a=5, b=3, c=1, d=1, e=0.25), dict(a=1, b=1000)])
def test_every_window_holds_each_component_within_two_rows_of_its_weight(weights):
  assert counts_in_windows_are_within(weights, longest=300, tolerance=2)


def test_rows_per_cycle_by_largest_remainder():
  assert mixture.rows_per_cycle(dict(b=2, a=1)) == dict(a=341, b=683)
  assert mixture.rows_per_cycle(dict(a=1, b=1, c=1)) == dict(a=342, b=341, c=341)
  tiny = mixture.rows_per_cycle(dict(a=1, b=3000))  # 1024 rows would give `a` none
  assert sum(tiny.values()) == 4096 and tiny == dict(a=1, b=4095)
  with pytest.raises(ValueError, match=r'^data.mixture.a.weight is below 1/1,048,576'):
    mixture.rows_per_cycle(dict(a=1, b=2e6))
  # weights whose sum is past the largest float, or below the smallest normal one
  assert mixture.rows_per_cycle(dict(a=1.7e308, b=0.85e308)) == dict(a=683, b=341)
  assert mixture.rows_per_cycle(dict(a=5e-324, b=1e-323)) == dict(a=341, b=683)


def test_the_pipelines_lookup_equals_a_replay_of_the_schedule():
  segment = mixture.Segment(dict(a=3, b=5, c=2), start=70, examples=dict(a=4, c=9))
  rows = tf.range(70, 70 + 4 * segment.schedule.cycle + 3, dtype=tf.int64)
  components, examples = pipeline._locate(segment, rows)
  seen = dict(a=4, b=0, c=9)
  for row, component, example in zip(rows.numpy(), components.numpy(), examples.numpy()):
    name = 'abc'[component]
    assert example == seen[name]
    seen[name] += 1
    assert segment.examples_before(row + 1) == seen


def test_rates_by_size_with_a_cap_and_a_temperature():
  sizes = dict(a=100, b=400, c=1600)
  assert mixture.rates_by_size(sizes) == sizes
  assert mixture.rates_by_size(sizes, cap=900) == dict(a=100, b=400, c=900)
  assert mixture.rates_by_size(sizes, cap=900, temperature=2) == pytest.approx(
      dict(a=10, b=20, c=30))
  assert mixture.rates_by_size(sizes, temperature=2) == pytest.approx(dict(a=10, b=20, c=40))


def test_batches_carry_each_rows_component_in_the_weights(small_data, texts):
  data = mixed(small_data, texts, web=3, books=1)
  rows = concatenated(take(single(data), 4))
  assert rows['component'].dtype == np.int32 and rows['component'].shape == (32,)
  # sorted by name: books 0, web 1; 256 and 768 rows per cycle of 1024: b w w w, repeated
  np.testing.assert_array_equal(rows['component'], np.tile([1, 0, 1, 1], 8))


def test_processes_together_give_the_one_process_batches(small_data, texts):
  data = mixed(small_data, texts, web=3, books=1, code=2)
  whole = take(single(data), 3)
  halves = [take(batches.make_batches(data, process_index=p, process_count=2), 3)
            for p in range(2)]
  for k in range(3):
    for name in whole[k]:
      np.testing.assert_array_equal(
          whole[k][name], np.concatenate([halves[0][k][name], halves[1][k][name]]))


def test_resume_gives_the_uninterrupted_batches(small_data, texts):
  data = mixed(small_data, texts, web=3, books=1)
  uninterrupted = take(single(data), 6)
  first = single(data)
  take(first, 2)
  state = json.loads(json.dumps(first.state()))
  assert state['batch'] == 2 and state['rows_per_cycle.web'] == 768
  for start in (state, 2):
    resumed = take(single(data, start=start), 4)
    for a, b in zip(resumed, uninterrupted[2:]):
      for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def component_rows(batch_list, index: int) -> np.ndarray:
  """The encoder inputs of the rows of component `index`, in order."""
  rows = concatenated(batch_list)
  return rows['encoder_input_tokens'][rows['component'] == index]


def alone(small_data, texts, name: str, rows: int) -> np.ndarray:
  """The first `rows` examples of component `name`, as a mixture of it alone gives them."""
  data = mixed(small_data, texts, **{name: 1})
  return component_rows(take(single(data), -(-rows // 8)), 0)[:rows]


@pytest.mark.parametrize('after', [dict(web=1, books=3), dict(web=3, books=1, code=2)])
def test_reweighting_or_adding_continues_every_component_at_its_next_example(
    small_data, texts, after):
  before = mixed(small_data, texts, web=3, books=1)
  first = single(before)
  seen = take(first, 3)
  resumed = mixed(small_data, texts, **after)
  rest = take(single(resumed, start=json.loads(json.dumps(first.state()))), 3)
  names = sorted(after)
  for name in names:
    index_before = sorted(before.mixture).index(name) if name in before.mixture else None
    ours = np.concatenate([component_rows(seen, index_before) if index_before is not None
                           else np.zeros((0, 64), np.int32),
                           component_rows(rest, names.index(name))])
    np.testing.assert_array_equal(ours, alone(small_data, texts, name, len(ours)), err_msg=name)


def test_validation_mixes_each_components_held_out_split(small_data, texts):
  data = mixed(small_data, texts, web=1, books=1)
  train = concatenated(take(single(data), 2))
  validation = concatenated(take(single(data, split='validation'), 2))
  np.testing.assert_array_equal(validation['component'], np.tile([0, 1], 8))
  assert not (set(map(bytes, validation['encoder_input_tokens']))
              & set(map(bytes, train['encoder_input_tokens'])))


def data_command(capsys, *flags):
  status = cli.main(['data', *SMALL[:1], '--config.data.batch_size=8',
                     '--config.data.inputs_length=32', '--config.data.targets_length=8', *flags])
  out, err = capsys.readouterr()
  return status, out, err


def test_data_out_writes_component_counts_by_weight(texts, tmp_path, capsys):
  out = tmp_path / 'batches.npz'
  status, _, err = data_command(
      capsys, f'--config.data.mixture.web.source={texts["web"]}',
      '--config.data.mixture.web.weight=3', f'--config.data.mixture.books.source={texts["books"]}',
      '--config.data.mixture.books.weight=1', '--num_batches=4', f'--out={out}')
  assert status == 0, err
  component = np.load(out)['component']
  assert component.dtype == np.int32 and component.shape == (4, 8)
  assert np.bincount(component.ravel()).tolist() == [8, 24]


def test_weights_of_1e308_mix_as_weights_of_1(texts, tmp_path, capsys):
  """Their sum is past the largest float: they were refused as 'below 1/1,048,576 of the
  total'."""
  written = []
  for weight in (1, 1e308):
    written.append(tmp_path / f'{weight}.npz')
    status, _, err = data_command(
        capsys, *(f'--config.data.mixture.{name}.{setting}={value}' for name in ('books', 'web')
                  for setting, value in (('source', texts[name]), ('weight', weight))),
        '--num_batches=2', f'--out={written[-1]}')
    assert status == 0 and not err, err
  with np.load(written[0]) as ones, np.load(written[1]) as huge:
    assert ones.files == huge.files and np.bincount(ones['component'].ravel()).tolist() == [8, 8]
    for name in ones.files:
      np.testing.assert_array_equal(ones[name], huge[name], err_msg=name)


@pytest.mark.parametrize('flags, message', [
    (['--config.data.mixture.web.weight=0'], 'config.data.mixture.web.weight=0.0 must be a '
                                             'positive finite number'),
    (['--config.data.mixture.web.weight=-1'], 'config.data.mixture.web.weight=-1.0 must be a '
                                              'positive finite number'),
    # inf was 7 lines of numpy warnings, then "negative dimensions are not allowed"
    (['--config.data.mixture.web.weight=inf', '--config.data.mixture.books.weight=1'],
     'config.data.mixture.web.weight=inf must be a positive finite number'),
    (['--config.data.mixture.web.weight=nan'], 'config.data.mixture.web.weight=nan must be a '
                                               'positive finite number'),
    (['--config.data.mixture.web.colour=red'], 'unknown setting config.data.mixture.web.colour'),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.source='],
     "config.data.mixture.web.source must name a source or a token store, or be left out"),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.objective=spans'],
     "data.mixture.web.objective='spans' is not one of span_corruption, mlm,"),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.objective=causal_lm'],
     "data.mixture.web.objective='causal_lm' makes other features than data.objective="
     "'span_corruption' at the run's lengths (encoder_input_tokens)"),
    (['--config.data.objective=mlm', '--config.data.targets_length=0',
      '--config.data.mixture.web.weight=1', '--config.data.mixture.web.objective=electra'],
     "data.mixture.web.objective='electra' computes another loss than data.objective='mlm'"),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.objective=mlm'],
     "data.mixture.web.objective='mlm' makes other features than data.objective="
     "'span_corruption' at the run's lengths (decoder_input_tokens)"),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.objective=bart',
      '--config.data.mixture.web.mode=[NLU]'],
     "data.mixture.web.mode='[NLU]': bart does not read mode (only span_corruption, "
     "seq2seq_lm do)"),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.objective=seq2seq_lm',
      '--config.data.targets_length=32', '--config.data.mixture.web.noise_density=0.3'],
     "data.mixture.web.noise_density=0.3: seq2seq_lm does not read noise_density (only "
     "span_corruption, mlm, mlm_nsp, bart, principal_sentences, electra do)"),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.noise_density=1.5'],
     'config.data.mixture.web.noise_density=1.5 must be in [0, 1)'),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.noise_density=0.5'],
     'data.mixture.web: data.targets_length=8 is too short for span corruption of 32 inputs '
     '(density 0.5, mean span 3.0): it needs 32'),
    (['--config.data.mixture.web.weight=1', '--config.data.mixture.web.source=/no/such.txt'],
     'data.mixture.web: /no/such.txt: no such file'),
])
def test_bad_mixture_is_one_line_exit_2_and_nothing_written(flags, message, tmp_path, capsys):
  out = tmp_path / 'batches.npz'
  status, _, err = data_command(capsys, *flags, f'--out={out}')
  assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err
  assert not out.exists()


def test_a_store_of_another_vocabulary_is_refused_naming_its_component(texts, tmp_path, capsys):
  web = tmp_path / 'web'
  assert cli.main(['prepare', f'--source={texts["web"]}', f'--out={web}']) == 0
  manifest = json.loads((web / 'part-00000-of-00001.json').read_text())
  manifest['vocabulary']['sha256'] = '0' * 64  # as if prepared with another vocabulary
  (web / 'part-00000-of-00001.json').write_text(json.dumps(manifest))
  out = tmp_path / 'batches.npz'
  status, _, err = data_command(
      capsys, f'--config.data.mixture.books.source={texts["books"]}',
      '--config.data.mixture.books.weight=1', f'--config.data.mixture.web.source={web}',
      '--config.data.mixture.web.weight=1', f'--out={out}')
  assert status == 2 and len(err.strip().splitlines()) == 1, err
  assert f"data.mixture.web: {web} was made with the vocabulary 'bundled' (sha256 000000000000)" in err
  assert not out.exists()


def test_a_preset_with_a_nameless_component_or_a_weight_of_text_is_refused():
  config = config_lib.base_config()
  config.data.mixture.web = dict(source='bundled', weight='2')
  with pytest.raises(ValueError, match="^config.data.mixture.web.weight='2' must be a positive"):
    config_lib.validate(config)
  config.data.mixture = {'': dict(source='bundled', weight=1.0)}
  with pytest.raises(ValueError, match='a component name must be a non-empty word'):
    config_lib.validate(config)


@pytest.mark.slow  # two minutes on 2 cores
def test_a_run_trains_from_two_token_stores_and_resumes_reweighted(texts, tmp_path, capsys):
  for name in ('books', 'web'):
    assert cli.main(['prepare', f'--source={texts[name]}', f'--out={tmp_path / name}']) == 0
  workdir = tmp_path / 'run'

  def train(steps, web_weight):
    return cli.main(['train', f'--workdir={workdir}', *SMALL, f'--config.train.steps={steps}',
                     '--config.checkpoint.every_steps=2',
                     f'--config.data.mixture.books.source={tmp_path / "books"}',
                     '--config.data.mixture.books.weight=1',
                     f'--config.data.mixture.web.source={tmp_path / "web"}',
                     f'--config.data.mixture.web.weight={web_weight}'])

  assert train(2, 2) == 0, capsys.readouterr().err
  assert train(4, 3) == 0, capsys.readouterr().err  # resumed at step 2 with another weight
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    losses = {row['step']: row['loss'] for row in map(json.loads, f) if 'loss' in row}
  assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))
  saved = [json.loads(path.read_text()) for path in (workdir / 'checkpoints' / '4').rglob('*')
           if path.is_file() and 'rows_per_cycle.web' in path.read_text(errors='ignore')]
  assert saved, 'the data position of step 4 names the mixture'
  assert saved[0]['processes'][0] == {
      'batch': 4, 'segment_row': 16, 'rows_per_cycle.books': 256, 'rows_per_cycle.web': 768,
      'examples.books': 5, 'examples.web': 11}


LANGUAGES = {  # three languages of three sizes: documents of words of their own script
    'en': ('the whale ship sea captain harbour storm sailor'.split(), 240),
    'ru': ('кит корабль море капитан гавань шторм моряк'.split(), 60),
    'hi': ('व्हेल जहाज़ समुद्र कप्तान बंदरगाह तूफ़ान नाविक'.split(), 15),
}


@pytest.fixture(scope='module')
def language_stores(tmp_path_factory):
  """{language: its byte store}, and a store of the English text in the bundled vocabulary."""
  folder = tmp_path_factory.mktemp('languages')
  rng = np.random.default_rng(0)
  stores = {}
  for language, (words, documents) in LANGUAGES.items():
    text = folder / f'{language}.txt'
    text.write_text('\n\n'.join(' '.join(rng.choice(words, rng.integers(20, 60))) + '.'
                                for _ in range(documents)), encoding='utf-8')
    stores[language] = str(folder / language)
    assert cli.main(['prepare', f'--source={text}', f'--out={stores[language]}',
                     '--vocabulary=bytes']) == 0
  assert cli.main(['prepare', f'--source={folder / "en.txt"}', f'--out={folder / "en_spm"}']) == 0
  return stores, str(folder / 'en_spm')


def by_size(small_data, stores: dict, alpha: float = 0.3, **weights):
  """Byte-vocabulary data mixing `stores` by size ** alpha."""
  data = small_data(vocabulary='bytes', mixture_rule='size', mixture_alpha=alpha)
  for name, source in stores.items():
    data.mixture[name] = dict(source=source, **({'weight': weights[name]} if name in weights
                                                else {}))
  return data


def train_tokens(store: str) -> int:
  return json.loads(open(os.path.join(store, 'part-00000-of-00001.json')).read())['tokens'][
      'train']


@pytest.mark.parametrize('alpha', [0.3, 1.0])
def test_size_rule_rates_are_the_stores_sizes_to_the_alpha(small_data, language_stores, alpha):
  """Component i at n_i ** alpha / sum_j n_j ** alpha, n the train tokens its manifests count:
  the weights exactly, and the rows over 100 cycles within a row a cycle of it (the cycle's
  rounding to whole rows)."""
  stores, _ = language_stores
  data = by_size(small_data, stores, alpha)
  sizes = {name: train_tokens(store) for name, store in stores.items()}
  assert mixture.store_sizes(data) == sizes
  formula = {name: size**alpha / sum(s**alpha for s in sizes.values())
             for name, size in sizes.items()}
  weights = mixture.component_weights(data)
  assert {name: w / sum(weights.values()) for name, w in weights.items()} == pytest.approx(
      formula, rel=1e-12)
  schedule = mixture.Schedule(mixture.rows_per_cycle(weights))
  rows = np.tile(schedule.component, 100)
  for index, name in enumerate(schedule.names):
    assert abs((rows == index).mean() - formula[name]) < 1 / schedule.cycle
  print(f'alpha {alpha}: ' + ', '.join(f'{name} {share:.1%} of the rows ({sizes[name]:,} '
                                        'bytes)' for name, share in formula.items()))
  if alpha == 1:
    assert formula == pytest.approx({name: size / sum(sizes.values())
                                     for name, size in sizes.items()})


def test_size_rule_weights_multiply_and_resume_exactly(small_data, language_stores):
  """A component's weight multiplies its rate; batches resumed from a saved position are the
  uninterrupted run's, their segment the same rows per cycle."""
  stores, _ = language_stores
  data = by_size(small_data, stores, hi=2.0)
  alone = mixture.component_weights(by_size(small_data, stores))
  assert mixture.component_weights(data) == pytest.approx({**alone, 'hi': 2 * alone['hi']})
  uninterrupted = take(single(data), 5)
  first = single(data)
  take(first, 2)
  state = json.loads(json.dumps(first.state()))
  assert {name: state[f'rows_per_cycle.{name}'] for name in stores} == mixture.rows_per_cycle(
      mixture.component_weights(data))
  resumed = take(single(data, start=state), 3)
  for a, b in zip(resumed, uninterrupted[2:]):
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_data_show_prints_the_rates(language_stores, capsys):
  stores, _ = language_stores
  status, out, err = data_command(
      capsys, '--config.data.vocabulary=bytes', '--config.data.mixture_rule=size',
      *(f'--config.data.mixture.{name}.source={store}' for name, store in stores.items()),
      '--show=1')
  assert status == 0, err
  rows = mixture.rows_per_cycle(mixture.rates_by_size(
      {name: train_tokens(store) for name, store in stores.items()}, temperature=1 / 0.3))
  assert f'mixture by size ** 0.3: rows per cycle of {sum(rows.values()):,}' in out
  for name, store in stores.items():
    assert (f'  {name}: {rows[name] / sum(rows.values()):.2%} ({rows[name]:,} rows; '
            f'{train_tokens(store):,} train tokens)') in out


@pytest.mark.parametrize('flags, message', [
    (['--config.data.mixture_alpha=0'], 'config.data.mixture_alpha=0.0 must be in (0, 1]'),
    (['--config.data.mixture_alpha=-0.3'], 'config.data.mixture_alpha=-0.3 must be in (0, 1]'),
    (['--config.data.mixture_alpha=1.5'], 'config.data.mixture_alpha=1.5 must be in (0, 1]'),
    (['--config.data.mixture_rule=sizes'],
     "config.data.mixture_rule='sizes' is not one of weights, size"),
    (['--config.data.mixture.en.source={text}'],
     "data.mixture.en.source='{text}' is no token store: data.mixture_rule='size' reads"),
    (['--config.data.mixture.en.source={en_spm}', '--config.data.vocabulary=bundled'],
     "data.mixture_rule='size' weighs stores by their tokens, and data.mixture.en's holds ids "
     "of the vocabulary 'bundled' (sha256 "),
])
def test_a_bad_size_rule_is_one_line_exit_2_and_nothing_written(
    flags, message, language_stores, tmp_path, capsys):
  stores, en_spm = language_stores
  fill = dict(text=os.path.join(os.path.dirname(en_spm), 'en.txt'), en_spm=en_spm)
  out = tmp_path / 'batches.npz'
  status, _, err = data_command(
      capsys, '--config.data.vocabulary=bytes', '--config.data.mixture_rule=size',
      *(f'--config.data.mixture.{name}.source={store}' for name, store in stores.items()),
      *(flag.format(**fill) for flag in flags), f'--out={out}')
  assert status == 2 and len(err.strip().splitlines()) == 1, err
  assert message.format(**fill) in err, err
  assert not out.exists()


def test_a_size_rule_without_a_mixture_is_refused():
  config = config_lib.base_config()
  config.data.mixture_rule = 'size'
  with pytest.raises(ValueError, match="^config.data.mixture_rule='size' weighs a mixture's"):
    config_lib.validate(config)
