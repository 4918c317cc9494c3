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
  if getattr(args, 'config', None):
    config = config_lib.load(args.config)
  else:
    config = config_lib.from_workdir(args.workdir)
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
  from t5lite.train import finetune, workdir as workdir_lib
  config = load_run_config(args, overrides)
  task = 'task' in config.data and not args.data  # a fine-tuned run: its task's held-out split
  metrics = workdir_lib.evaluate_workdir(config, args.workdir, data=args.data,
                                        num_batches=args.num_batches,
                                        inputs=finetune.task_inputs(config) if task else None)
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


@command('infer', 'decode text with a checkpoint, e.g. fill the sentinels of span-corrupted text')
def infer_command(args, overrides):
  from t5lite.train import workdir as workdir_lib
  config = load_run_config(args, overrides)
  inputs = workdir_lib.read_inputs(args.input, args.input_file, args.input_key)
  outputs = workdir_lib.infer_workdir(
      config, args.workdir, inputs, step=args.step, out=args.out,
      max_decode_length=args.max_decode_length, seed=args.seed, method=args.method,
      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
      beam_size=args.beam_size, alpha=args.alpha)
  print('\n'.join(outputs))


@command('import-hf', 'start a workdir from a Hugging Face T5 folder')
def import_hf_command(args, overrides):
  from t5lite.train import workdir as workdir_lib
  config = workdir_lib.import_hf_workdir(args.hf, args.workdir, overrides)
  print(f'imported {args.hf} into {args.workdir}: {config.model.d_model=}')


@command('finetune', 'fine-tune on a text-to-text task from a pretrained workdir or HF folder')
def finetune_command(args, overrides):
  from t5lite.train import finetune
  metrics = finetune.finetune(args.workdir, pretrained=args.pretrained, hf_dir=args.hf,
                              random_init=args.random_init, task=args.task,
                              inputs_key=args.inputs_key, targets_key=args.targets_key,
                              overrides=overrides)
  print(f'best held-out checkpoint: step {metrics["best_step"]} in '
        f'{os.path.join(args.workdir, finetune.BEST)}')


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
  for name in ('train', 'eval', 'export', 'import-hf', 'finetune', 'infer'):
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
  infer = parsers['infer']
  infer.add_argument('--input', action='append', default=[], help='a text to decode; repeatable')
  infer.add_argument('--input_file', help='one input per line (.jsonl: a field of each line)')
  infer.add_argument('--input_key', default='input', help='the field of .jsonl inputs')
  infer.add_argument('--out', help='also write {"input": .., "output": ..} lines to this JSONL')
  infer.add_argument('--step', type=int, default=None, help='default: the latest')
  infer.add_argument('--max_decode_length', type=int, default=None,
                     help='default: the run\'s data.targets_length')
  infer.add_argument('--method', choices=('greedy', 'sample', 'beam'), default='greedy')
  infer.add_argument('--temperature', type=float, default=1.0, help='sample')
  infer.add_argument('--top_k', type=int, default=0, help='sample from the k most likely; 0: all')
  infer.add_argument('--top_p', type=float, default=1.0, help='sample from the nucleus of mass p')
  infer.add_argument('--beam_size', type=int, default=4)
  infer.add_argument('--alpha', type=float, default=0.6,
                     help='beam length penalty ((5 + length) / 6)**alpha')
  infer.add_argument('--seed', type=int, default=0, help='sampling seed')
  parsers['import-hf'].add_argument('--hf', required=True, help='a Hugging Face T5 folder')
  parsers['finetune'].add_argument('--from', dest='pretrained', help='a pretrained workdir')
  parsers['finetune'].add_argument('--hf', help='or a Hugging Face T5 folder to start from')
  parsers['finetune'].add_argument('--random_init', action='store_true',
                                   help='the same model from a random init (the baseline)')
  parsers['finetune'].add_argument('--task', help='sentiment, or a .tsv/.jsonl task file')
  parsers['finetune'].add_argument('--inputs_key', default='input', help='column of inputs')
  parsers['finetune'].add_argument('--targets_key', default='target', help='column of targets')
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
