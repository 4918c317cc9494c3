"""`t5lite finetune` end to end on a tiny model, exact match, the best checkpoint, bad requests."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from t5lite import cli
from t5lite.objectives import losses
from t5lite.train import preemption
from tests.train.test_loop import ROOT, SMALL
from tests.texts import keyword_task, random_corpus

TINY = [*SMALL, '--config.train.steps=2']  # t5_tiny shrunk to seconds per run, 8 fake devices
# Learns the keyword task in 20 steps. The SIGTERM test's process runs it too, on as many (fake)
# devices as this one: it then loads the step compiled here from the persistent cache.
FAST = '--config.optim.learning_rate=0.01'


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  """A tiny pretrained workdir: two steps of span corruption on a few short documents (the
  bundled corpus would take longer to tokenize than the steps take)."""
  workdir = tmp_path_factory.mktemp('pretrained')
  text = random_corpus(workdir / 'text.txt')
  assert cli.main(['train', f'--workdir={workdir}', *TINY, f'--config.data.source={text}']) == 0
  return workdir


def finetune(workdir, *flags) -> int:
  return cli.main(['finetune', f'--workdir={workdir}', '--config.checkpoint.async_save=false',
                   *flags])


def eval_rows(workdir) -> list[dict]:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [row for row in map(json.loads, f) if 'eval_exact_match' in row]


def read_position(workdir, step) -> dict:
  with open(workdir / 'checkpoints' / str(step) / 'data' / 'metadata', encoding='utf-8') as f:
    return json.load(f)


@pytest.mark.slow  # a fine-tuning run with evaluations: 33-46 s on 2 cores
def test_finetuning_learns_a_keyword_task_and_keeps_its_best_checkpoint(tmp_path, capsys,
                                                                       pretrained):
  task, workdir = keyword_task(tmp_path / 'task.tsv'), tmp_path / 'ft'
  assert finetune(workdir, f'--from={pretrained}', f'--task={task}', '--config.train.steps=10',
                  '--config.train.eval_every=5', '--config.train.log_every=5',
                  '--config.checkpoint.every_steps=10', FAST) == 0
  # The workdir alone resumes: its config, the step-10 checkpoint and its data position.
  assert read_position(workdir, 10)['processes'][0]['batch'] == 10
  assert finetune(workdir, '--config.train.steps=20') == 0
  rows = eval_rows(workdir)
  assert [r['step'] for r in rows] == [5, 10, 15, 20]
  held_out = rows[0]['eval_sequences']
  assert 50 < held_out < 110  # 10% of 800 by input hash
  exact = [r['eval_exact_match'] for r in rows]
  # Chance is 0.5 (balanced classes): 0.9 on ~80 held-out examples is 7 standard errors above.
  assert max(exact) >= 0.9, exact
  best = max(rows, key=lambda r: (r['eval_exact_match'], -r['eval_loss']))
  best_dir = workdir / 'best'
  assert os.listdir(best_dir / 'checkpoints') == [str(best['step'])]
  assert '20' in os.listdir(workdir / 'checkpoints')
  # The best checkpoint restores from its own workdir and scores what the run logged.
  capsys.readouterr()
  assert cli.main(['eval', f'--workdir={best_dir}']) == 0
  metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert metrics['step'] == best['step'] and metrics['eval_sequences'] == held_out
  assert metrics['eval_exact_match'] == best['eval_exact_match']
  assert metrics['eval_loss'] == pytest.approx(best['eval_loss'], rel=1e-5)


def test_a_hugging_face_export_of_the_workdir_is_the_same_start(tmp_path, pretrained):
  """--hf=FOLDER starts from the parameters that --from=WORKDIR restores, bit for bit."""
  import jax
  from t5lite.commands import finetune as finetune_lib
  assert cli.main(['export', f'--workdir={pretrained}', f'--out={tmp_path / "hf"}']) == 0
  from_config, from_params = finetune_lib.pretrained_start(str(pretrained), None)
  hf_config, hf_params = finetune_lib.pretrained_start(None, str(tmp_path / 'hf'))
  assert hf_config.model.to_dict() == from_config.model.to_dict()
  restored = jax.tree_util.tree_flatten_with_path(from_params().to_pure_dict())[0]
  imported = jax.tree_util.tree_flatten_with_path(hf_params())[0]
  assert [path for path, _ in restored] == [path for path, _ in imported]
  assert len(restored) > 10
  for (path, a), (_, b) in zip(restored, imported):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


@pytest.mark.parametrize('flags, message', [
    (['--config.model.d_ff=256'], 'fine-tuning keeps the pretrained model, but the overrides '
     'change it (d_ff 128 vs 256); drop those --config.model settings'),
    (['--config.model.dropout=1.5'], 'model.dropout must be in [0, 1), got 1.5'),
    (['--task={tmp}/missing.tsv'], 'data.task: no such file'),
    (['--task={tmp}/columns.tsv'], ":1: no column 'target' in the header (it has input, label)"),
    (['--task={tmp}/empty.tsv'], 'empty.tsv:3: empty input'),
    (['--task='], 'give --task (sentiment or a .tsv/.jsonl file of input and target texts)'),
])
def test_bad_requests_fail_in_one_line_before_touching_the_workdir(tmp_path, capsys, pretrained,
                                                                   flags, message):
  (tmp_path / 'columns.tsv').write_text('input\tlabel\nfine\tyes\n', encoding='utf-8')
  (tmp_path / 'empty.tsv').write_text('input\ttarget\nfine\tyes\n\tno\n', encoding='utf-8')
  flags = [f.format(tmp=tmp_path) for f in flags]
  if not any(f.startswith('--task') for f in flags):
    flags.append('--task=sentiment')
  workdir = tmp_path / 'ft'
  assert finetune(workdir, f'--from={pretrained}', *flags) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0], error
  assert not workdir.exists()


@pytest.mark.parametrize('flags, message', [
    (['--from={tmp}/nowhere'], 'is not a t5lite workdir: no'),
    (['--hf={tmp}/nowhere'], 'nowhere'),
    (['--from={tmp}/nowhere', '--hf={tmp}/nowhere'], 'give one of --from=PRETRAINED_WORKDIR'),
    ([], 'holds no fine-tuning run to resume; start one with --from=PRETRAINED_WORKDIR or'),
])
def test_a_start_that_is_not_there_fails_in_one_line(tmp_path, capsys, flags, message):
  flags = [f.format(tmp=tmp_path) for f in flags]
  assert finetune(tmp_path / 'ft', '--task=sentiment', *flags) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0], error
  assert not (tmp_path / 'ft').exists()


def sequence_sums_reference(predictions, targets, weights, segment_ids):
  """Plain Python: (sequences, exact) over each row's segments."""
  sequences = exact = 0
  for p, t, w, s in zip(predictions, targets, weights, segment_ids):
    for segment in set(s[w > 0]):
      tokens = (s == segment) & (w > 0)
      sequences += 1
      exact += bool((p[tokens] == t[tokens]).all())
  return sequences, exact


def test_sequence_sums_count_packed_segments_and_exact_ones():
  rng = np.random.default_rng(0)
  b, l, v = 16, 12, 5
  segment_ids = np.sort(rng.integers(0, 4, (b, l)), axis=1)[:, ::-1]  # 3 3 2 2 1 0 ..: packed
  weights = (segment_ids > 0).astype(np.int32)
  targets = rng.integers(0, v, (b, l))
  logits = rng.normal(size=(b, l, v)).astype(np.float32)
  predictions = logits.argmax(-1)
  right = rng.random((b, l)) < 0.85  # most tokens right, so that some segments are exact
  targets = np.where(right, predictions, (predictions + 1) % v)
  sums = losses.sequence_sums(logits, targets, weights, segment_ids)
  sequences, exact = sequence_sums_reference(predictions, targets, weights, segment_ids)
  assert 0 < exact < sequences
  assert (float(sums['sequences']), float(sums['exact'])) == (sequences, exact)
  worked = losses.sequence_sums(np.eye(3)[[[0, 1, 2, 1, 0]]] * 9, np.array([[0, 1, 2, 0, 0]]),
                                np.array([[1, 1, 1, 1, 0]]), np.array([[1, 1, 2, 2, 0]]))
  assert (float(worked['sequences']), float(worked['exact'])) == (2, 1)


def test_exact_match_on_packed_rows_is_greedy_decodings_accuracy():
  """The docstring's claim, checked on a random model: a target is exact, teacher-forced in a
  packed row, iff it is what greedy decoding (a plain loop, no cache) outputs for its input."""
  import jax.numpy as jnp
  from flax import nnx
  from t5lite import models
  model = models.build(models.ModelConfig(vocab_size=64, d_model=32, d_ff=64, num_heads=2,
                                          d_kv=16, num_encoder_layers=1, num_decoder_layers=1),
                       nnx.Rngs(0))
  forward = nnx.jit(lambda model, batch: model(batch))
  rng = np.random.default_rng(0)
  n, m, length = 8, 6, 4  # examples, input tokens, target tokens
  inputs = rng.integers(3, 64, (n, m))
  greedy = np.zeros((n, length + 1), np.int32)  # decoder start token 0, then the outputs
  for t in range(length):
    logits = forward(model, {'encoder_input_tokens': jnp.asarray(inputs),
                             'decoder_input_tokens': jnp.asarray(greedy[:, :length])})
    greedy[:, t + 1] = np.asarray(logits[:, t].argmax(-1))
  greedy = greedy[:, 1:]
  targets = greedy.copy()
  changed = np.arange(n) % 2 == 1  # odd examples: one token that greedy decoding did not pick
  where = rng.integers(0, length, n)[changed]
  targets[changed, where] = (targets[changed, where] + 1) % 64
  # Pack examples 2r and 2r+1 into row r, as segments 1 and 2.
  def pack(x):  # (n, l) -> (n/2, 2l)
    return x.reshape(n // 2, 2 * x.shape[1])
  def ids(l):
    return np.repeat([[1] * l + [2] * l], n // 2, axis=0)
  def positions(l):
    return np.tile(np.arange(l), (n // 2, 2))
  decoder_inputs = np.concatenate([np.zeros((n, 1), np.int32), targets[:, :-1]], axis=1)
  batch = {'encoder_input_tokens': pack(inputs), 'encoder_segment_ids': ids(m),
           'encoder_positions': positions(m), 'decoder_input_tokens': pack(decoder_inputs),
           'decoder_segment_ids': ids(length), 'decoder_positions': positions(length)}
  logits = forward(model, {k: jnp.asarray(v) for k, v in batch.items()})
  weights = np.ones((n // 2, 2 * length), np.int32)
  for row in range(n // 2):
    for segment, example in ((1, 2 * row), (2, 2 * row + 1)):
      keep = (ids(length)[row] == segment)[None]
      sums = losses.sequence_sums(logits[row:row + 1], pack(targets)[row:row + 1],
                                  weights[row:row + 1] * keep, ids(length)[row:row + 1])
      assert float(sums['sequences']) == 1
      assert float(sums['exact']) == (not changed[example]), (row, segment)


@pytest.mark.slow  # a fine-tuning process stopped and resumed: 20-30 s on 2 cores
def test_sigterm_saves_and_exits_75_as_train_does(tmp_path, pretrained):
  """A fine-tuning stopped early says so to its launcher: status 75, and its step saved."""
  process = subprocess.Popen(
      [sys.executable, '-m', 't5lite', 'finetune', f'--workdir={tmp_path / "ft"}',
       f'--from={pretrained}', f'--task={keyword_task(tmp_path / "task.tsv")}', FAST,
       '--config.train.steps=100000', '--config.train.eval_every=0',
       '--config.train.log_every=1', '--config.checkpoint.every_steps=100000'],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for line in process.stdout:  # wait until it is really stepping
    if line.startswith('step 2/'):
      break
  process.send_signal(signal.SIGTERM)
  process.stdout.read()
  assert process.wait(timeout=60) == preemption.EXIT_STOPPED_EARLY
  steps = [int(name) for name in os.listdir(tmp_path / 'ft' / 'checkpoints')]
  assert len(steps) == 1 and 2 <= steps[0] < 100000
