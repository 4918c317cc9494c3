"""bench/corpus_store.py end to end at a tiny size: every line, its sides measured alike."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # a dozen child processes: about 2 minutes on 2 cores
def test_the_bench_reports_every_ratio_from_a_corpus_it_writes_and_removes(tmp_path):
  env = dict(os.environ, TMPDIR=str(tmp_path))
  done = subprocess.run([sys.executable, 'bench/corpus_store.py', '--gigabytes=0.004',
                         '--repeats=1', '--read_batches=1'], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = {row['bench']: row for row in map(json.loads, done.stdout.splitlines())}
  assert sorted(rows) == ['corpus_store/prepare', 'corpus_store/reads', 'corpus_store/start']
  prepared = rows['corpus_store/prepare']
  assert 4e6 <= prepared['text_bytes'] < 5e6 and prepared['tokens'] > prepared['text_bytes'] / 8
  assert 0 < prepared['ratio_with_start_up'] < prepared['ratio'] < 2  # start-up costs the command
  reads = rows['corpus_store/reads']
  assert set(reads['examples_per_cpu_s']) == {'bundled_store', 'bundled_in_memory', 'big_store'}
  assert all(rate > 0 for rate in reads['examples_per_cpu_s'].values())
  assert set(reads['windows_per_cpu_s']) == {'big_store'} and reads['windows_per_cpu_s'][
      'big_store'] > 1000  # 200 calls of 512 windows
  start = rows['corpus_store/start']
  assert start['store_bytes']['small'] > 0.9 * 2 * 10e6 / 5  # 10 MB of text: 2 bytes a token
  assert all(peak > 100 for peak in start['peak_rss_mib'].values())
  assert os.listdir(tmp_path) == []  # the corpus and the stores are gone
