"""launch/slurm_prepare.sbatch as the tasks of a job array would run it: one part each, for real,
and together one store, the same as one `t5lite prepare` makes."""

import json
import os
import subprocess
import sys

import pytest

from t5lite.data import store

SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'launch', 'slurm_prepare.sbatch')


def array_task(tmp_path, task: int, first: int, count: int, *flags):
  env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(first + task), SLURM_ARRAY_TASK_MIN=str(first),
             SLURM_ARRAY_TASK_COUNT=str(count), SLURM_CPUS_PER_TASK='1',
             SLURM_SUBMIT_DIR=os.path.dirname(os.path.dirname(SCRIPT)), T5LITE_PYTHON=sys.executable)
  return subprocess.run(['bash', SCRIPT, *flags], env=env, capture_output=True, text=True,
                        timeout=300)


@pytest.mark.slow  # four prepare processes: about 30 s on 2 cores
def test_an_array_of_three_tasks_prepares_the_store_one_run_would(tmp_path):
  text = tmp_path / 'text'
  text.mkdir()
  for i in range(4):
    (text / f'{i}.jsonl').write_text(''.join(
        json.dumps({'text': f'Document {i}.{j} of the array test, ' + 'word ' * (j % 40)}) + '\n'
        for j in range(50)))
  flags = [f'--source={text}/*.jsonl', f'--out={tmp_path / "parts"}']
  for task in (2, 0, 1):  # tasks finish in any order; --array=5-7 numbers them from 5
    done = array_task(tmp_path, task, 5, 3, *flags)
    assert done.returncode == 0, done.stderr
    assert f'prepared part-0000{task}-of-00003' in done.stdout
  single = subprocess.run([sys.executable, '-m', 't5lite', 'prepare', flags[0],
                           f'--out={tmp_path / "one"}'], capture_output=True, text=True)
  assert single.returncode == 0, single.stderr
  for split in store.SPLITS:
    parts, one = store.Store(str(tmp_path / 'parts')).tokens(split), store.Store(
        str(tmp_path / 'one')).tokens(split)
    assert parts.size == one.size > 0
    assert (parts.window(0, parts.size) == one.window(0, one.size)).all()
  outside = subprocess.run(['bash', SCRIPT, *flags], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if not k.startswith('SLURM')})
  assert outside.returncode != 0 and 'submit as a job array' in outside.stderr
