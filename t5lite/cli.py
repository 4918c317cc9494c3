"""The `t5lite` command: parse flags, load the config, call one function. Nothing else lives here.

Every failure a user can cause (a bad flag, a config that cannot work, a missing file) ends as
one line on stderr and exit status 2, raised as ValueError or FileNotFoundError by the code that
knows what is wrong. T5LITE_DEBUG=1 shows the full traceback instead.
"""

import argparse
import json
import os
import sys

COMMANDS = {}


def command(name: str, help_text: str):
  def register(fn):
    COMMANDS[name] = (fn, help_text)
    return fn
  return register


def load_run_config(args, overrides):
  """The config from --config, else the one saved in --workdir, with --config.* overrides."""
  from t5lite import config as config_lib
  import ml_collections
  if getattr(args, 'config', None):
    config = config_lib.load(args.config)
  else:
    saved = os.path.join(args.workdir, 'config.json')
    if not os.path.isfile(saved):
      raise FileNotFoundError(f'no --config given and no {saved} to resume from')
    with open(saved, encoding='utf-8') as f:
      config = ml_collections.ConfigDict(json.load(f))
  config_lib.override(config, overrides)
  config_lib.model_config(config)  # fail on a bad model before anything else happens
  return config


@command('train', 'pretrain a model; resumes from the workdir if it holds a checkpoint')
def train_command(args, overrides):
  from t5lite.train import distributed, loop
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                         args.coordinator_timeout, args.multihost)
  config = load_run_config(args, overrides)
  loop.train(config, args.workdir)


@command('eval', 'held-out loss and accuracy of the latest checkpoint')
def eval_command(args, overrides):
  from t5lite.train import workdir as workdir_lib
  config = load_run_config(args, overrides)
  metrics = workdir_lib.evaluate_workdir(config, args.workdir, data=args.data,
                                        num_batches=args.num_batches)
  print(json.dumps(metrics))


@command('data', 'write the first batches exactly as the train step receives them')
def data_command(args, overrides):
  from t5lite.data import pipeline
  config = load_run_config(args, overrides)
  if args.out:
    pipeline.write_batches(config.data, args.num_batches, args.out)
    print(f'wrote {args.num_batches} batches to {args.out}')
  if args.show:
    print(pipeline.show_examples(config.data, args.show))


@command('export', 'export a checkpoint to a Hugging Face folder (config.json + model.safetensors)')
def export_command(args, overrides):
  from t5lite.train import workdir as workdir_lib
  config = load_run_config(args, overrides)
  step = workdir_lib.export_workdir(config, args.workdir, args.out, step=args.step)
  print(f'exported step {step} of {args.workdir} to {args.out}')


@command('import-hf', 'start a workdir from a Hugging Face T5 folder')
def import_hf_command(args, overrides):
  from t5lite.train import workdir as workdir_lib
  config = workdir_lib.import_hf_workdir(args.hf, args.workdir, overrides)
  print(f'imported {args.hf} into {args.workdir}: {config.model.d_model=}')


@command('plan', 'per-device memory, FLOPs and step time of a config on a topology, no hardware')
def plan_command(args, overrides):
  from t5lite.train import plan
  config = load_run_config(args, overrides)
  print(plan.format_plan(plan.plan(config, args.topology, mfu=args.mfu,
                                  compile_step=not args.analytic)))


@command('tokenizer', 'train a SentencePiece vocabulary (T5 ids, 100 sentinels appended)')
def tokenizer_command(args, overrides):
  from t5lite.data import vocabulary
  if overrides:
    raise ValueError(f'tokenizer takes no --config overrides, got {overrides[0]}')
  path = vocabulary.train_tokenizer(args.input, args.vocab_size, args.out)
  print(f'wrote {path}')


def parser() -> argparse.ArgumentParser:
  top = argparse.ArgumentParser(prog='t5lite', description='T5-family pretraining in JAX/Flax.')
  sub = top.add_subparsers(dest='command', required=True, metavar='command')
  parsers = {name: sub.add_parser(name, help=text) for name, (_, text) in COMMANDS.items()}
  for name in ('train', 'eval', 'data', 'export', 'plan'):
    parsers[name].add_argument('--config', help='preset file, e.g. configs/t5_tiny.py[:arg]')
  for name in ('train', 'eval', 'export', 'import-hf'):
    parsers[name].add_argument('--workdir', required=True)
  parsers['train'].add_argument('--coordinator_address', help='HOST:PORT of process 0')
  parsers['train'].add_argument('--num_processes', type=int)
  parsers['train'].add_argument('--process_id', type=int)
  parsers['train'].add_argument('--multihost', action='store_true',
                                help='join a multi-process run JAX detects (TPU pod, SLURM)')
  parsers['train'].add_argument('--coordinator_timeout', type=int, default=300,
                                help='seconds to wait for all processes to join')
  parsers['eval'].add_argument('--data', help='a .txt/.jsonl file to evaluate on instead')
  parsers['eval'].add_argument('--num_batches', type=int, default=None)
  parsers['data'].add_argument('--num_batches', type=int, default=4)
  parsers['data'].add_argument('--out', help='.npz file for the batches')
  parsers['data'].add_argument('--show', type=int, default=0, help='print K decoded examples')
  parsers['export'].add_argument('--out', required=True)
  parsers['export'].add_argument('--step', type=int, default=None, help='default: the latest')
  parsers['import-hf'].add_argument('--hf', required=True, help='a Hugging Face T5 folder')
  parsers['plan'].add_argument('--topology', required=True,
                               help='v4-32, v5e-256, v5p-128, v6e-64, 8xH100, 2x8xH100, cpu:8, ...')
  parsers['plan'].add_argument('--mfu', type=float, default=0.4,
                               help='model FLOPs utilisation assumed for the step time')
  parsers['plan'].add_argument('--analytic', action='store_true',
                               help='skip compiling; estimate memory analytically only')
  parsers['tokenizer'].add_argument('--input', required=True, nargs='+', help='text files')
  parsers['tokenizer'].add_argument('--vocab_size', type=int, default=8000)
  parsers['tokenizer'].add_argument('--out', required=True)
  return top


def main(argv=None) -> int:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  args, unknown = parser().parse_known_args(argv)
  overrides = [a for a in unknown if a.startswith('--config.')]
  stray = [a for a in unknown if not a.startswith('--config.')]
  try:
    if stray:
      raise ValueError(f'unrecognized argument {stray[0]} (settings go as --config.a.b=value)')
    COMMANDS[args.command][0](args, overrides)
  except (ValueError, FileNotFoundError, FloatingPointError) as error:
    if os.environ.get('T5LITE_DEBUG'):
      raise
    print(f't5lite {args.command}: error: {error}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
