"""bench/byte_prepare.py end to end at a tiny size: both prepares measured, the corpus removed."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_bench_prepares_bytes_and_sentencepiece_tokens_of_one_corpus(tmp_path):
  env = dict(os.environ, TMPDIR=str(tmp_path))
  done = subprocess.run([sys.executable, 'bench/byte_prepare.py', '--gigabytes=0.002',
                         '--repeats=1'], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  (row,) = map(json.loads, done.stdout.splitlines())
  assert row['bench'] == 'byte_prepare' and 2e6 <= row['text_bytes'] < 3e6
  # a byte a token (the JSON's escapes and keys aside), about 4 bytes a SentencePiece token
  assert 0.8 * row['text_bytes'] < row['tokens']['bytes'] < row['text_bytes']
  assert row['tokens']['bytes'] > 3 * row['tokens']['sentencepiece']
  assert all(seconds > 0 for seconds in row['prepare_s'].values())
  assert row['ratio'] == pytest.approx(
      row['prepare_s']['sentencepiece'] / row['prepare_s']['bytes'], rel=0.02)
  assert os.listdir(tmp_path) == []
