"""ByT5 end to end with no SentencePiece file anywhere: `prepare --vocabulary=bytes`, `train` of a
shrunk byt5_small on the byte store, `eval`, `infer` with a sentinel and `export`, whose folder
transformers reads with ByT5Tokenizer; `tokenizer --model_type=bytes` explains that there is
nothing to train."""

import json
import os

import pytest

from t5lite import cli
from t5lite.data import vocabulary
from tests.fs import changes, snapshot
from tests.test_cli_mistakes import CONFIGS, in_this_process

BYT5_TINY = [f'--config={CONFIGS}/byt5_small.py', '--config.model.d_model=64',
             '--config.model.d_ff=128', '--config.model.num_heads=2', '--config.model.d_kv=32',
             '--config.model.num_encoder_layers=3', '--config.model.num_decoder_layers=1',
             '--config.data.batch_size=8', '--config.data.inputs_length=64',
             '--config.data.targets_length=13', '--config.train.steps=2',
             '--config.train.log_every=1', '--config.train.eval_every=0',
             '--config.checkpoint.async_save=false']
TEXT = ('Der Wal tauchte auf. Кит всплыл у берега. व्हेल ऊपर आई। 鲸鱼浮出水面。 '
        'The whale surfaced near the ship. ') * 40


@pytest.fixture(scope='module')
def byte_run(tmp_path_factory):
  base = tmp_path_factory.mktemp('byt5')
  (base / 'corpus.txt').write_text('\n\n'.join(TEXT[i:] for i in range(0, 400, 7)),
                                   encoding='utf-8')
  assert cli.main(['prepare', f'--source={base / "corpus.txt"}', f'--out={base / "store"}',
                   '--vocabulary=bytes']) == 0
  assert cli.main(['train', f'--workdir={base / "run"}', *BYT5_TINY,
                   f'--config.data.source={base / "store"}']) == 0
  return base


@pytest.mark.slow  # prepare, 2 steps of a 3+1-layer model, eval, infer, export: 64 s on 2 cores
def test_a_byte_run_trains_evaluates_infers_and_exports(byte_run, tmp_path, capsys):
  run = byte_run / 'run'
  config = json.loads((run / 'config.json').read_text())
  assert (config['data']['vocabulary'], config['model']['vocab_size']) == ('bytes', 384)
  assert json.loads((run / vocabulary.RECORD_FILE).read_text()) == (
      vocabulary.load_vocabulary('bytes').identity('bytes'))
  capsys.readouterr()
  assert cli.main(['eval', f'--workdir={run}']) == 0
  assert '"eval_loss"' in capsys.readouterr().out
  assert cli.main(['infer', f'--workdir={run}', '--input=Кит <extra_id_0> берега.',
                   '--max_decode_length=8']) == 0
  assert capsys.readouterr().out.strip()  # decoded bytes, whatever two steps taught
  assert cli.main(['export', f'--workdir={run}', f'--out={tmp_path / "hf"}']) == 0
  assert sorted(os.listdir(tmp_path / 'hf')) == ['config.json', 'model.safetensors',
                                                 'tokenizer_config.json']
  transformers = pytest.importorskip('transformers')
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  assert type(tokenizer).__name__ == 'ByT5Tokenizer'
  every_file = [name for _, _, names in os.walk(byte_run) for name in names]
  assert not [name for name in every_file if name.endswith('.model')]


def test_tokenizer_explains_that_bytes_need_no_training(tmp_path, capfd):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text(TEXT, encoding='utf-8')
  before = snapshot(tmp_path)
  for extra, named in (([], ''), (['--vocab_size=300', '--alpha=0.3'],
                                  '--vocab_size, --alpha set a SentencePiece model; ')):
    status, err = in_this_process(['tokenizer', f'--input={corpus}', f'--out={tmp_path / "x"}',
                                   '--model_type=bytes', *extra], capfd)
    assert status == 2 and err == (
        "t5lite tokenizer: error: --model_type=bytes is ByT5's byte vocabulary, which is not "
        f'trained and has no file: {named}give --config.data.vocabulary=bytes (t5lite prepare '
        '--vocabulary=bytes)\n')
  assert snapshot(tmp_path) == before, changes(before, snapshot(tmp_path))
