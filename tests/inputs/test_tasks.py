"""Text-to-text tasks: parsing, the sentiment split, truncation, packing and exact resume."""

import collections
import csv
import importlib.resources
import json
import logging

import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite.data import vocabulary
from t5lite.inputs import tasks


def task_data(task, **overrides):
  data = config_lib.base_config().data
  data.update(task=task, inputs_key='input', targets_key='target', inputs_length=32,
              targets_length=8, batch_size=4, validation_fraction=0.1)
  data.update(overrides)
  return data


def write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text, encoding='utf-8')
  return str(path)


def test_tsv_and_jsonl_records_by_column_name():
  tsv = 'id\ttarget\tinput\n7\tpositive\tgreat film\n8\tnegative\tdull\n\n'
  assert tasks.read_records('t.tsv', tsv, ('input', 'target')) == [
      (2, ('great film', 'positive')), (3, ('dull', 'negative'))]
  jsonl = '{"input": "great film", "target": "positive", "id": 7}\r\n{"input": "x", "target": "y"}'
  assert tasks.read_records('t.jsonl', jsonl, ('input', 'target')) == [
      (1, ('great film', 'positive')), (2, ('x', 'y'))]


@pytest.mark.parametrize('name, text, message', [
    ('t.tsv', 'text\ttarget\na\tb\n',
     "t.tsv:1: no column 'input' in the header (it has text, target)"),
    ('t.tsv', 'input\ttarget\na\tb\nc\n', 't.tsv:3: 1 tab-separated fields, the header has 2'),
    ('t.tsv', 'input\ttarget\na\tb\n\nc\td\n', 't.tsv:3: blank line'),
    ('t.tsv', 'input\ttarget\n', 't.tsv holds no examples'),
    ('t.tsv', '', 't.tsv holds no examples'),
    ('t.jsonl', '{"input": "a", "target": "b"}\n[1]\n', 't.jsonl:2: not a JSON object'),
    ('t.jsonl', '{"input": "a", "target": "b"}\n{"input": "a"}\n',
     "t.jsonl:2: no text under 'target'"),
    ('t.jsonl', '{"input": 3, "target": "b"}\n', "t.jsonl:1: no text under 'input'"),
    ('t.csv', 'input,target\n', 't.csv: a task file is .tsv or .jsonl'),
])
def test_malformed_task_text_is_one_line_naming_file_and_line(name, text, message):
  with pytest.raises(ValueError) as error:
    tasks.read_records(name, text, ('input', 'target'))
  assert str(error.value).startswith(message) and '\n' not in str(error.value)


def test_empty_inputs_and_targets_and_missing_files(tmp_path):
  path = write(tmp_path, 'e.tsv', 'input\ttarget\ngood\tpositive\n  \tnegative\n')
  with pytest.raises(ValueError, match=r'e.tsv:3: empty input$'):
    tasks.file_examples(path, 'input', 'target', 0.1)
  path = write(tmp_path, 'f.jsonl', '{"input": "good", "target": ""}\n')
  with pytest.raises(ValueError, match=r'f.jsonl:1: empty target$'):
    tasks.file_examples(path, 'input', 'target', 0.1)
  with pytest.raises(FileNotFoundError, match='no such file'):
    tasks.file_examples(str(tmp_path / 'missing.tsv'), 'input', 'target', 0.1)


def test_sentiment_task_is_the_documented_conversion_of_the_raw_file():
  splits = tasks.sentiment_examples()
  # An independent reading of the raw TSV with the csv module.
  raw = importlib.resources.files('t5lite.data').joinpath('bundled/movie_review_sentiment.tsv')
  rows = list(csv.DictReader(raw.read_text('utf-8').splitlines(), delimiter='\t',
                             quoting=csv.QUOTE_NONE))
  assert len(rows) == 10605
  kept = [r for r in rows if abs(float(r['score'])) >= 0.5]
  expected = {split: [('sentiment: ' + r['text'], 'positive' if float(r['score']) > 0
                       else 'negative') for r in kept if (int(r['id']) % 10 == 0) == held_out]
              for split, held_out in (('train', False), ('validation', True))}
  assert {k: [tuple(e) for e in v] for k, v in splits.items()} == expected
  counts = {split: collections.Counter(e.targets for e in splits[split]) for split in splits}
  assert counts == {'train': {'positive': 4487, 'negative': 4578},
                    'validation': {'positive': 509, 'negative': 498}}


def test_task_files_hold_out_by_input_hash_deterministically(tmp_path):
  rng = np.random.default_rng(0)
  lines = [f'example {i} {rng.integers(1 << 30)}\t{"yes" if i % 2 else "no"}' for i in range(2000)]
  lines += [lines[5]] * 3  # duplicates of one input stay in its split
  path = write(tmp_path, 't.tsv', 'input\ttarget\n' + '\n'.join(lines) + '\n')
  first = tasks.file_examples(path, 'input', 'target', 0.1)
  assert first == tasks.file_examples(path, 'input', 'target', 0.1)
  held = len(first['validation'])
  # 10% of 2003 is 200 with a binomial standard deviation of 13.4: within 4 of them.
  assert 146 <= held <= 254
  assert len(first['train']) + held == 2003
  duplicate = tasks.Example(*lines[5].split('\t'))
  assert sum(e == duplicate for e in first['train'] + first['validation']) == 4
  assert (duplicate in first['train']) != (duplicate in first['validation'])


def test_long_inputs_are_truncated_with_eos_last_and_one_warning(caplog):
  vocab = vocabulary.load_vocabulary()
  examples = [tasks.Example('whale ' * 40, 'yes'), tasks.Example('the ship', 'no'),
              tasks.Example('sea ' * 9, 'no')]
  with caplog.at_level(logging.WARNING):
    tokens = tasks.tokenize(examples, vocab, {'inputs': 10, 'targets': 4}, 'task t')
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert warnings == ['task t: 1 of 3 inputs are longer than data.inputs_length=10 tokens with '
                      'EOS and were truncated']
  assert [len(t) for t in tokens['inputs']] == [10, len(vocab.encode('the ship')) + 1, 10]
  assert all(t[-1] == vocabulary.EOS_ID for t in tokens['inputs'] + tokens['targets'])
  np.testing.assert_array_equal(tokens['inputs'][0][:-1], vocab.encode('whale ' * 40)[:9])


def segments(rows, side, tokens_name):
  """The token sequence of every packed segment of `rows`, in order."""
  out = []
  for row_tokens, row_segments in zip(rows[tokens_name], rows[f'{side}_segment_ids']):
    out += [tuple(row_tokens[row_segments == s]) for s in range(1, row_segments.max() + 1)]
  return out


def synthetic_task(tmp_path, count=90):
  """`count` examples of 1 to 7 words (a few held out), and its train split."""
  lines = [f'word{i} ' * (1 + i % 7) + f'\t{"yes" if i % 3 else "no"}' for i in range(count)]
  data = task_data(write(tmp_path, 't.tsv', 'input\ttarget\n' + '\n'.join(lines)))
  return tasks.load_split(data, 'train')


def test_each_epoch_packs_every_example_once_in_its_own_order(tmp_path):
  task = synthetic_task(tmp_path, 300)
  first, second = task.epoch_rows(0), task.epoch_rows(1)
  examples = [tuple(t) for t in task.tokens['inputs']]
  for rows in (first, second):
    assert sorted(segments(rows, 'encoder', 'encoder_input_tokens')) == sorted(examples)
    targets = segments(rows, 'decoder', 'decoder_target_tokens')
    assert len(targets) == task.num_examples
    np.testing.assert_array_equal(rows['decoder_loss_weights'], rows['decoder_segment_ids'] > 0)
  order = segments(first, 'encoder', 'encoder_input_tokens')
  assert order != segments(second, 'encoder', 'encoder_input_tokens')
  assert len(first['encoder_input_tokens']) < task.num_examples / 2  # packed: 2+ per row
  np.testing.assert_array_equal(task.epoch_rows(0)['encoder_input_tokens'],
                                first['encoder_input_tokens'])  # a function of (seed, epoch)


def test_resume_at_any_batch_across_epochs_and_processes_is_exact(tmp_path):
  task = synthetic_task(tmp_path)
  rows_per_epoch = len(task.epoch_rows(0)['encoder_input_tokens'])
  straight = tasks.TaskPipeline(task, 4, 0, 1)
  batches = [next(straight) for _ in range(3 * rows_per_epoch // 4)]  # about three epochs
  assert straight.state()['epoch'] >= 2
  for k in (1, rows_per_epoch // 4, len(batches) - 2):
    by_number = tasks.TaskPipeline(task, 4, 0, 1, start=k)
    first = tasks.TaskPipeline(task, 4, 0, 1)
    for _ in range(k):
      next(first)
    by_state = tasks.TaskPipeline(task, 4, 0, 1, start=json.loads(json.dumps(first.state())))
    for resumed in (by_number, by_state):
      for expected in batches[k:k + 2]:
        got = next(resumed)
        for name in expected:
          np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
  # Two processes: their shares of global batch k are the halves of the one-process batch.
  halves = [tasks.TaskPipeline(task, 4, p, 2, start=[{'batch': 5}, {'batch': 5}][p])
            for p in range(2)]
  parts = [next(h) for h in halves]
  for name in batches[5]:
    np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), batches[5][name])


def test_held_out_batches_hold_every_example_once_then_empty_rows():
  task = tasks.load_split(task_data(tasks.SENTIMENT), 'validation')
  batches = tasks.validation_batches(task, 16, 0, 1)
  rows = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  assert all(b['encoder_input_tokens'].shape == (16, 32) for b in batches)
  targets = segments(rows, 'decoder', 'decoder_target_tokens')
  assert targets == [tuple(t) for t in task.tokens['targets']]  # file order, each once
  used = rows['encoder_segment_ids'].max(1) > 0
  count = used.sum()  # padding rows only at the end, fewer than one batch of them
  assert used[:count].all() and not used[count:].any() and len(used) - count < 16
  shares = [tasks.validation_batches(task, 16, p, 2) for p in range(2)]
  np.testing.assert_array_equal(
      np.concatenate([s[3]['decoder_target_tokens'] for s in shares]),
      batches[3]['decoder_target_tokens'])
