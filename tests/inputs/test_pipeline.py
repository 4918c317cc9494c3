"""The pipeline: exact resume, process sharding, determinism, bad inputs, the `data` command."""

import json

import numpy as np
import pytest
import tensorflow as tf

from t5lite.data import store
from t5lite.inputs import batches
from t5lite.inputs import pipeline
from t5lite.objectives import span_corruption

FEATURES = ('encoder_input_tokens', 'encoder_segment_ids', 'encoder_positions',
            'decoder_input_tokens', 'decoder_target_tokens', 'decoder_segment_ids',
            'decoder_positions', 'decoder_loss_weights')


def take(batches, n):
  return [next(batches) for _ in range(n)]


def assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert set(x) == set(y)
    for name in x:
      np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def single(data, split='train', start=0):
  return batches.make_batches(data, split, process_index=0, process_count=1, start=start)


def test_batches_are_what_the_model_reads(small_data):
  data = small_data()
  batch = next(single(data))
  assert set(batch) == set(FEATURES)
  assert all(v.dtype == np.int32 for v in batch.values())
  assert batch['encoder_input_tokens'].shape == (8, 64)
  assert batch['decoder_target_tokens'].shape == (8, 16)
  raw, targets_length = span_corruption.random_spans_helper(64)
  assert (batch['encoder_segment_ids'] == 1).all()  # span corruption fills the inputs exactly
  assert (batch['decoder_segment_ids'].sum(1) == targets_length).all()
  inside = batch['decoder_segment_ids'][:, 1:] > 0  # shifted right within the example
  np.testing.assert_array_equal(batch['decoder_input_tokens'][:, 1:][inside],
                                batch['decoder_target_tokens'][:, :-1][inside])
  assert (batch['decoder_input_tokens'][:, 0] == 0).all()
  np.testing.assert_array_equal(batch['decoder_loss_weights'], batch['decoder_segment_ids'])
  assert raw == 70


def test_resume_from_the_middle_gives_the_uninterrupted_batches(small_data):
  data = small_data()
  batches = single(data)
  uninterrupted = take(batches, 50)
  assert batches.state() == {'batch': 50}
  resumed = single(data, start=json.loads(json.dumps({'batch': 23})))
  assert_same(take(resumed, 27), uninterrupted[23:])
  assert_same(take(single(data, start=23), 27), uninterrupted[23:])  # a step number works too


def test_two_processes_together_give_the_one_process_batch(small_data):
  data = small_data()
  whole = take(single(data, start=3), 4)
  halves = [take(batches.make_batches(data, 'train', process_index=p, process_count=2,
                                      start=3), 4) for p in (0, 1)]
  for k in range(4):
    joined = {name: np.concatenate([halves[0][k][name], halves[1][k][name]]) for name in FEATURES}
    assert halves[0][k]['encoder_input_tokens'].shape[0] == 4
    assert_same([joined], [whole[k]])


def test_same_seed_same_batches_other_seed_other_batches(small_data):
  first = take(single(small_data()), 3)
  assert_same(first, take(single(small_data()), 3))
  other = take(single(small_data(seed=1)), 3)
  assert not np.array_equal(first[0]['encoder_input_tokens'], other[0]['encoder_input_tokens'])


def test_an_epoch_visits_every_chunk_once_with_its_own_cuts(small_data):
  """Example i is chunk index_shuffle(i mod N) of epoch i // N, cut at that epoch's offset."""
  tokens = np.arange(70 * 50 + 33, dtype=np.int32)  # 50 chunks of 70 and 33 tokens to spare
  examples = pipeline._indexed_examples([pipeline._Stream(store.Tokens([tokens]), 70, {}, [0, 0])],
                                        small_data(batch_size=4), share=slice(0, 4),
                                        first_batch=0)
  starts = np.array([x['targets'][0] for x in examples.take(100).as_numpy_iterator()])
  for epoch in (starts[:50], starts[50:]):
    assert len(set(epoch % 70)) == 1  # one offset per epoch, within the spare tokens
    assert sorted(epoch // 70) == list(range(50))
  assert not np.array_equal(starts[:50], starts[50:])


def test_validation_batches_come_from_the_held_out_documents(small_data):
  data = small_data()
  held_out = store.split_tokens(data, 'validation')
  train = store.split_tokens(data, 'train')
  assert held_out.size + train.size == store.split_tokens(data, 'all').size == 3_461_633
  assert 0.01 < held_out.size / train.size < 0.1
  validation = next(single(data, 'validation'))['decoder_target_tokens']
  assert not np.array_equal(validation, next(single(data))['decoder_target_tokens'])


@pytest.mark.parametrize('change, message', [
    (dict(batch_size=7), 'multiple of the 2 processes'),
    (dict(targets_length=10), 'needs 14'),
    (dict(objective='ul2'), "data.objective='ul2' is not one of span_corruption, mlm"),
    (dict(vocabulary='/nonexistent.model'), 'no such file'),
    (dict(validation_fraction=0.0), 'validation split of .* is empty'),
])
def test_configs_that_cannot_work_fail_with_one_line(small_data, change, message):
  with pytest.raises(ValueError, match=message) as error:
    next(batches.make_batches(small_data(**change), 'validation', process_index=0,
                              process_count=2))
  assert '\n' not in str(error.value)


def test_bad_files_are_skipped_or_refused(tmp_path, small_data):
  (tmp_path / 'empty.txt').write_text('')
  long_document = ' '.join(f'token{i}' for i in range(3000))  # many chunks long
  (tmp_path / 'long.txt').write_text(f'{long_document}\n\n   \n\nshort one')
  data = small_data(source=str(tmp_path / '*.txt'), validation_fraction=0.0)
  assert next(single(data))['encoder_input_tokens'].shape == (8, 64)
  (tmp_path / 'bad.txt').write_bytes(b'\xff\xfe\x00 not utf-8 \x80')  # none of it text
  with pytest.raises(ValueError, match=f'^data.source: 1 of the 1 paragraphs of {tmp_path}/bad.txt '
                                       'are malformed \\(non_utf8_documents: 1; the first at '):
    single(small_data(source=f'{tmp_path}/*.txt,{tmp_path}/bad.txt',  # not the cached source
                      validation_fraction=0.0))
  (tmp_path / 'tiny').mkdir()
  (tmp_path / 'tiny' / 'a.txt').write_text('too short for one example')
  with pytest.raises(ValueError, match='fewer than one example of 70'):
    single(small_data(source=str(tmp_path / 'tiny' / 'a.txt'), validation_fraction=0.0))


def test_tfds_source_reads_like_files_and_holds_out_by_hash(tfds_dir, small_data):
  data = small_data(source='tfds:t5lite_test_text/short', tfds_data_dir=tfds_dir)
  first = take(single(data), 3)
  assert_same(first, take(single(data), 3))
  assert_same(take(single(data, start=2), 1), first[2:])
  train, held_out = store.split_tokens(data, 'train'), store.split_tokens(data, 'validation')
  assert (train.size, held_out.size) == (4082, 385)  # 135 documents with text; 12 held out


def test_tfds_without_any_text_fails_with_one_line(tfds_dir, small_data):
  data = small_data(source='tfds:t5lite_test_text/empty', tfds_data_dir=tfds_dir)
  with pytest.raises(ValueError, match='holds no text'):
    next(single(data))


def test_a_streamed_tfds_position_is_refused(small_data):
  with pytest.raises(ValueError, match='a tfds: source streamed by t5lite before'):
    single(small_data(), start={'batch': 5, 'block': 2, 'row': 1})


def test_tfds_name_not_prepared(tmp_path, small_data):
  data = small_data(source='tfds:c4/en:3.1.0', tfds_data_dir=str(tmp_path))
  with pytest.raises(ValueError, match='not prepared'):
    single(data)


def test_write_batches_and_show_examples(tmp_path, small_data):
  data = small_data()
  out = tmp_path / 'batches.npz'
  batches.write_batches(data, 3, str(out))
  saved = np.load(out)
  assert set(saved.files) == set(FEATURES)
  assert saved['encoder_input_tokens'].shape == (3, 8, 64)
  np.testing.assert_array_equal(saved['decoder_target_tokens'][0],
                                next(single(data))['decoder_target_tokens'])
  text = batches.show_examples(data, 2)
  assert text.count('example ') == 2 and '<extra_id_0>' in text


def test_tensorflow_sees_no_accelerator():
  assert not tf.config.get_visible_devices('GPU')
  assert not tf.config.get_visible_devices('TPU')
