"""Training over slices, on 8 CPU devices grouped as 2 or 4 fake slices: each slice's rows of a
batch are what its hosts read, the losses are a one-slice mesh's, and a checkpoint saved on 2
slices resumes on 1 and on 4."""

import jax
import numpy as np
import pytest

from t5lite.inputs import batches as batches_lib
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import mesh as mesh_lib
from t5lite.train import run as run_lib

from test_mesh import fake_slices
from test_step import small_config, synthetic_batch


def make_run(slices: int, data=1, fsdp=1, tensor=1, dcn_data=1, dcn_fsdp=1) -> run_lib.Run:
  """small_config's run on the 8 devices as `slices` fake slices of consecutive devices."""
  config = small_config(data, fsdp, tensor)
  config.mesh.update(dcn_data=dcn_data, dcn_fsdp=dcn_fsdp)
  mesh = mesh_lib.make_mesh(config.mesh, slice_of=fake_slices(8 // slices))
  return run_lib.make_run(config, mesh, reads_text=False)


def train(run: run_lib.Run, steps: int, state=None, first: int = 0):
  """(losses, state) after `steps` steps on synthetic_batch(first), ... from `state` (default:
  the run's initial state)."""
  with run.sharding():
    step = run.jit_train_step(run.loss())
    state = run.spec.init() if state is None else state
    losses = []
    for i in range(first, first + steps):
      batch = {k: jax.device_put(v, run.batch_sharding) for k, v in synthetic_batch(i).items()}
      state, metrics = step(state, batch, None)
      losses.append(float(metrics['loss']))
  return losses, state


def host_params(state) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]


@pytest.mark.parametrize('slices', [1, 2, 4])
def test_each_slice_holds_the_rows_its_hosts_read(slices):
  """With a process per slice (a GPU node; on TPUs each slice's hosts in turn), the rows of a
  global batch that the devices of slice s hold are process s's share, as make_batches reads
  it: the global batch is the same rows in the same order on 1, 2 or 4 slices."""
  run = make_run(slices, data=-1, dcn_data=slices)
  shares = run.batch_sharding.devices_indices_map((32,))
  for s in range(slices):
    rows = sorted({row for device, (index,) in shares.items() if fake_slices(8 // slices)(device)
                   == s for row in range(*index.indices(32))})
    share = batches_lib.process_share(32, s, slices)
    assert rows == list(range(share.start, share.stop))


def test_the_batches_are_the_same_on_1_2_and_4_slices(small_data):
  """Batch k is a function of (seed, k, store): the processes' shares, read apart, make up the
  one-process batch, byte for byte."""
  data = small_data()
  reader = batches_lib.make_batches(data, process_index=0, process_count=1)
  whole = [next(reader) for _ in range(3)]
  for slices in (2, 4):
    readers = [batches_lib.make_batches(data, process_index=s, process_count=slices)
               for s in range(slices)]
    for k in range(3):
      parts = [next(reader) for reader in readers]
      for name, value in whole[k].items():
        np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), value)


@pytest.mark.slow  # 15-50 s on 2 cores
@pytest.mark.parametrize('hybrid, flat', [
    (dict(data=2, fsdp=2, dcn_data=2), dict(data=4, fsdp=2)),
    (dict(data=2, fsdp=2, dcn_fsdp=2), dict(data=2, fsdp=4)),
    (dict(data=1, fsdp=2, tensor=2, dcn_data=2), dict(data=2, fsdp=2, tensor=2)),
])
def test_two_slices_train_as_one_slice_of_the_same_shape(hybrid, flat):
  """Bit for bit: the same losses and parameters after 3 steps."""
  losses, state = train(make_run(2, **hybrid), 3)
  flat_losses, flat_state = train(make_run(1, **flat), 3)
  assert losses == flat_losses
  for ours, theirs in zip(host_params(state), host_params(flat_state)):
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow  # 12-46 s on 2 cores
def test_a_checkpoint_of_2_slices_resumes_on_1_and_on_4(tmp_path):
  """Saved with the parameters sharded over fsdp across 2 slices, restored (orbax reshards) on
  one slice of 8 and on 4 slices of 2: the same parameters bit for bit, and the next 2 steps give
  the losses of going on with the 2 slices, bit for bit."""
  two = make_run(2, data=2, fsdp=2, dcn_fsdp=2)
  _, state = train(two, 2)
  saver = checkpoint_lib.Checkpointer(str(tmp_path), two.config.checkpoint)
  saver.save(2, state, {'batch': 2}, two.config.to_dict())
  saver.close()
  saved = host_params(state)
  expected, _ = train(two, 2, state, first=2)  # donates `state`
  for run in (make_run(1, data=2, fsdp=4), make_run(4, data=1, fsdp=2, dcn_data=2, dcn_fsdp=2)):
    reader = checkpoint_lib.Checkpointer(str(tmp_path), run.config.checkpoint, read_only=True)
    restored, position = reader.restore(2, run.spec.abstract)
    reader.close()
    assert position == {'batch': 2}
    assert {x.sharding.mesh.devices.shape for x in jax.tree.leaves(restored.params)} == {
        run.mesh.devices.shape}
    for ours, theirs in zip(host_params(restored), saved):
      np.testing.assert_array_equal(ours, theirs)
    assert train(run, 2, restored, first=2)[0] == expected
