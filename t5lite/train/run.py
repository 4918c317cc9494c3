"""A run: what training, evaluation, decoding, fine-tuning and `t5lite plan` build from a config.

`make_run(config)` checks the config against its model, objective, vocabulary and mesh, then
builds the mesh, the rule table, the optimizer, its schedule and the state spec once; every
command reads them from the one `Run`, and traces and compiles inside `run.sharding()`, the one
context that sets the mesh and the rules the model's sharding constraints read.
"""

import contextlib
import dataclasses
from typing import Any

import jax
import ml_collections
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5lite import config as config_lib
from t5lite import objectives
from t5lite.data import vocabulary
from t5lite.inputs import batches as batches_lib
from t5lite.inputs import mixture
from t5lite.models import attention as attention_lib
from t5lite.models.config import ModelConfig
from t5lite.objectives import distillation
from t5lite.train import checkpoint as checkpoint_lib
from t5lite.train import mesh as mesh_lib
from t5lite.train import optim
from t5lite.train import spikes
from t5lite.train import state as state_lib
from t5lite.train import step as step_lib


@dataclasses.dataclass(frozen=True)
class Run:
  """Everything built once from a config; see the module docstring."""
  config: ml_collections.ConfigDict
  model_cfg: ModelConfig
  mesh: Mesh  # or an AbstractMesh of a topology this host does not have (`t5lite plan`)
  rules: tuple  # (logical axis, mesh axes) pairs: mesh.rule_table(config.mesh.rules)
  optimizer: optax.GradientTransformation
  schedule: optax.Schedule
  spec: state_lib.StateSpec

  @contextlib.contextmanager
  def sharding(self):
    """The mesh and rules in force while the model is traced: enter it around every jit call."""
    with jax.set_mesh(self.mesh), nnx.logical_axis_rules(self.rules):
      yield

  @property
  def batch_sharding(self) -> NamedSharding:
    """Batches: their leading (example) dimension split over the `batch` rule's mesh axes."""
    return mesh_lib.batch_sharding(self.mesh, self.rules)

  @property
  def components(self) -> tuple[str, ...]:
    """A mixture's component names, sorted (each batch row's `component` indexes them): the
    metrics per component are named by them; () without a mixture."""
    return batches_lib.component_names(self.config.data)

  def loss(self, teacher: distillation.Teacher | None = None, *,
           exact_match: bool = False) -> objectives.Loss:
    return objectives.make_loss(self.config, self.model_cfg, teacher, exact_match=exact_match)

  def jit_train_step(self, loss: objectives.Loss):
    """The train step jitted once: the state in its own shardings (donated), the batch over the
    batch axes, the loss's frozen parameters where they already are."""
    spec = self.spec
    return jax.jit(
        step_lib.make_train_step(spec.graphdef, spec.non_params, loss, self.config.train,
                                 self.optimizer, self.schedule, len(self.components)),
        in_shardings=(spec.shardings, self.batch_sharding, _frozen_shardings(loss)),
        out_shardings=(spec.shardings, NamedSharding(self.mesh, PartitionSpec())),
        donate_argnums=0)

  def jit_eval_step(self, loss: objectives.Loss):
    spec = self.spec
    return jax.jit(step_lib.make_eval_step(spec.graphdef, spec.non_params, loss,
                                           len(self.components)),
                   in_shardings=(spec.shardings.params, self.batch_sharding,
                                 _frozen_shardings(loss)))

  def model(self, params) -> nnx.Module:
    """The model with `params` (for decoding)."""
    return nnx.merge(self.spec.graphdef, params, self.spec.non_params)

  def restore_params(self, workdir: str, step: int | None = None) -> tuple[int, Any]:
    """(step, parameters) of checkpoint `step` (default: the latest) of `workdir`, read-only and
    placed in this run's shardings; the optimizer state is never read."""
    checkpointer = checkpoint_lib.Checkpointer(workdir, self.config.checkpoint, read_only=True)
    try:
      step = checkpointer.latest_step() if step is None else step
      if step is None or step not in checkpointer.all_steps():
        raise FileNotFoundError(f'no checkpoint{"" if step is None else f" at step {step}"} in '
                                f'{checkpointer.directory}')
      checkpointer.check_model(step, self.config)
      return step, checkpointer.restore_params(step, self.spec.abstract.params)
    finally:
      checkpointer.close()

  def load_teacher(self, *, restore: bool = True) -> distillation.Teacher:
    """The latest parameters of `train.teacher_workdir`, read-only, placed on this run's mesh;
    restore=False gives their shapes and shardings alone (`t5lite plan`). Checks first that the
    teacher can teach this student, with one line if not."""
    config = self.config
    checkpointer = checkpoint_lib.Checkpointer(config.train.teacher_workdir, config.checkpoint,
                                               read_only=True)
    try:
      step = checkpointer.latest_step()
      if step is None:
        raise FileNotFoundError(
            f'train.teacher_workdir: no checkpoint in {checkpointer.directory}')
      saved = ml_collections.ConfigDict(checkpointer.saved_config(step))
      teacher_cfg = with_kernel(config_lib.model_config(saved), self.mesh)
      # a teacher that records its vocabulary is checked by content, an older one by name
      recorded = config_lib.recorded_vocabulary(config.train.teacher_workdir)
      config_lib.check_workdir_vocabulary(config, config.train.teacher_workdir,
                                          'train.teacher_workdir')
      distillation.check_teacher(teacher_cfg, None if recorded else saved.data.vocabulary,
                                 self.model_cfg, config)
      spec = state_lib.state_spec(teacher_cfg, optax.identity(), 0, self.mesh, self.rules)
      params = (checkpointer.restore_params(step, spec.abstract.params) if restore
                else spec.abstract.params)
    finally:
      checkpointer.close()
    return distillation.Teacher(teacher_cfg, spec.graphdef, spec.non_params, params)


def make_run(config: ml_collections.ConfigDict, mesh: Mesh | None = None, *,
             reads_text: bool = True, platform: str | None = None) -> Run:
  """The run of `config` on `mesh` (default: one over all devices, shaped by config.mesh). A
  config that cannot work is one ValueError line here, before anything compiles or is written.
  reads_text=False for a run fed no tokenized text (`t5lite plan`, synthetic batches): its
  vocabulary is not loaded to check that its ids fit the model. `platform` is an abstract
  mesh's ('gpu' for `t5lite plan --topology=1xH100`), for the kernel 'auto' attention takes."""
  config_lib.validate(config)
  spikes.check_settings(config)
  model_cfg = config_lib.model_config(config)
  if reads_text:
    check_vocabulary(vocabulary.load_vocabulary(config.data.vocabulary), model_cfg,
                     f'data.vocabulary={config.data.vocabulary!r}')
  objectives.for_run(config, model_cfg)
  mixture.check_objectives(config, model_cfg)
  rules = mesh_lib.rule_table(config.mesh.rules)
  mesh = mesh_lib.make_mesh(config.mesh) if mesh is None else mesh
  model_cfg = with_kernel(model_cfg, mesh, platform)
  check_attention(model_cfg, mesh)
  mesh_lib.check_divisibility(model_cfg, config.data, mesh, rules,
                              microbatches=config.train.microbatches)
  optimizer = optim.make_optimizer(config.optim, config.train.steps,
                                   logical_axes=state_lib.param_axes(model_cfg))
  schedule = optim.make_schedule(config.optim, config.train.steps)
  # Outside `sharding()`: building the spec runs small eager ops, which the compile-only devices
  # of a topology `t5lite plan` compiles for cannot run.
  spec = state_lib.state_spec(model_cfg, optimizer, config.train.seed, mesh, rules)
  return Run(config, model_cfg, mesh, rules, optimizer, schedule, spec)


def with_kernel(model_cfg: ModelConfig, mesh, platform: str | None = None) -> ModelConfig:
  """`model_cfg` with 'auto' attention made the kernel of the mesh's devices (of `platform` for
  an abstract mesh): cuDNN's on NVIDIA GPUs in 16 bits, else XLA's. So a run trained with cuDNN
  evaluates, exports and decodes on a CPU with the same parameters and no flag."""
  if model_cfg.attention != 'auto':
    return model_cfg
  version = ''
  if isinstance(mesh, Mesh):
    device = mesh.devices.flat[0]
    platform, version = device.platform, device.client.platform_version
  kernel = attention_lib.kernel_for('auto', model_cfg.dtype, platform, version)
  return dataclasses.replace(model_cfg, attention=kernel)


def check_attention(model_cfg: ModelConfig, mesh) -> None:
  """Refuses an attention kernel the mesh's devices cannot run; an abstract mesh (`t5lite plan`
  for chips this host lacks) has none to check."""
  if isinstance(mesh, Mesh):
    device = mesh.devices.flat[0]
    check_attention_platform(model_cfg.attention, device.platform)
    if model_cfg.attention == 'flash' and device.platform == 'tpu':
      check_flash_compiles(device)


def check_attention_platform(attention: str, platform: str) -> None:
  """cuDNN's attention needs a GPU; the flash kernel runs on GPUs and TPUs, and in Pallas'
  interpreter on CPUs (for tests)."""
  if attention == 'cudnn' and platform != 'gpu':
    raise ValueError(f"model.attention='cudnn' needs a GPU (the devices are {platform}); "
                     "use 'xla' or 'einsum' (--config.model.attention=xla)")


def check_flash_compiles(device) -> None:
  """Refuses model.attention='flash' on a TPU generation its Mosaic kernels do not compile for
  (compiled for v4, v5e, v5p and v6e by tests/models/test_flash_attention.py), saying why."""
  from t5lite.models import flash_attention  # pylint: disable=import-outside-toplevel
  reason = flash_attention.compile_error(device)
  if reason is not None:
    raise ValueError(f"model.attention='flash' does not compile for {device.device_kind} "
                     f"({reason}); use 'xla' (--config.model.attention=xla)")


def check_vocabulary(vocab: vocabulary.Vocabulary, model_cfg: ModelConfig, name: str) -> None:
  """Refuses a vocabulary with more ids than the model has embeddings."""
  if vocab.vocab_size > model_cfg.vocab_size:
    raise ValueError(f'config.model.vocab_size={model_cfg.vocab_size} is smaller than the '
                     f'{vocab.vocab_size} ids of {name}')


def _frozen_shardings(loss: objectives.Loss):
  return jax.tree.map(lambda x: x.sharding, loss.frozen_params)
