"""launch/slurm_gpu.sbatch in a fake SLURM job: what each process sees; XLA flags jaxlib accepts.

A fake `srun` starts the tasks of the step the way Slurm (22.05 and later) would, and a fake
python (T5LITE_PYTHON) records the arguments and environment each task gets; JAX's own cluster
detection then says which coordinator, process id and GPUs `jax.distributed.initialize()` picks.
"""

import json
import os
import subprocess
import sys
from unittest import mock

import pytest
from jax._src import clusters  # what jax.distributed.initialize() detects, without connecting

from t5lite import config as config_lib
from t5lite.train import mesh as mesh_lib

SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'launch', 'slurm_gpu.sbatch')
FLAGS = ['--config=configs/t5_tiny.py', '--workdir=/shared/r']

FAKE_SRUN = f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
options = {{}}
while args[0].startswith('--'):
  name, _, value = args.pop(0)[2:].partition('=')
  options[name] = value
nodes, per_node = int(os.environ['SLURM_JOB_NUM_NODES']), int(options['ntasks-per-node'])
# Slurm >= 22.05 binds a task to srun's own --cpus-per-task or SRUN_CPUS_PER_TASK, not sbatch's.
cpus = options.get('cpus-per-task', os.environ.get('SRUN_CPUS_PER_TASK', '1'))
for node in range(nodes):
  for local in range(per_node):
    env = dict(os.environ, SLURM_PROCID=str(node * per_node + local), SLURM_LOCALID=str(local),
               SLURM_NODEID=str(node), SLURM_NTASKS=str(nodes * per_node), SLURM_STEP_ID='0',
               SLURM_STEP_NUM_NODES=str(nodes),
               SLURM_STEP_NODELIST=os.environ['SLURM_JOB_NODELIST'],
               FAKE_SRUN_BOUND_CPUS=cpus)
    subprocess.run(args, env=env, check=True)
with open(os.path.join(os.environ['SLURM_SUBMIT_DIR'], 'srun_options.json'), 'w') as f:
  json.dump(options, f)
"""
FAKE_PYTHON = f"""#!{sys.executable}
import json, os, sys
with open(os.path.join(os.environ['SLURM_SUBMIT_DIR'], f"task{{os.environ['SLURM_PROCID']}}.json"),
          'w') as f:
  json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, f)
"""


def sbatch(tmp_path, *args, nodes=2, gpus=8, **env):
  """Run the script as the batch step of a job on `nodes` nodes: what its tasks got, in order."""
  for name, text in [('srun', FAKE_SRUN), ('python', FAKE_PYTHON)]:
    (tmp_path / name).write_text(text)
    (tmp_path / name).chmod(0o755)
  job = dict(SLURM_JOB_ID='4242', SLURM_JOB_NUM_NODES=str(nodes), SLURM_NNODES=str(nodes),
             SLURM_JOB_NODELIST=f'gpu-node[01-{nodes:02d}]', SLURM_GPUS_ON_NODE=str(gpus),
             SLURM_CPUS_PER_TASK='32', SLURM_SUBMIT_DIR=str(tmp_path))
  env = {key: value for key, value in {**os.environ, **job, **env}.items() if value is not None}
  env.update(PATH=f'{tmp_path}:{os.environ["PATH"]}', T5LITE_PYTHON=str(tmp_path / 'python'))
  subprocess.run(['bash', SCRIPT, *args], env=env, check=True, timeout=10, capture_output=True)
  tasks = sorted(tmp_path.glob('task*.json'), key=lambda path: int(path.stem[4:]))
  return [json.loads(path.read_text()) for path in tasks]


def jax_view(env: dict) -> tuple:
  """(coordinator, process count, process id, local device ids) jax.distributed.initialize() picks
  in a process with this environment: JAX_LOCAL_DEVICE_IDS first, the cluster's values after."""
  ids = env.get('JAX_LOCAL_DEVICE_IDS')
  ids = [int(i) for i in ids.split(',')] if ids else None  # as jax 0.10.2's State.initialize
  slurm = {key: value for key, value in env.items() if key.startswith('SLURM_')}
  with mock.patch.dict(os.environ, slurm, clear=True):
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, ids, None, 300)


def test_sbatch_shape():
  subprocess.run(['bash', '-n', SCRIPT], check=True)
  with open(SCRIPT, encoding='utf-8') as f:
    directives = [line.split()[1] for line in f if line.startswith('#SBATCH')]
  assert {'--ntasks-per-node=1', '--gpus-per-node=8', '--cpus-per-task=32',
          '--signal=TERM@300'} <= set(directives)


def test_one_process_per_node_drives_all_its_gpus_with_all_its_cpus(tmp_path):
  tasks = sbatch(tmp_path, *FLAGS)
  assert json.loads((tmp_path / 'srun_options.json').read_text()) == {
      'ntasks-per-node': '1', 'kill-on-bad-exit': '1'}
  assert len(tasks) == 2
  port = 4242 % 4096 + 65536 - 4096  # JAX's port for a SLURM job: from the job id
  for process_id, task in enumerate(tasks):
    assert task['argv'] == ['-m', 't5lite', 'train', '--multihost', *FLAGS]
    assert jax_view(task['env']) == (f'gpu-node01:{port}', 2, process_id, list(range(8)))
    assert task['env']['FAKE_SRUN_BOUND_CPUS'] == '32'
    # Without JAX_LOCAL_DEVICE_IDS JAX would give each process one GPU: jax issue 16788.
    assert jax_view(dict(task['env'], JAX_LOCAL_DEVICE_IDS=''))[3] == [0]


def test_nodes_with_4_gpus(tmp_path):
  tasks = sbatch(tmp_path, *FLAGS, nodes=3, gpus=4)
  assert [jax_view(task['env'])[1:] for task in tasks] == [(3, i, [0, 1, 2, 3]) for i in range(3)]


def test_the_nodes_are_the_dcn_data_axis_unless_the_flags_say_otherwise(tmp_path):
  """3 nodes of 8 GPUs: the mesh is 3 slices of 8 (data=24) by default; dcn_fsdp=3 shards the
  parameters across them instead."""
  argv = sbatch(tmp_path, *FLAGS, '--config.mesh.dcn_fsdp=3', nodes=3)[0]['argv']
  config = config_lib.base_config()
  assert mesh_lib.hybrid_shape(config.mesh, 3, 8, '3 nodes') == ((3, 1, 1, 1), (8, 1, 1, 1))
  config_lib.override(config, [flag for flag in argv if flag.startswith('--config.')])
  assert mesh_lib.hybrid_shape(config.mesh, 3, 8, '3 nodes') == ((1, 3, 1, 1), (8, 1, 1, 1))


def test_a_job_without_gpus_stops_with_one_line(tmp_path):
  with pytest.raises(subprocess.CalledProcessError) as error:
    sbatch(tmp_path, *FLAGS, SLURM_GPUS_ON_NODE=None)
  assert error.value.stderr.decode().strip().endswith(
      'SLURM_GPUS_ON_NODE: no GPUs in this job: submit it with --gpus-per-node=N')
  assert not list(tmp_path.glob('task*.json'))


def test_jaxlib_knows_every_xla_flag_and_the_users_come_last(tmp_path):
  """An XLA flag that jaxlib does not know aborts every process at start-up."""
  flags = sbatch(tmp_path, XLA_FLAGS='--xla_gpu_enable_command_buffer=FUSION')[0]['env'][
      'XLA_FLAGS'].split()
  assert '--xla_gpu_enable_latency_hiding_scheduler=true' in flags
  assert flags[-1] == '--xla_gpu_enable_command_buffer=FUSION'
  check = subprocess.run([sys.executable, '-c', 'import jax; jax.devices()'], text=True,
                         capture_output=True, env=dict(os.environ, XLA_FLAGS=' '.join(flags),
                                                       JAX_PLATFORMS='cpu'), timeout=60)
  assert check.returncode == 0, check.stderr[-2000:]
