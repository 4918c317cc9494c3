"""Train t5lite on a Cloud TPU VM slice: create it, install t5lite on every worker, train, delete.

  python launch/tpu_vm.py run --name=t5-base --zone=us-central2-b --accelerator_type=v4-32 \\
      --restart_on_preemption -- --config=configs/t5_1_1_base.py --workdir=gs://BUCKET/runs/t5-base

Actions: create | setup | train | logs | delete | run (= create, setup, train). Everything after
`--` is passed unchanged to `t5lite train` on every worker, which finds the other workers by itself
(`jax.distributed.initialize()` reads the TPU VM environment) and resumes from the workdir's latest
checkpoint. Each action is a list of gcloud commands built by a pure function below; `--dry_run`
prints them, one per line, instead of running them. With --restart_on_preemption, `run` stays:
it resumes training after each preemption and deletes the slice once training has finished.
Run it from the repository root.

With --num_slices=N (a queued resource, --queued) the run spans N slices joined by the data-center
network: one queued resource creates them together as NAME-0 ... NAME-(N-1) and gives their
workers the Megascale settings that join the slices into one JAX run (slice 0's worker 0
coordinates); every worker of every slice starts `t5lite train`, whose `mesh.dcn_data` (-1: all
the slices) makes it data parallel across them. A preemption of one slice stops every slice
at one step (JAX's preemption sync point spans all processes), and the watcher recreates the
whole resource.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import time

# The TPU software version for JAX per generation ("TPU software versions", Cloud TPU docs).
RUNTIME_VERSIONS = {
    'v2': 'tpu-ubuntu2204-base',
    'v3': 'tpu-ubuntu2204-base',
    'v4': 'tpu-ubuntu2204-base',
    'v5p': 'v2-alpha-tpuv5',
    'v5litepod': 'v2-alpha-tpuv5-lite',
    'v6e': 'v2-alpha-tpuv6e',
}
# The slice sizes each generation offers as --accelerator-type GENERATION-SIZE (Cloud TPU docs,
# "TPU versions"): TensorCores (2 a chip) for v2 to v5p, chips for v5e (v5litepod) and v6e.
SLICE_SIZES = {
    'v2': (8, 32, 128, 256, 512),
    'v3': (8, 32, 64, 128, 256, 512, 1024, 2048),
    'v4': (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 4096),
    'v5p': (8, 16, 32, 64, *range(128, 12288 + 1, 128)),  # past a cube (64 chips): whole cubes
    'v5litepod': (1, 4, 8, 16, 32, 64, 128, 256),
    'v6e': (1, 4, 8, 16, 32, 64, 128, 256),
}
COUNTS_CORES = ('v2', 'v3', 'v4', 'v5p')
NAME_PATTERN = r'[a-z]([-a-z0-9]{0,61}[a-z0-9])?'
ZONE_PATTERN = r'[a-z]+-[a-z]+[0-9]+-[a-z]'

# What `setup` copies to every worker: what `pip install -e .` and `--config=configs/...` need.
SOURCES = ('setup.py', 'README.md', 't5lite', 'configs')
REMOTE_DIR = 't5lite'  # relative to the worker's home; `t5lite train` runs there
VENV = '$HOME/t5lite-venv'  # the TPU VM images ship Python 3.10; t5lite needs 3.11
LOG = '$HOME/t5lite-train.log'
EXIT_FILE = '$HOME/t5lite-train.exit'  # holds the exit status once `t5lite train` has ended
# `t5lite train`'s exit status when it saved and stopped before train.steps (preemption, SIGTERM):
# EXIT_STOPPED_EARLY of t5lite/train/preemption.py, mirrored: the launcher runs without t5lite.
EXIT_STOPPED_EARLY = 75
LOST_STATES = {'PREEMPTED', 'TERMINATED', 'SUSPENDING', 'SUSPENDED', 'FAILED', 'NOT_FOUND'}
HEALTHY_STATES = {'READY', 'ACTIVE'}  # a TPU VM's, a queued resource's
# A preempted worker takes its peers down (their collectives fail) before the slice's state says
# PREEMPTED: a run that failed is called a crash only once the state has stayed healthy this long.
PREEMPTION_GRACE_SECONDS = 300
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def accelerator_type(text: str) -> str:
  """argparse type: a known generation and a slice size it offers."""
  generation, _, size = text.rpartition('-')
  if generation not in SLICE_SIZES:
    raise argparse.ArgumentTypeError(
        f'unknown accelerator type {text!r}: expected GENERATION-SIZE, GENERATION one of '
        f'{", ".join(SLICE_SIZES)} (TPU v5e is v5litepod), e.g. v4-8 or v5litepod-16')
  sizes = SLICE_SIZES[generation]
  if size not in map(str, sizes):
    shown = [*sizes[:7], '...', sizes[-1]] if len(sizes) > 12 else sizes
    unit = 'TensorCores' if generation in COUNTS_CORES else 'chips'
    raise argparse.ArgumentTypeError(
        f'unknown accelerator type {text!r}: {generation} comes in '
        f'{", ".join(map(str, shown))} {unit}, e.g. {generation}-{sizes[1]}')
  return text


def pattern(regex: str, what: str):
  def check(text):
    if not re.fullmatch(regex, text):
      raise argparse.ArgumentTypeError(f'{text!r} is not a valid {what}')
    return text
  return check


def num_workers(accelerator: str) -> int:
  """VMs in a slice: 4 chips each, except slices of up to 8 v5e/v6e chips, which are one VM."""
  generation, size = accelerator.rsplit('-', 1)
  if generation in COUNTS_CORES:
    return max(1, int(size) // 8)
  return 1 if int(size) <= 8 else int(size) // 4


def gcloud(args, words: list[str], *flags: str) -> list[str]:
  """`gcloud compute tpus WORDS --zone=Z [--project=P] FLAGS`."""
  project = [f'--project={args.project}'] if args.project else []
  return ['gcloud', 'compute', 'tpus', *words, f'--zone={args.zone}', *project, *flags]


def nodes(args) -> list[str]:
  """The slices' TPU VM names: NAME, or NAME-0 ... NAME-(N-1) of a multi-slice queued resource
  (its --node-prefix is NAME)."""
  if args.num_slices == 1:
    return [args.name]
  return [f'{args.name}-{index}' for index in range(args.num_slices)]


def ssh(args, worker: str, command: str, node: str | None = None) -> list[str]:
  return gcloud(args, ['tpu-vm', 'ssh', node or args.name], f'--worker={worker}',
                f'--command={command}')


def create_commands(args) -> list[list[str]]:
  """One create: a TPU VM now, or a queued resource that waits for capacity (of N slices)."""
  version = args.runtime_version or RUNTIME_VERSIONS[args.accelerator_type.rsplit('-', 1)[0]]
  tier = ['--spot'] if args.spot else ['--preemptible'] if args.preemptible else []
  if args.queued:
    node = ([f'--node-id={args.name}'] if args.num_slices == 1 else
            [f'--node-count={args.num_slices}', f'--node-prefix={args.name}'])
    return [gcloud(args, ['queued-resources', 'create', args.name], *node,
                   f'--accelerator-type={args.accelerator_type}', f'--runtime-version={version}',
                   *tier)]
  return [gcloud(args, ['tpu-vm', 'create', args.name],
                 f'--accelerator-type={args.accelerator_type}', f'--version={version}', *tier)]


def install_script(package: str) -> str:
  """Python 3.11 from Ubuntu, a venv, then `pip install PACKAGE` in ~/t5lite, on every worker."""
  apt = 'sudo apt-get -qq -o DPkg::Lock::Timeout=600'  # a fresh VM may still be upgrading itself
  return ' && '.join([
      f'{apt} update', f'{apt} install -y python3.11 python3.11-venv',
      f'python3.11 -m venv {VENV}', f'{VENV}/bin/pip install -q --upgrade pip',
      f'cd {REMOTE_DIR}', f'{VENV}/bin/pip install -q {package}'])


def setup_commands(args) -> list[list[str]]:
  """Copy this checkout (only `configs/` with --package) to every worker and install it there."""
  sources = ['configs'] if args.package else list(SOURCES)
  package = shlex.quote(args.package) if args.package else '-e ".[tpu]"'
  return [command for node in nodes(args) for command in [
      ssh(args, 'all', f'mkdir -p {REMOTE_DIR}', node),
      gcloud(args, ['tpu-vm', 'scp', '--recurse', *sources, f'{node}:{REMOTE_DIR}/'],
             '--worker=all'),
      ssh(args, 'all', install_script(package), node),
  ]]


def train_script(train_flags: list[str]) -> str:
  """Start `t5lite train FLAGS` in the background, logging to ~/t5lite-train.log.

  The shell around it ignores SIGTERM, which a VM shutting down (preemption, maintenance) sends
  to every process: it outlives t5lite's last save and records its exit status (75).
  """
  train = (f'{VENV}/bin/t5lite train --multihost {shlex.join(train_flags)} & '
           f'trap "" TERM; wait $!; echo $? > {EXIT_FILE}')
  return (f'cd {REMOTE_DIR} && rm -f {EXIT_FILE} && '
          f'nohup bash -c {shlex.quote(train)} > {LOG} 2>&1 < /dev/null &')


def train_commands(args) -> list[list[str]]:
  """The same `t5lite train` on all workers of every slice at once: they are the processes of
  one JAX run. Past one slice, the slices are mesh.dcn_data (its default, -1, takes them all);
  the queued resource has put the
  Megascale variables (MEGASCALE_COORDINATOR_ADDRESS: slice 0's worker 0, MEGASCALE_NUM_SLICES,
  MEGASCALE_SLICE_ID) in every worker's tpu-env metadata, where JAX's Cloud TPU cluster reads
  them to join the slices."""
  if args.num_slices == 1:
    return [ssh(args, 'all', train_script(args.train_flags))]
  return [ssh(args, 'all', train_script(args.train_flags), node) for node in nodes(args)]


def logs_commands(args) -> list[list[str]]:
  """Follow worker 0's log (of slice 0): it runs process 0, the only one that logs."""
  return [ssh(args, '0', f'tail -n 100 -F {LOG}', nodes(args)[0])]


def delete_commands(args) -> list[list[str]]:
  if args.queued:  # --force deletes its TPU VM too
    return [gcloud(args, ['queued-resources', 'delete', args.name], '--force', '--quiet')]
  return [gcloud(args, ['tpu-vm', 'delete', args.name], '--quiet')]


def state_command(args) -> list[str]:
  if args.queued:
    return gcloud(args, ['queued-resources', 'describe', args.name], '--format=value(state.state)')
  return gcloud(args, ['tpu-vm', 'describe', args.name], '--format=value(state)')


def exit_status_command(args) -> list[str]:
  """Worker 0's `t5lite train` exit status; nothing while it runs; 75 (stopped early) when it is
  gone without one, as after its VM restarted (maintenance). `[ ]` keeps pgrep from matching
  this command itself."""
  running = f'pgrep -f "{VENV}/bin/t5lite[ ]train" > /dev/null'
  return ssh(args, '0', f'cat {EXIT_FILE} 2>/dev/null || {running} || echo {EXIT_STOPPED_EARLY}',
             nodes(args)[0])


def workdir(train_flags: list[str]) -> str | None:
  """The value of --workdir among the t5lite train flags (the last one wins, as in argparse)."""
  values = [None]
  for i, flag in enumerate(train_flags):
    if flag.startswith('--workdir='):
      values.append(flag.split('=', 1)[1])
    elif flag == '--workdir' and i + 1 < len(train_flags):
      values.append(train_flags[i + 1])
  return values[-1]


def workdir_warning(args) -> str | None:
  """Workers of a multi-host slice checkpoint together, so into a path they all see (gs://)."""
  path = workdir(args.train_flags)
  workers = num_workers(args.accelerator_type) * args.num_slices
  slices = f'{args.num_slices} x ' if args.num_slices > 1 else ''
  if workers > 1 and not path.startswith('gs://'):
    return (f'tpu_vm.py: warning: --workdir={path} is local to each of the {workers} workers '
            f'of {slices}{args.accelerator_type}; checkpoints need a path they all share: '
            'gs://BUCKET/RUN')
  return None


def execute(args, commands: list[list[str]]):
  """Run each command, stopping at the first failure; with --dry_run, print them instead."""
  for command in commands:
    if args.dry_run:
      print(shlex.join(command), flush=True)
    else:
      print(f'+ {shlex.join(command)}', file=sys.stderr, flush=True)
      subprocess.run(command, check=True, cwd=REPO)


def query(command: list[str]) -> str | None:
  """Its output; NOT_FOUND when the resource is gone; None when gcloud failed otherwise."""
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
  if result.returncode == 0:
    return result.stdout.strip()
  return 'NOT_FOUND' if 'NOT_FOUND' in result.stderr else None


def say(message: str):
  print(f'tpu_vm.py: {message}', file=sys.stderr, flush=True)


def create_slice(args):
  """Create the slice; a queued resource is only a request until it turns ACTIVE (maybe hours)."""
  execute(args, create_commands(args))
  if not args.queued:
    return
  if args.dry_run:
    print(shlex.join(state_command(args)))
    return
  while (state := query(state_command(args))) != 'ACTIVE':
    if state in LOST_STATES:
      raise SystemExit(f'tpu_vm.py: error: queued resource {args.name} is {state}: '
                       f'{shlex.join(gcloud(args, ["queued-resources", "describe", args.name]))}')
    say(f'{args.name} is {state or "unknown"}; waiting for ACTIVE')
    time.sleep(args.poll_seconds)


def launch(args):
  create_slice(args)
  execute(args, setup_commands(args) + train_commands(args))


def watch(args) -> int:
  """Poll until training has finished, then delete the slice; resume training after a preemption.

  A lost slice (PREEMPTED, deleted by maintenance, ...) is recreated. Exit 0: training reached
  train.steps. Any other exit: the slice may be on its way out, so its state is watched for
  PREEMPTION_GRACE_SECONDS; lost: recreate it; healthy: after 75 (saved and stopped early) train
  again on it, after anything else return that status (a crash, or 2: a mistake in the flags).
  """
  if args.dry_run:
    execute(args, [state_command(args), exit_status_command(args)])
    return 0
  while True:
    time.sleep(args.poll_seconds)
    state = query(state_command(args))
    if state in LOST_STATES:
      recreate(args, state)
      continue
    status = training_status(args) if state in HEALTHY_STATES else None
    if status is None:  # training, or the slice is busy (e.g. REPAIRING)
      continue
    say(f't5lite train exited with status {status}')
    if status == 0:
      return finish(args)
    if lost := lost_within_grace(args):
      recreate(args, lost)
    elif status == EXIT_STOPPED_EARLY:
      train_again(args)
    else:
      say(f'{args.name} is kept for its log (`logs`); delete it with: '
          f'{shlex.join(delete_commands(args)[0])}')
      return status


def training_status(args) -> int | None:
  output = query(exit_status_command(args))
  last = output.split()[-1] if output else ''
  return int(last) if last.isdigit() else None


def lost_within_grace(args) -> str | None:
  """The slice's state if it turns lost within PREEMPTION_GRACE_SECONDS, else None."""
  deadline = time.monotonic() + PREEMPTION_GRACE_SECONDS
  while time.monotonic() < deadline:
    time.sleep(args.poll_seconds)
    if (state := query(state_command(args))) in LOST_STATES:
      return state
  return None


def unlock_command(args) -> list[str] | None:
  """Removes the lock that a lost slice's run left in its gs:// workdir. Its holder went with the
  slice, but the new slice's worker 0 is another host, which would wait out the old heartbeat
  (t5lite/train/lock.py) before taking the lock over; a missing lock makes it fail, harmlessly."""
  path = workdir(args.train_flags)
  project = [f'--project={args.project}'] if args.project else []
  return (['gcloud', 'storage', 'rm', *project, f'{path.rstrip("/")}/t5lite.lock']
          if path and path.startswith('gs://') else None)


def recreate(args, state: str | None):
  """Delete what is left of the slice and its run's lock, then create, install and train anew,
  until that works."""
  say(f'{args.name} is {state}; recreating it, training resumes from the latest checkpoint in '
      'the workdir')
  while True:
    try:
      if state != 'NOT_FOUND':
        execute(args, delete_commands(args))
      if command := unlock_command(args):
        query(command)
      launch(args)
      return
    except (subprocess.CalledProcessError, SystemExit) as error:
      say(f'recreating {args.name} failed ({error}); next try in {args.poll_seconds:g} s')
      time.sleep(args.poll_seconds)
      state = query(state_command(args))


def train_again(args):
  """Resume on the same slice, which survived (a maintenance event, a SIGTERM); if training does
  not start there, recreate the slice, as Cloud TPU's maintenance guide advises."""
  say(f'{args.name} stayed healthy; training resumes on it from the latest checkpoint')
  try:
    execute(args, train_commands(args))
  except subprocess.CalledProcessError as error:
    say(f'training did not start on {args.name} ({error})')
    recreate(args, query(state_command(args)))


def finish(args) -> int:
  """Training reached train.steps: delete the slice, which bills until deleted, unless kept."""
  if args.keep_slice:
    say(f'{args.name} is kept; delete it with: {shlex.join(delete_commands(args)[0])}')
  else:
    execute(args, delete_commands(args))
  return 0


def parser() -> argparse.ArgumentParser:
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument('--name', required=True, type=pattern(NAME_PATTERN, 'TPU name'),
                      help='TPU VM (and queued resource) name: lowercase letters, digits, -')
  common.add_argument('--zone', required=True, type=pattern(ZONE_PATTERN, 'zone'),
                      help='e.g. us-central2-b; each generation is in a few zones only')
  common.add_argument('--project', help="default: the gcloud configuration's project")
  common.add_argument('--dry_run', action='store_true', help='print the gcloud commands only')
  common.add_argument('--num_slices', type=int, default=1,
                      help='slices joined by the data-center network (with --queued past 1)')
  queued = argparse.ArgumentParser(add_help=False)
  queued.add_argument('--queued', action='store_true',
                      help='a queued resource: waits for capacity instead of failing')
  accelerator = argparse.ArgumentParser(add_help=False)
  accelerator.add_argument('--accelerator_type', required=True, type=accelerator_type,
                           help='e.g. v4-8, v4-32, v5p-8, v5litepod-16, v6e-8')
  slice_ = argparse.ArgumentParser(add_help=False)
  slice_.add_argument('--runtime_version', help='default: the JAX image for the generation')
  tier = slice_.add_mutually_exclusive_group()
  tier.add_argument('--spot', action='store_true', help='Spot VMs: cheaper, can be preempted')
  tier.add_argument('--preemptible', action='store_true', help='the older preemptible tier')
  slice_.add_argument('--poll_seconds', type=float, default=60.0,
                      help='how often to check a queued resource or a running slice')
  install = argparse.ArgumentParser(add_help=False)
  install.add_argument('--package', help='a pip spec to install instead of this checkout, e.g. '
                       '"t5lite[tpu] @ git+https://github.com/ORG/t5lite"; configs/ is copied')
  train = argparse.ArgumentParser(add_help=False)
  train.add_argument('train_flags', nargs='*', metavar='-- T5LITE_TRAIN_FLAGS')
  restart = argparse.ArgumentParser(add_help=False)
  restart.add_argument('--restart_on_preemption', action='store_true',
                       help='stay until training has finished, then delete the slice; after a '
                       'preemption recreate the slice and resume training')
  restart.add_argument('--keep_slice', action='store_true',
                       help='with --restart_on_preemption: do not delete the slice at the end')
  top = argparse.ArgumentParser(prog='launch/tpu_vm.py', description=__doc__.split('\n')[0])
  actions = top.add_subparsers(dest='action', required=True, metavar='action')
  for name, parents, text in [
      ('create', [common, queued, accelerator, slice_], 'create the TPU VM slice'),
      ('setup', [common, install], 'install t5lite[tpu] on every worker'),
      ('train', [common, accelerator, train], 'start t5lite train on every worker'),
      ('logs', [common], "follow process 0's log (worker 0)"),
      ('delete', [common, queued], 'delete the slice'),
      ('run', [common, queued, accelerator, slice_, install, train, restart],
       'create + setup + train')]:
    actions.add_parser(name, parents=parents, help=text)
  return top


def parse_args(argv=None) -> argparse.Namespace:
  top = parser()
  args = top.parse_args(argv)
  if getattr(args, 'queued', False) and getattr(args, 'preemptible', False):
    top.error('queued resources take --spot, not --preemptible')
  if args.num_slices < 1:
    top.error(f'--num_slices={args.num_slices} must be at least 1')
  if args.num_slices > 1 and hasattr(args, 'queued') and not args.queued:
    top.error('--num_slices above 1 needs --queued: one queued resource creates (and deletes) '
              'all the slices together')
  if getattr(args, 'keep_slice', False) and not args.restart_on_preemption:
    top.error('--keep_slice goes with --restart_on_preemption (without it the launcher does not '
              'wait for training to end)')
  if args.action in ('train', 'run') and not workdir(args.train_flags):
    top.error('give the t5lite train flags after --, with --workdir: '
              '-- --config=configs/t5_tiny.py --workdir=gs://BUCKET/RUN')
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.action in ('train', 'run') and (warning := workdir_warning(args)):
    print(warning, file=sys.stderr)
  try:
    if args.action == 'create':
      create_slice(args)
    elif args.action == 'run':
      launch(args)
      return watch(args) if args.restart_on_preemption else 0
    else:
      execute(args, {'setup': setup_commands, 'train': train_commands, 'logs': logs_commands,
                     'delete': delete_commands}[args.action](args))
  except subprocess.CalledProcessError as error:
    print(f'tpu_vm.py: error: {shlex.join(error.cmd)} exited with status {error.returncode}',
          file=sys.stderr)
    return error.returncode
  except KeyboardInterrupt:
    return 130
  return 0


if __name__ == '__main__':
  sys.exit(main())
