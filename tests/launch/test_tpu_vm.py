"""The gcloud commands launch/tpu_vm.py prints with --dry_run, for a v4-8 and a v5litepod-32 slice.

Nothing here calls gcloud: every test goes through --dry_run or the pure command builders, and the
remote training script is run by a local bash with a stand-in `t5lite`.
"""

import os
import shlex
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
         "--workdir=gs://bucket/runs/tiny --config.train.steps=100; "
         "echo $? > $HOME/t5lite-train.exit' > $HOME/t5lite-train.log 2>&1 < /dev/null &")


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
  assert (tmp_path / 'argv').read_text().splitlines() == [str(tmp_path / 't5lite'), 'train', '--multihost',
                                                          *flags]
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
                                     '--worker=0', '--command=cat $HOME/t5lite-train.exit '
                                     '2>/dev/null || true']]


@pytest.mark.parametrize('argv, message', [
    (['create', '--zone=us-central2-b', '--accelerator_type=v4-8'], 'required: --name'),
    (['create', '--name=t5', '--accelerator_type=v4-8'], 'required: --zone'),
    (['create', *V4, '--accelerator_type=v5e-32'], "unknown accelerator type 'v5e-32'"),
    (['create', *V4, '--accelerator_type=v4-12'], "unknown accelerator type 'v4-12'"),
    (['create', *V4, '--accelerator_type=v6e-12'], "unknown accelerator type 'v6e-12'"),
    (['create', *V4, '--accelerator_type=tpu-8'], "unknown accelerator type 'tpu-8'"),
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
    (['deploy', *V4], "invalid choice: 'deploy'"),
])
def test_bad_inputs_fail_with_one_error_line(capsys, argv, message):
  with pytest.raises(SystemExit) as exit_:
    tpu_vm.main([*argv, '--dry_run'])
  assert exit_.value.code == 2
  printed = capsys.readouterr()
  assert printed.out == ''
  errors = [line for line in printed.err.splitlines() if 'error:' in line]
  assert len(errors) == 1 and message in errors[0]
