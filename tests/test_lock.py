"""One run per workdir: real processes hold, lose (SIGKILL) and race for the lock."""

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from t5lite import cli
from t5lite import lock as lock_lib
from tests.fs import acting_as, snapshot
from tests.train.test_loop import SMALL

HOST = socket.gethostname()
SINCE = r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC'

# Takes the lock of argv[1], says so, and holds it until its stdin closes or it is killed.
HOLD = """
import sys
from t5lite import lock
with lock.Lock(sys.argv[1], 't5lite train'):
  print('locked', flush=True)
  sys.stdin.read()
"""

# Waits for time argv[2] (spinning through its last 50 ms, to start together), then tries to
# take the lock of argv[1]; the winner holds it until its stdin closes.
RACE = """
import sys, time
from t5lite import lock
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time() - 0.05))
while time.time() < start:
  pass
try:
  held = lock.Lock(sys.argv[1], 't5lite train').acquire()
except ValueError as error:
  print('refused', error, flush=True)
else:
  print('won', flush=True)
  sys.stdin.read()
  held.release()
"""


def python(code: str, *args: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-c', code, *args], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def holder(workdir):
  """A live process holding the lock of `workdir`; killed at the end whatever happened."""
  process = python(HOLD, str(workdir))
  try:
    assert process.stdout.readline() == 'locked\n', process.stderr.read()
    yield process
  finally:
    process.kill()
    process.wait()


def dead_pid() -> int:
  """The pid of a process that has exited and been reaped."""
  process = subprocess.Popen([sys.executable, '-c', ''])
  process.wait()
  return process.pid


def write_lock(workdir, **fields) -> dict:
  """A lock file as another run would have left it: by default a dead process on this host."""
  record = {'token': uuid.uuid4().hex, 'host': HOST, 'start_ticks': 1,
            'since': '2026-11-24 01:02:03 UTC', 'command': 't5lite train', 'argv': ['t5lite'],
            'heartbeat': time.time(), **fields}
  record.setdefault('pid', dead_pid())
  (workdir / lock_lib.LOCK_NAME).write_text(json.dumps(record))
  return record


def read_lock(workdir) -> dict:
  return json.loads((workdir / lock_lib.LOCK_NAME).read_text())


def assert_taken_over(workdir, capsys, record: dict, why: str) -> None:
  """The lock `record` left is taken over with one line on stderr, and removed on release."""
  with lock_lib.Lock(str(workdir), 't5lite train') as held:
    assert read_lock(workdir)['token'] == held.token
  assert capsys.readouterr().err == (
      f'taking over the lock of {workdir} left by pid {record["pid"]} on host {record["host"]} '
      f'since {record["since"]} ({why})\n')
  assert os.listdir(workdir) == []


def test_a_second_run_is_refused_in_one_line_naming_the_holder(tmp_path):
  workdir = tmp_path / 'run'
  with holder(workdir) as process:
    before = read_lock(workdir)
    with pytest.raises(ValueError) as error:
      lock_lib.Lock(str(workdir), 't5lite finetune').acquire()
    assert re.fullmatch(f'{re.escape(str(workdir))} is in use by t5lite train on host '
                        f'{re.escape(HOST)}, pid {process.pid}, since {SINCE}; '
                        'wait for it or stop it', str(error.value))
    assert read_lock(workdir) == before  # the refused run changed nothing
    assert before['pid'] == process.pid and before['host'] == HOST


@pytest.mark.parametrize('reaped', [True, False], ids=['reaped', 'zombie'])
def test_a_lock_left_by_a_sigkilled_run_is_taken_over(tmp_path, capsys, reaped):
  """SIGKILL runs no cleanup: the file stays, naming a pid that is gone, or a zombie whose
  parent has not collected it yet."""
  workdir = tmp_path / 'run'
  process = python(HOLD, str(workdir))
  try:
    assert process.stdout.readline() == 'locked\n', process.stderr.read()
    record = read_lock(workdir)
    os.kill(process.pid, signal.SIGKILL)
    if reaped:
      process.wait()
    else:
      while lock_lib.process_state(process.pid)[0] != 'Z':
        time.sleep(0.01)
    assert read_lock(workdir) == record
    assert_taken_over(workdir, capsys, record, 'no longer running')
  finally:
    process.kill()
    process.wait()


def test_a_reused_pid_is_not_the_holder(tmp_path, capsys):
  """The pid runs, but started at another time than the holder: another process."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  with holder(tmp_path / 'other') as process:
    ticks = lock_lib.process_state(process.pid)[1]
    record = write_lock(workdir, pid=process.pid, start_ticks=ticks)
    with pytest.raises(ValueError, match=f'in use by t5lite train on host .*, pid {process.pid},'):
      lock_lib.Lock(str(workdir), 't5lite train').acquire()
    assert read_lock(workdir) == record
    record = write_lock(workdir, pid=process.pid, start_ticks=ticks + 1)
    assert_taken_over(workdir, capsys, record, 'no longer running')


def test_a_lock_from_another_host_is_stale_when_its_heartbeat_is(tmp_path, capsys):
  """Another host's processes cannot be seen: only a heartbeat older than stale_seconds counts."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  write_lock(workdir, host='elsewhere', pid=os.getpid(), heartbeat=time.time() - 10)
  with pytest.raises(ValueError) as error:
    lock_lib.Lock(str(workdir), 't5lite train').acquire()
  assert re.fullmatch(f'{re.escape(str(workdir))} is in use by t5lite train on host elsewhere, '
                      rf'pid {os.getpid()}, since {SINCE} '
                      r'\(last heartbeat 1\d s ago, stale after 300 s\); '
                      'wait for it or stop it', str(error.value))
  record = write_lock(workdir, host='elsewhere', pid=os.getpid(), heartbeat=time.time() - 400)
  assert_taken_over(workdir, capsys, record, 'no heartbeat for 400 s')


@pytest.mark.parametrize('round_', range(3))
def test_of_runs_racing_for_a_stale_lock_exactly_one_wins(tmp_path, round_):
  """Four processes find the same stale lock at the same moment: one takes it over, the others
  are refused by the winner's live lock, and no takeover marker is left."""
  del round_  # each round races afresh: how the processes interleave differs from run to run
  workdir = tmp_path / 'run'
  workdir.mkdir()
  stale = write_lock(workdir)
  start = f'{time.time() + 1:.3f}'
  racers = [python(RACE, str(workdir), start) for _ in range(4)]
  try:
    lines = [racer.stdout.readline() for racer in racers]
    winners = [racer for racer, line in zip(racers, lines) if line == 'won\n']
    assert len(winners) == 1, lines
    winner = read_lock(workdir)
    assert winner['pid'] == winners[0].pid
    refused = f'refused {workdir} is in use by t5lite train on host {HOST}, pid {winner["pid"]},'
    assert all(line.startswith(refused) for line in lines if line != 'won\n'), lines
    assert os.listdir(workdir) == [lock_lib.LOCK_NAME]
    errors = [racer.communicate()[1] for racer in racers]  # closes stdin: the winner releases
  finally:
    for racer in racers:
      racer.kill()
      racer.wait()
  assert [e for e in errors if e] == [
      f'taking over the lock of {workdir} left by pid {stale["pid"]} on host {HOST} since '
      f'{stale["since"]} (no longer running)\n'], errors
  assert os.listdir(workdir) == []


def test_a_run_that_found_the_lock_stale_too_late_does_not_take_it(tmp_path):
  """The interleavings a race may or may not hit, forced: B judged the same lock stale as A but
  comes second; a takeover marker is held by a live run, or was left by a killed one."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  stale = write_lock(workdir)
  first, second = (lock_lib.Lock(str(workdir), 't5lite train') for _ in range(2))
  with first:
    assert not second._take_over(stale)  # pylint: disable=protected-access
    assert read_lock(workdir)['token'] == first.token
  stale = write_lock(workdir)
  marker = workdir / f'{lock_lib.LOCK_NAME}.takeover-{stale["token"]}'
  marker.write_text(json.dumps(first._record()))  # pylint: disable=protected-access
  assert not second._take_over(stale)  # pylint: disable=protected-access
  assert read_lock(workdir) == stale and marker.exists()
  marker.write_text(json.dumps(dict(stale, pid=dead_pid())))
  assert not second._take_over(stale)  # pylint: disable=protected-access
  assert not marker.exists()
  assert second._take_over(stale)  # pylint: disable=protected-access
  assert read_lock(workdir)['token'] == second.token and not marker.exists()


def test_release_removes_only_our_own_lock(tmp_path, capsys):
  """Ours is removed; one another run took over (ours looked dead) stays, and the heartbeat,
  which kept ours fresh, stops and says so."""
  workdir = tmp_path / 'run'
  with lock_lib.Lock(str(workdir), 't5lite train'):
    assert os.listdir(workdir) == [lock_lib.LOCK_NAME]
  assert os.listdir(workdir) == []

  held = lock_lib.Lock(str(workdir), 't5lite train', heartbeat_seconds=0.05).acquire()
  first = read_lock(workdir)['heartbeat']
  deadline = time.time() + 10
  while read_lock(workdir)['heartbeat'] == first and time.time() < deadline:
    time.sleep(0.05)
  assert read_lock(workdir)['heartbeat'] > first
  other = write_lock(workdir, host='elsewhere', pid=7)
  while held._heartbeat.is_alive() and time.time() < deadline:  # pylint: disable=protected-access
    time.sleep(0.05)
  held.release()
  assert read_lock(workdir) == other
  assert capsys.readouterr().err == (
      f'warning: lost the lock of {workdir}: pid 7 on host elsewhere took it over\n')


def test_only_process_0_takes_the_lock(tmp_path):
  workdir = tmp_path / 'run'
  with lock_lib.Lock(str(workdir), 't5lite train', enabled=False):
    assert not workdir.exists()
  with holder(workdir) as process:
    record = read_lock(workdir)
    assert record['pid'] == process.pid
    with lock_lib.Lock(str(workdir), 't5lite train', enabled=False) as disabled:
      assert read_lock(workdir) == record
      assert disabled._heartbeat is None  # pylint: disable=protected-access
    assert read_lock(workdir) == record  # its release left the holder's lock as it was
    assert os.listdir(workdir) == [lock_lib.LOCK_NAME]


def test_an_unwritable_workdir_is_refused_in_one_line(tmp_path):
  """Under a regular file; and read-only (0o500), as `nobody` when root ignores file modes."""
  (tmp_path / 'file').write_text('')
  with pytest.raises(ValueError, match=r'^cannot write to workdir .*/file/run: Not a directory$'):
    lock_lib.Lock(str(tmp_path / 'file' / 'run'), 't5lite train').acquire()

  base = tempfile.mkdtemp()  # not under tmp_path, which `nobody` cannot enter
  nobody = pwd.getpwnam('nobody') if os.geteuid() == 0 else None
  try:
    os.chmod(base, 0o755)
    workdir = os.path.join(base, 'read_only')
    os.mkdir(workdir, 0o500)
    with acting_as(nobody), pytest.raises(ValueError) as error:
      lock_lib.Lock(workdir, 't5lite train').acquire()
    assert str(error.value) == f'cannot write to workdir {workdir}: Permission denied'
    assert os.listdir(workdir) == []
  finally:
    shutil.rmtree(base)



def test_a_second_train_on_a_locked_workdir_is_refused_before_it_writes(tmp_path, capfd):
  """Through the real command: one line naming the live holder, exit 2, the workdir untouched."""
  workdir = tmp_path / 'run'
  with holder(workdir) as process:
    before = snapshot(workdir)
    capfd.readouterr()
    assert cli.main(['train', f'--workdir={workdir}', *SMALL, '--config.train.steps=1']) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert snapshot(workdir) == before and sorted(before) == ['t5lite.lock']
  assert len(lines) == 1, lines
  assert re.fullmatch(rf't5lite train: error: {workdir} is in use by t5lite train on host '
                      rf'{re.escape(HOST)}, pid {process.pid}, since {SINCE}; wait for it or '
                      r'stop it', lines[0]), lines[0]
