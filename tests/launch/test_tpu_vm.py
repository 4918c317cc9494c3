"""launch/tpu_vm.py: the gcloud commands it prints with --dry_run, and how its watcher reacts.

Nothing here calls gcloud: the commands go through --dry_run or the pure command builders; the
watcher runs against FakeGcloud, which answers from a script, on a clock that never waits; the
remote scripts are run by a local bash with a stand-in `t5lite`.
"""

import argparse
import os
import shlex
import signal
import subprocess
import time

import pytest

from launch import tpu_vm

V4 = ['--name=t5-v4', '--zone=us-central2-b']
V5E = ['--name=t5-v5e', '--zone=us-west4-a']
FLAGS = ['--config=configs/t5_tiny.py', '--workdir=gs://bucket/runs/tiny',
         '--config.train.steps=100']
TPUS = ['gcloud', 'compute', 'tpus']
TRAIN = ("--command=cd t5lite && rm -f $HOME/t5lite-train.exit && nohup bash -c "
         "'$HOME/t5lite-venv/bin/t5lite train --multihost --config=configs/t5_tiny.py "
         "--workdir=gs://bucket/runs/tiny --config.train.steps=100 & "
         "trap \"\" TERM; wait $!; echo $? > $HOME/t5lite-train.exit' > $HOME/t5lite-train.log "
         "2>&1 < /dev/null &")
STATUS = ('--command=cat $HOME/t5lite-train.exit 2>/dev/null || '
          'pgrep -f "$HOME/t5lite-venv/bin/t5lite[ ]train" > /dev/null || echo 75')


def dry_run(capsys, action, *argv):
  """The commands `tpu_vm.py ACTION --dry_run ARGV` prints, each split back into its words."""
  assert tpu_vm.main([action, '--dry_run', *argv]) == 0
  printed = capsys.readouterr()
  return [shlex.split(line) for line in printed.out.splitlines()], printed.err


def test_create_v4_8(capsys):
  assert dry_run(capsys, 'create', *V4, '--accelerator_type=v4-8')[0] == [
      [*TPUS, 'tpu-vm', 'create', 't5-v4', '--zone=us-central2-b', '--accelerator-type=v4-8',
       '--version=tpu-ubuntu2204-base']]


def test_create_v4_8_queued_spot_waits_for_active(capsys):
  assert dry_run(capsys, 'create', *V4, '--accelerator_type=v4-8', '--queued', '--spot',
                 '--project=my-project')[0] == [
      [*TPUS, 'queued-resources', 'create', 't5-v4', '--zone=us-central2-b',
       '--project=my-project', '--node-id=t5-v4', '--accelerator-type=v4-8',
       '--runtime-version=tpu-ubuntu2204-base', '--spot'],
      [*TPUS, 'queued-resources', 'describe', 't5-v4', '--zone=us-central2-b',
       '--project=my-project', '--format=value(state.state)']]


def test_create_v5litepod_32_spot_and_queued(capsys):
  assert dry_run(capsys, 'create', *V5E, '--accelerator_type=v5litepod-32', '--spot')[0] == [
      [*TPUS, 'tpu-vm', 'create', 't5-v5e', '--zone=us-west4-a',
       '--accelerator-type=v5litepod-32', '--version=v2-alpha-tpuv5-lite', '--spot']]
  assert dry_run(capsys, 'create', *V5E, '--accelerator_type=v5litepod-32', '--queued',
                 '--runtime_version=v2-alpha-tpuv5-lite-custom')[0][0] == [
      *TPUS, 'queued-resources', 'create', 't5-v5e', '--zone=us-west4-a', '--node-id=t5-v5e',
      '--accelerator-type=v5litepod-32', '--runtime-version=v2-alpha-tpuv5-lite-custom']


@pytest.mark.parametrize('accelerator, version, workers', [
    ('v2-8', 'tpu-ubuntu2204-base', 1), ('v3-32', 'tpu-ubuntu2204-base', 4),
    ('v4-8', 'tpu-ubuntu2204-base', 1), ('v4-32', 'tpu-ubuntu2204-base', 4),
    ('v5p-8', 'v2-alpha-tpuv5', 1), ('v5p-128', 'v2-alpha-tpuv5', 16),
    ('v5litepod-8', 'v2-alpha-tpuv5-lite', 1), ('v5litepod-32', 'v2-alpha-tpuv5-lite', 8),
    ('v6e-4', 'v2-alpha-tpuv6e', 1), ('v6e-16', 'v2-alpha-tpuv6e', 4),
])
def test_runtime_version_and_workers_per_generation(capsys, accelerator, version, workers):
  create = dry_run(capsys, 'create', *V4, f'--accelerator_type={accelerator}')[0][0]
  assert f'--version={version}' in create
  assert tpu_vm.num_workers(accelerator) == workers


def test_setup_copies_the_checkout_and_installs_the_tpu_extra_on_every_worker(capsys):
  mkdir, scp, install = dry_run(capsys, 'setup', *V4)[0]
  assert mkdir == [*TPUS, 'tpu-vm', 'ssh', 't5-v4', '--zone=us-central2-b', '--worker=all',
                   '--command=mkdir -p t5lite']
  assert scp == [*TPUS, 'tpu-vm', 'scp', '--recurse', 'setup.py', 'README.md', 't5lite',
                 'configs', 't5-v4:t5lite/', '--zone=us-central2-b', '--worker=all']
  assert install[:8] == mkdir[:8]
  script = install[8].removeprefix('--command=').split(' && ')
  assert 'python3.11 -m venv $HOME/t5lite-venv' in script
  assert script[-2:] == ['cd t5lite', '$HOME/t5lite-venv/bin/pip install -q -e ".[tpu]"']
  for source in ('setup.py', 'README.md', 't5lite', 'configs'):
    assert os.path.exists(os.path.join(tpu_vm.REPO, source))


def test_setup_with_a_package_copies_only_the_configs(capsys):
  package = 't5lite[tpu] @ git+https://github.com/org/t5lite'
  _, scp, install = dry_run(capsys, 'setup', *V5E, f'--package={package}')[0]
  assert scp[5:8] == ['--recurse', 'configs', 't5-v5e:t5lite/']
  assert install[-1].endswith(f"/bin/pip install -q '{package}'")


@pytest.mark.parametrize('name, zone, accelerator', [
    ('t5-v4', 'us-central2-b', 'v4-8'), ('t5-v5e', 'us-west4-a', 'v5litepod-32')])
def test_train_runs_the_same_flags_on_all_workers(capsys, name, zone, accelerator):
  (train,), warning = dry_run(capsys, 'train', f'--name={name}', f'--zone={zone}',
                              f'--accelerator_type={accelerator}', '--', *FLAGS)
  assert train == [*TPUS, 'tpu-vm', 'ssh', name, f'--zone={zone}', '--worker=all', TRAIN]
  assert shlex.join(FLAGS) in train[-1]
  assert warning == ''


def test_train_warns_about_a_local_workdir_on_a_multi_worker_slice(capsys):
  local = ['--config=configs/t5_tiny.py', '--workdir', 'runs/tiny']
  assert dry_run(capsys, 'train', *V4, '--accelerator_type=v4-8', '--', *local)[1] == ''
  warning = dry_run(capsys, 'train', *V5E, '--accelerator_type=v5litepod-32', '--', *local)[1]
  assert warning == ('tpu_vm.py: warning: --workdir=runs/tiny is local to each of the 8 workers '
                     'of v5litepod-32; checkpoints need a path they all share: gs://BUCKET/RUN\n')


def test_train_script_runs_t5lite_in_the_background_and_records_its_exit_status(tmp_path):
  """Run the remote script with a local bash: flags arrive intact, log and exit status appear."""
  fake = tmp_path / 't5lite-venv/bin/t5lite'
  fake.parent.mkdir(parents=True)
  fake.write_text('#!/bin/bash\nprintf "%s\\n" "$PWD" "$@" > "$HOME/argv"; echo training; '
                  'exit 3\n')
  fake.chmod(0o755)
  (tmp_path / 't5lite').mkdir()
  flags = [*FLAGS, "--config.data.source=it's a file.txt"]
  subprocess.run(['bash', '-c', tpu_vm.train_script(flags)], cwd=tmp_path, check=True,
                 env=dict(os.environ, HOME=str(tmp_path)), timeout=5)
  for _ in range(100):  # it runs in the background
    if (tmp_path / 't5lite-train.exit').exists():
      break
    time.sleep(0.05)
  assert (tmp_path / 't5lite-train.exit').read_text() == '3\n'
  assert (tmp_path / 'argv').read_text().splitlines() == [
      str(tmp_path / 't5lite'), 'train', '--multihost', *flags]
  assert (tmp_path / 't5lite-train.log').read_text() == 'training\n'


def test_logs_follow_worker_0(capsys):
  assert dry_run(capsys, 'logs', *V5E)[0] == [
      [*TPUS, 'tpu-vm', 'ssh', 't5-v5e', '--zone=us-west4-a', '--worker=0',
       '--command=tail -n 100 -F $HOME/t5lite-train.log']]


def test_delete(capsys):
  assert dry_run(capsys, 'delete', *V4)[0] == [
      [*TPUS, 'tpu-vm', 'delete', 't5-v4', '--zone=us-central2-b', '--quiet']]
  assert dry_run(capsys, 'delete', *V5E, '--queued')[0] == [
      [*TPUS, 'queued-resources', 'delete', 't5-v5e', '--zone=us-west4-a', '--force', '--quiet']]


def test_run_is_create_setup_train_then_the_preemption_watch(capsys):
  commands, _ = dry_run(capsys, 'run', *V5E, '--accelerator_type=v5litepod-32', '--queued',
                        '--spot', '--restart_on_preemption', '--', *FLAGS)
  describe = [*TPUS, 'queued-resources', 'describe', 't5-v5e', '--zone=us-west4-a',
              '--format=value(state.state)']
  assert commands[0][3:5] == ['queued-resources', 'create'] and commands[1] == describe
  assert [c[3:5] for c in commands[2:5]] == [['tpu-vm', 'ssh'], ['tpu-vm', 'scp'],
                                             ['tpu-vm', 'ssh']]
  assert commands[5][-1] == TRAIN
  assert commands[6:] == [describe, [*TPUS, 'tpu-vm', 'ssh', 't5-v5e', '--zone=us-west4-a',
                                     '--worker=0', STATUS]]


@pytest.mark.parametrize('argv, message', [
    (['create', '--zone=us-central2-b', '--accelerator_type=v4-8'], 'required: --name'),
    (['create', '--name=t5', '--accelerator_type=v4-8'], 'required: --zone'),
    (['create', *V4, '--accelerator_type=v5e-32'],
     "unknown accelerator type 'v5e-32': expected GENERATION-SIZE, GENERATION one of v2, v3, v4, "
     'v5p, v5litepod, v6e (TPU v5e is v5litepod), e.g. v4-8 or v5litepod-16'),
    (['create', *V4, '--accelerator_type=tpu-8'], "unknown accelerator type 'tpu-8': expected"),
    (['create', *V4, '--accelerator_type=v2-16'],
     "unknown accelerator type 'v2-16': v2 comes in 8, 32, 128, 256, 512 TensorCores, e.g. v2-32"),
    (['create', *V4, '--accelerator_type=v4-24'],
     "unknown accelerator type 'v4-24': v4 comes in 8, 16, 32, 64, 128, 256, 512, 1024, 1536, "
     '2048, 4096 TensorCores, e.g. v4-16'),
    (['create', *V4, '--accelerator_type=v5p-200'],
     "unknown accelerator type 'v5p-200': v5p comes in 8, 16, 32, 64, 128, 256, 384, ..., 12288 "
     'TensorCores, e.g. v5p-16'),
    (['create', *V4, '--accelerator_type=v6e-12'],
     "unknown accelerator type 'v6e-12': v6e comes in 1, 4, 8, 16, 32, 64, 128, 256 chips, "
     'e.g. v6e-4'),
    (['create', *V4, '--accelerator_type=v4-08'], "unknown accelerator type 'v4-08': v4 comes"),
    (['create', '--name=My_TPU', '--zone=us-central2-b', '--accelerator_type=v4-8'],
     "'My_TPU' is not a valid TPU name"),
    (['create', '--name=t5', '--zone=central', '--accelerator_type=v4-8'],
     "'central' is not a valid zone"),
    (['create', *V4, '--accelerator_type=v4-8', '--spot', '--preemptible'], 'not allowed with'),
    (['create', *V4, '--accelerator_type=v4-8', '--queued', '--preemptible'],
     'queued resources take --spot, not --preemptible'),
    (['train', *V4, '--accelerator_type=v4-8'], 'give the t5lite train flags after --'),
    (['train', *V4, '--accelerator_type=v4-8', '--', '--config=configs/t5_tiny.py'],
     'with --workdir'),
    (['train', *V4, '--accelerator_type=v4-8', '--workdir=gs://b/r'], 'unrecognized arguments'),
    (['run', *V4, '--accelerator_type=v4-8', '--keep_slice', '--', *FLAGS],
     '--keep_slice goes with --restart_on_preemption'),
    (['deploy', *V4], "invalid choice: 'deploy'"),
    (['create', *V4, '--accelerator_type=v4-8', '--num_slices=2'],
     '--num_slices above 1 needs --queued'),
    (['create', *V4, '--accelerator_type=v4-8', '--num_slices=0', '--queued'],
     '--num_slices=0 must be at least 1'),
])
def test_bad_inputs_fail_with_one_error_line(capsys, argv, message):
  with pytest.raises(SystemExit) as exit_:
    tpu_vm.main([*argv, '--dry_run'])
  assert exit_.value.code == 2
  printed = capsys.readouterr()
  assert printed.out == ''
  errors = [line for line in printed.err.splitlines() if 'error:' in line]
  assert len(errors) == 1 and message in errors[0]


@pytest.mark.parametrize('accelerator', [
    'v2-8', 'v2-512', 'v3-64', 'v3-2048', 'v4-16', 'v4-1536', 'v4-4096', 'v5p-32', 'v5p-384',
    'v5p-12288', 'v5litepod-1', 'v5litepod-256', 'v6e-4', 'v6e-256'])
def test_accelerator_types_cloud_tpu_offers(accelerator):
  assert tpu_vm.accelerator_type(accelerator) == accelerator


def test_the_stopped_early_status_is_t5lites():
  from t5lite.train import preemption
  assert tpu_vm.EXIT_STOPPED_EARLY == preemption.EXIT_STOPPED_EARLY


def command_kind(command: list[str]) -> str:
  """create, delete, state, setup (mkdir, scp, install), train, status or unlock."""
  if command[1] == 'storage':
    return 'unlock' if command[2] == 'rm' and command[-1].endswith('/t5lite.lock') else '?'
  action = command[4]
  if action == 'ssh':
    script = command[-1].removeprefix('--command=')
    return 'status' if script.startswith('cat ') else 'train' if ' train ' in script else 'setup'
  return {'describe': 'state', 'scp': 'setup'}.get(action, action)


class FakeGcloud:
  """Stands in for tpu_vm's `subprocess`: answers gcloud from a script, records what it was asked.

  `states` answers the successive describes, `statuses` the successive reads of the exit status
  ('' while training runs); the last answer repeats. `fail={'create': 2}`: the 2nd create fails.
  """
  CalledProcessError = subprocess.CalledProcessError

  def __init__(self, states, statuses, fail=None):
    self.answers = {'state': list(states), 'status': list(statuses)}
    self.fail = fail or {}
    self.calls = []

  def run(self, command, check=False, **kwargs):
    del kwargs
    kind = command_kind(command)
    self.calls.append(kind)
    if check and self.fail.get(kind) == self.calls.count(kind):
      raise subprocess.CalledProcessError(1, command)
    answers = self.answers.get(kind, [''])
    answer = answers.pop(0) if len(answers) > 1 else answers[0]
    if answer == 'NOT_FOUND':
      return subprocess.CompletedProcess(command, 1, '', 'ERROR: (gcloud) NOT_FOUND')
    return subprocess.CompletedProcess(command, 0, answer + '\n', '')


class FakeClock:
  """tpu_vm's `time`: sleeping only moves the clock."""

  def __init__(self):
    self.now = 0.0

  def monotonic(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


LAUNCH = ['create', 'setup', 'setup', 'setup', 'train']
GRACE = ['state'] * 5  # PREEMPTION_GRACE_SECONDS at one describe a minute


def watch(monkeypatch, states, statuses, *flags, fail=None):
  """(exit status, gcloud calls) of `run --restart_on_preemption` with a v4-32 slice."""
  gcloud = FakeGcloud(states, statuses, fail)
  monkeypatch.setattr(tpu_vm, 'subprocess', gcloud)
  monkeypatch.setattr(tpu_vm, 'time', FakeClock())
  status = tpu_vm.main(['run', *V4, '--accelerator_type=v4-32', '--restart_on_preemption',
                        '--poll_seconds=60', *flags, '--', *FLAGS])
  return status, gcloud.calls


def test_watch_deletes_the_slice_once_training_has_finished(monkeypatch, capsys):
  status, calls = watch(monkeypatch, ['READY', 'REPAIRING', 'READY'], ['', '0'])
  assert status == 0
  assert calls == [*LAUNCH, 'state', 'status', 'state', 'state', 'status', 'delete']
  assert 'tpu_vm.py: t5lite train exited with status 0' in capsys.readouterr().err


def test_watch_keeps_the_slice_with_keep_slice(monkeypatch, capsys):
  status, calls = watch(monkeypatch, ['READY'], ['0'], '--keep_slice')
  assert (status, calls) == (0, [*LAUNCH, 'state', 'status'])
  assert ('tpu_vm.py: t5-v4 is kept; delete it with: gcloud compute tpus tpu-vm delete t5-v4 '
          '--zone=us-central2-b --quiet') in capsys.readouterr().err


def test_watch_recreates_a_preempted_slice_and_resumes(monkeypatch):
  status, calls = watch(monkeypatch, ['READY', 'PREEMPTED', 'READY'], ['', '0'])
  assert status == 0
  assert calls == [*LAUNCH, 'state', 'status', 'state', 'delete', 'unlock', *LAUNCH, 'state',
                   'status',
                   'delete']


@pytest.mark.parametrize('exit_status', ['75', '1', '134'])
def test_an_exit_followed_by_preemption_within_the_grace_period_recreates(monkeypatch,
                                                                         exit_status):
  """The processes saved and stopped (75), or lost a peer (1, 134), before the state said so."""
  status, calls = watch(monkeypatch, ['READY', 'READY', 'READY', 'PREEMPTED', 'READY'],
                        [exit_status, '0'])
  assert status == 0
  assert calls == [*LAUNCH, 'state', 'status', 'state', 'state', 'state', 'delete', 'unlock',
                   *LAUNCH,
                   'state', 'status', 'delete']


def test_stopped_early_on_a_slice_that_stays_healthy_trains_again_on_it(monkeypatch):
  status, calls = watch(monkeypatch, ['READY'], ['75', '', '0'])
  assert status == 0
  assert calls == [*LAUNCH, 'state', 'status', *GRACE, 'train', 'state', 'status', 'state',
                   'status', 'delete']


def test_training_that_does_not_start_again_recreates_the_slice(monkeypatch):
  status, calls = watch(monkeypatch, ['READY'], ['75', '0'], fail={'train': 2})
  assert status == 0
  assert calls == [*LAUNCH, 'state', 'status', *GRACE, 'train', 'state', 'delete', 'unlock',
                   *LAUNCH,
                   'state', 'status', 'delete']


@pytest.mark.parametrize('exit_status', [1, 2, 134])
def test_a_failure_on_a_slice_that_stays_healthy_is_returned_and_the_slice_kept(
    monkeypatch, capsys, exit_status):
  status, calls = watch(monkeypatch, ['READY'], [str(exit_status)])
  assert (status, calls) == (exit_status, [*LAUNCH, 'state', 'status', *GRACE])
  assert 'tpu_vm.py: t5-v4 is kept for its log (`logs`); delete it with:' in (
      capsys.readouterr().err)


def test_recreating_tries_again_until_it_works(monkeypatch):
  status, calls = watch(monkeypatch, ['READY', 'NOT_FOUND', 'NOT_FOUND', 'READY'], ['', '0'],
                        fail={'create': 2})
  assert status == 0
  assert calls == [*LAUNCH, 'state', 'status', 'state', 'unlock', 'create', 'state', 'unlock',
                   *LAUNCH, 'state', 'status', 'delete']


def test_a_suspended_queued_resource_is_queued_again(monkeypatch):
  gcloud = FakeGcloud(['ACTIVE', 'SUSPENDED', 'WAITING_FOR_RESOURCES', 'ACTIVE'], ['', '0'])
  monkeypatch.setattr(tpu_vm, 'subprocess', gcloud)
  monkeypatch.setattr(tpu_vm, 'time', FakeClock())
  assert tpu_vm.main(['run', *V5E, '--accelerator_type=v5litepod-32', '--queued', '--spot',
                      '--restart_on_preemption', '--', *FLAGS]) == 0
  queued = ['create', 'state', *LAUNCH[1:]]  # create, wait for ACTIVE, setup, train
  assert gcloud.calls == [*queued, 'state', 'delete', 'unlock', 'create', 'state', 'state',
                          *LAUNCH[1:],
                          'state', 'status', 'state', 'status', 'delete']


def test_a_recreated_slice_removes_the_lost_runs_lock_of_a_gs_workdir():
  args = tpu_vm.parse_args(['run', *V4, '--accelerator_type=v4-8', '--project=p', '--',
                            *FLAGS])
  assert tpu_vm.unlock_command(args) == [
      'gcloud', 'storage', 'rm', '--project=p', 'gs://bucket/runs/tiny/t5lite.lock']
  local = tpu_vm.parse_args(['run', *V4, '--accelerator_type=v4-8', '--',
                             '--workdir=/mnt/runs/tiny'])
  assert tpu_vm.unlock_command(local) is None


def remote(script: str, home) -> str:
  """What `script` prints when a worker runs it, here, with HOME=home."""
  return subprocess.run(['bash', '-c', script], env=dict(os.environ, HOME=str(home)), text=True,
                        capture_output=True, check=True, timeout=5).stdout.strip()


def wait_for(condition, what: str):
  for _ in range(200):
    if condition():
      return
    time.sleep(0.05)
  raise AssertionError(f'timed out waiting for {what}')


def test_a_shutdown_sigterm_records_75_and_the_status_tells_running_stopped_and_gone(tmp_path):
  """A VM shutting down sends SIGTERM to every process: the shell around t5lite must outlive it."""
  fake = tmp_path / 't5lite-venv/bin/t5lite'
  fake.parent.mkdir(parents=True)
  fake.write_text('#!/bin/bash\ntrap "echo saved; exit 75" TERM\necho training\n'
                  'while true; do sleep 0.05; done\n')
  fake.chmod(0o755)
  (tmp_path / 't5lite').mkdir()
  status = tpu_vm.exit_status_command(argparse.Namespace(name='t5', zone='z', project=None,
                                                         num_slices=1))
  status = status[-1].removeprefix('--command=')
  assert remote(status, tmp_path) == '75'  # gone without a status: stopped early
  training = subprocess.Popen(['bash', '-c', tpu_vm.train_script(FLAGS)], cwd=tmp_path,
                              env=dict(os.environ, HOME=str(tmp_path)), start_new_session=True)
  training.wait(timeout=5)
  log = tmp_path / 't5lite-train.log'
  wait_for(lambda: log.exists() and 'training' in log.read_text(), 't5lite to start')
  assert remote(status, tmp_path) == ''  # running
  os.killpg(training.pid, signal.SIGTERM)
  wait_for((tmp_path / 't5lite-train.exit').exists, 'the exit status')
  assert remote(status, tmp_path) == '75'
  assert log.read_text().endswith('saved\n')  # t5lite saved before it exited


SLICES = [*V5E, '--num_slices=2']


def test_two_slices_are_one_queued_resource_of_two_nodes(capsys):
  create, describe = dry_run(capsys, 'create', *SLICES, '--accelerator_type=v5litepod-256',
                             '--queued', '--spot')[0]
  assert create == [*TPUS, 'queued-resources', 'create', 't5-v5e', '--zone=us-west4-a',
                    '--node-count=2', '--node-prefix=t5-v5e', '--accelerator-type=v5litepod-256',
                    '--runtime-version=v2-alpha-tpuv5-lite', '--spot']
  assert describe[3:6] == ['queued-resources', 'describe', 't5-v5e']
  assert dry_run(capsys, 'delete', *SLICES, '--queued')[0] == [
      [*TPUS, 'queued-resources', 'delete', 't5-v5e', '--zone=us-west4-a', '--force', '--quiet']]


def test_every_slice_is_set_up_and_trains(capsys):
  setup = dry_run(capsys, 'setup', *SLICES)[0]
  assert [(c[4], c[5]) for c in setup] == [
      ('ssh', 't5-v5e-0'), ('scp', '--recurse'), ('ssh', 't5-v5e-0'),
      ('ssh', 't5-v5e-1'), ('scp', '--recurse'), ('ssh', 't5-v5e-1')]
  assert [c[-3] for c in setup if c[4] == 'scp'] == ['t5-v5e-0:t5lite/', 't5-v5e-1:t5lite/']
  (train0, train1), warning = dry_run(capsys, 'train', *SLICES,
                                      '--accelerator_type=v5litepod-256', '--', *FLAGS)
  assert train0 == [*TPUS, 'tpu-vm', 'ssh', 't5-v5e-0', '--zone=us-west4-a', '--worker=all', TRAIN]
  assert train1 == [*TPUS, 'tpu-vm', 'ssh', 't5-v5e-1', '--zone=us-west4-a', '--worker=all', TRAIN]
  assert warning == ''
  local = dry_run(capsys, 'train', *SLICES, '--accelerator_type=v5litepod-256', '--',
                  '--workdir=runs/x')[1]
  assert 'local to each of the 128 workers of 2 x v5litepod-256' in local


def test_logs_and_the_exit_status_come_from_slice_0_worker_0(capsys):
  assert dry_run(capsys, 'logs', *SLICES)[0] == [
      [*TPUS, 'tpu-vm', 'ssh', 't5-v5e-0', '--zone=us-west4-a', '--worker=0',
       '--command=tail -n 100 -F $HOME/t5lite-train.log']]
  commands, _ = dry_run(capsys, 'run', *SLICES, '--accelerator_type=v5litepod-16', '--queued',
                        '--restart_on_preemption', '--', *FLAGS)
  assert commands[-1] == [*TPUS, 'tpu-vm', 'ssh', 't5-v5e-0', '--zone=us-west4-a',
                          '--worker=0', STATUS]


def test_a_preempted_slice_stops_both_and_the_whole_resource_is_recreated(monkeypatch):
  """One slice preempted: JAX's sync point stops every process at one step (75 on slice 0), the
  queued resource turns SUSPENDED, and the watcher deletes it, creates both slices again, sets
  up and starts both, then finishes."""
  gcloud = FakeGcloud(['ACTIVE', 'ACTIVE', 'SUSPENDED', 'ACTIVE'], ['75', '0'])
  monkeypatch.setattr(tpu_vm, 'subprocess', gcloud)
  monkeypatch.setattr(tpu_vm, 'time', FakeClock())
  status = tpu_vm.main(['run', *SLICES, '--accelerator_type=v5litepod-16', '--queued',
                        '--restart_on_preemption', '--', *FLAGS])
  launch = ['create', 'state', *['setup'] * 6, 'train', 'train']
  assert status == 0
  assert gcloud.calls == [*launch, 'state', 'status', 'state', 'delete', 'unlock', *launch,
                          'state', 'status', 'delete']
