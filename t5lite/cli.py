"""The `t5lite` command: parse flags, load the config, call one function. Nothing else lives here.

Every failure a user can cause (a bad flag, a config that cannot work, a missing file, a full
disk) ends as one line on stderr and exit status 2, raised as ValueError, FileNotFoundError or
OSError by the code that knows what is wrong; Ctrl-C outside training is one line and status 130.
T5LITE_DEBUG=1 shows the full traceback instead.
"""

import _thread
import argparse
import errno
import json
import operator
import os
import sys
import warnings

from t5lite import paths

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
  elif not hasattr(args, 'workdir'):
    raise ValueError('give --config=PRESET, e.g. --config=t5_tiny')
  else:
    config = config_lib.from_workdir(args.workdir)
  config_lib.override(config, overrides)
  config_lib.model_config(config)  # fail on a bad model before anything else happens
  if getattr(args, 'workdir', None):
    config_lib.check_workdir_vocabulary(config, args.workdir)
  return config


@command('train', 'pretrain a model; resumes from the workdir if it holds a checkpoint')
def train_command(args, overrides):
  from t5lite.train import distributed, loop
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                         args.coordinator_timeout, args.multihost)
  config = load_run_config(args, overrides)
  if config.data.task:
    raise ValueError(f'config.data.task={config.data.task!r} is for fine-tuning: use t5lite '
                     'finetune')
  return exit_status(loop.train(config, args.workdir))


@command('eval', 'held-out loss and accuracy of the latest checkpoint')
def eval_command(args, overrides):
  from t5lite.commands import evaluate
  config = load_run_config(args, overrides)
  inputs = None
  if config.data.task and not args.data:  # a fine-tuned run: its task's held-out split
    from t5lite.commands import finetune
    inputs = finetune.task_inputs(config)
  metrics = evaluate.evaluate_workdir(config, args.workdir, data=args.data,
                                      num_batches=args.num_batches, inputs=inputs)
  print(json.dumps(metrics))


# What `data` does, each asked for by a flag: (its dest, as the refusal names it). Without one, a
# missing or unreadable source would pass unread, so `data` refuses to run.
DATA_ACTIONS = (('show', '--show=K'), ('out', '--out=FILE'), ('verify', '--verify=STORE'))


@command('data', 'write the first batches exactly as the train step receives them, or verify '
         'a token store')
def data_command(args, overrides):
  if not any(getattr(args, dest) for dest, _ in DATA_ACTIONS):
    *others, last = (spelled for _, spelled in DATA_ACTIONS)
    raise ValueError(f'nothing to do: give {", ".join(others)} or {last}')
  if args.verify:
    from t5lite.data import store
    if overrides or args.config or args.out or args.show:
      raise ValueError('--verify=STORE takes no other flag')
    print(store.verify(args.verify, progress=sys.stderr if sys.stderr.isatty() else None))
    return
  from t5lite.inputs import batches
  if not (args.config or args.workdir):
    raise ValueError('give --config=PRESET, e.g. --config=t5_tiny, or --workdir of a run')
  config = load_run_config(args, overrides)
  skipped = batches.skipped_ranges(batches.read_skipped(args.workdir)) if args.workdir else []
  if args.out:
    batches.write_batches(config.data, args.num_batches, args.out, overwrite=args.overwrite,
                          skipped=skipped)
    print(f'wrote {args.num_batches} batches to {args.out}')
  if args.show:
    print(batches.show_examples(config.data, args.show, skipped))


@command('export', 'export a checkpoint to a Hugging Face folder (config.json + model.safetensors)')
def export_command(args, overrides):
  from t5lite.commands import hugging_face
  config = load_run_config(args, overrides)
  step = hugging_face.export_workdir(config, args.workdir, args.out, step=args.step,
                                     overwrite=args.overwrite)
  print(f'exported step {step} of {args.workdir} to {args.out}')


@command('infer', 'decode text with a checkpoint, e.g. fill the sentinels of span-corrupted text')
def infer_command(args, overrides):
  from t5lite.commands import infer
  config = load_run_config(args, overrides)
  inputs = infer.read_inputs(args.input, args.input_file, args.input_key)
  outputs = infer.infer_workdir(
      config, args.workdir, inputs, step=args.step, out=args.out, overwrite=args.overwrite,
      max_decode_length=args.max_decode_length, seed=args.seed, method=args.method,
      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
      beam_size=args.beam_size, alpha=args.alpha)
  print('\n'.join(outputs))


@command('import-hf',
         'start a workdir from a Hugging Face folder (T5, mT5, UMT5, ByT5, LongT5, Switch, BART, '
         'GPT-2, BERT, RoBERTa, ELECTRA)')
def import_hf_command(args, overrides):
  from t5lite.commands import hugging_face
  config = hugging_face.import_hf_workdir(args.hf, args.workdir, overrides)
  print(f'imported {args.hf} into {args.workdir}: {config.model.d_model=}')


@command('finetune', 'fine-tune on a text-to-text task from a pretrained workdir or HF folder')
def finetune_command(args, overrides):
  from t5lite.commands import finetune
  metrics = finetune.finetune(args.workdir, pretrained=args.pretrained, hf_dir=args.hf,
                              random_init=args.random_init, task=args.task,
                              inputs_key=args.inputs_key, targets_key=args.targets_key,
                              overrides=overrides)
  if metrics['best_step'] is not None:
    print(f'best held-out checkpoint: step {metrics["best_step"]} in '
          f'{args.workdir}/{finetune.BEST}')
  return exit_status(metrics)


def exit_status(last: dict) -> int:
  """0 for a run that reached train.steps; EXIT_STOPPED_EARLY for one that saved and stopped."""
  from t5lite.train import preemption
  return 0 if last['finished'] else preemption.EXIT_STOPPED_EARLY


@command('plan', 'per-device memory, FLOPs and step time of a config on a topology, no hardware')
def plan_command(args, overrides):
  from t5lite.commands import plan
  config = load_run_config(args, overrides)
  if args.longest_input:
    print(plan.format_longest(plan.longest_input(config, args.topology,
                                                 compile_step=not args.analytic)))
    return
  print(plan.format_plan(plan.plan(config, args.topology, mfu=args.mfu,
                                  compile_step=not args.analytic)))


@command('tokenizer', 'train a SentencePiece vocabulary (T5 ids, 100 sentinels appended)')
def tokenizer_command(args, overrides):
  from t5lite.data import spm_training
  if overrides:
    raise ValueError(f'tokenizer takes no --config overrides, got {overrides[0]}')
  sentencepiece_only = {'vocab_size': args.vocab_size, 'alpha': args.alpha,
                        'character_coverage': args.character_coverage}
  if args.model_type == 'bytes':
    given = [f'--{name}' for name, value in sentencepiece_only.items() if value is not None]
    raise ValueError(
        f'--model_type=bytes is ByT5\'s byte vocabulary, which is not trained and has no file: '
        + (f'{", ".join(given)} set a SentencePiece model; ' if given else '')
        + 'give --config.data.vocabulary=bytes (t5lite prepare --vocabulary=bytes)')
  defaults = {'vocab_size': 8000, 'alpha': 1.0,
              'character_coverage': spm_training.ENGLISH_COVERAGE}
  settings = {name: defaults[name] if value is None else value
              for name, value in sentencepiece_only.items()}
  path = spm_training.train_tokenizer(args.input, out_dir=args.out, overwrite=args.overwrite,
                                      **settings)
  print(f'wrote {path}')


@command('prepare', 'tokenize a corpus once into a token store, for data.source=STORE')
def prepare_command(args, overrides):
  from t5lite.commands import prepare
  if overrides:
    raise ValueError(f'prepare takes no --config overrides, got {overrides[0]}')
  manifest, skipped = prepare.prepare(
      args.source, args.out, vocabulary=args.vocabulary, text_key=args.text_key,
      validation_fraction=args.validation_fraction, tfds_data_dir=args.tfds_data_dir,
      workers=args.workers, num_shards=args.num_shards, shard_index=args.shard_index,
      overwrite=args.overwrite, max_bad_fraction=args.max_bad_fraction,
      progress=sys.stderr if sys.stderr.isatty() else None)
  documents, tokens = manifest['documents'], manifest['tokens']
  print(f'prepared {manifest["part"]} of {args.out}: {sum(documents.values()):,} documents, '
        f'{sum(tokens.values()):,} tokens ({tokens["train"]:,} train, '
        f'{tokens["validation"]:,} validation); skipped: {manifest["skipped"] or "nothing"}')
  if skipped:
    print(f'warning: {skipped.line()}', file=sys.stderr)


EPILOG = ('Every setting of the config can be overridden as --config.a.b=value (parsed as the '
          "type the setting has). A mistake stops with one line and exit status 2; "
          'T5LITE_DEBUG=1 shows the traceback instead.')

# The page of docs/ that covers each command, named on the last line of its --help; `t5lite
# --help` names the map. A new command adds its line here (tests/test_cli_help.py checks).
DOCS_PAGES = {'train': 'training.md', 'eval': 'training.md', 'data': 'corpus.md',
              'tokenizer': 'corpus.md', 'export': 'hugging-face.md',
              'import-hf': 'hugging-face.md', 'finetune': 'finetuning.md',
              'infer': 'finetuning.md', 'plan': 'plan.md', 'prepare': 'corpus.md'}


def epilog(command: str | None = None) -> str:
  """EPILOG, then a line naming the docs page (relative to the t5lite checkout)."""
  return f'{EPILOG}\n\ndocs: docs/{DOCS_PAGES.get(command, "README.md")}'


class Parser(argparse.ArgumentParser):
  """argparse's parser, whose refusals (a missing or malformed flag) are one line too."""

  def error(self, message):
    self.exit(2, f'{self.prog}: error: {message} (see {self.prog} --help)\n')


# Defaults --help leaves out, by identity: `0 in (False,)` is true, and a 0 says something.
UNSET = (None, False, argparse.SUPPRESS)


class HelpFormatter(argparse.HelpFormatter):
  """Shows each flag's default where it has one worth showing (not None or an unset switch; a 0
  is shown), and keeps the paragraphs of a description or epilog apart (argparse would run them
  together)."""

  def _fill_text(self, text, width, indent):
    fill = super()._fill_text
    return '\n\n'.join(fill(paragraph, width, indent) for paragraph in text.split('\n\n'))

  def _get_help_string(self, action):
    if action.required or any(action.default is unset for unset in UNSET):
      return action.help
    return f'{action.help} (default: {action.default})'


def parser() -> argparse.ArgumentParser:
  top = Parser(prog='t5lite', description='T5-family pretraining in JAX/Flax.',
              epilog=epilog(), formatter_class=HelpFormatter)
  sub = top.add_subparsers(dest='command', required=True, metavar='command')
  parsers = {name: sub.add_parser(name, help=text, description=text, epilog=epilog(name),
                                  formatter_class=HelpFormatter)
             for name, (_, text) in COMMANDS.items()}
  for name in ('train', 'eval', 'data', 'export', 'plan'):
    parsers[name].add_argument(
        '--config', help='a shipped preset, e.g. t5_tiny[:arg], or a preset file, path/to/'
        'preset.py[:arg] (a file that exists wins over a preset of its name)'
        + ('' if name in ('data', 'plan') else "; default: the workdir's saved config.json"))
  for name in ('train', 'eval', 'export', 'import-hf', 'finetune', 'infer'):
    parsers[name].add_argument('--workdir', required=True, help=WORKDIR_HELP[name])
  for name in ('export', 'tokenizer', 'data', 'infer', 'prepare'):
    parsers[name].add_argument('--overwrite', action='store_true',
                               help='write over an existing file, or into a folder holding other '
                               "files (only this command's files are replaced); never in or "
                               'above the workdir')
  for name, add_flags in COMMAND_FLAGS.items():
    add_flags(parsers[name])
  return top


def _train_flags(train: argparse.ArgumentParser) -> None:
  train.add_argument('--coordinator_address', help='HOST:PORT of process 0')
  train.add_argument('--num_processes', type=int, help='processes in the run (with '
                     '--coordinator_address)')
  train.add_argument('--process_id', type=int, help="this process's index, 0 to num_processes-1")
  train.add_argument('--multihost', action='store_true',
                     help='join a multi-process run JAX detects (TPU pod, SLURM)')
  train.add_argument('--coordinator_timeout', type=int, default=300,
                     help='seconds to wait for all processes to join')


def _eval_flags(evaluate: argparse.ArgumentParser) -> None:
  evaluate.add_argument('--data', help='a .txt/.jsonl file to evaluate on instead of the '
                        'validation split')
  evaluate.add_argument('--num_batches', type=int, default=None,
                        help='default: train.eval_batches (a task: all its held-out batches)')


def _data_flags(data: argparse.ArgumentParser) -> None:
  data.add_argument('--num_batches', type=int, default=4, help='batches to write')
  data.add_argument('--out', help='.npz file for the batches')
  data.add_argument('--show', type=int, default=0, help='print K decoded examples')
  data.add_argument('--workdir', help="a run's workdir: its saved config (unless --config), and "
                    'the batches its rollbacks skipped left out, as its steps read them')
  data.add_argument('--verify', metavar='STORE', help='read every block of the token store '
                    'STORE, checking it against its checksum and every token id against the '
                    'vocabulary')


def _export_flags(export: argparse.ArgumentParser) -> None:
  export.add_argument('--out', required=True,
                      help='the Hugging Face folder to write, outside the workdir')
  export.add_argument('--step', type=int, default=None, help='checkpoint step; default: the latest')


def _infer_flags(infer: argparse.ArgumentParser) -> None:
  infer.add_argument('--input', action='append', default=[], help='a text to decode; repeatable')
  infer.add_argument('--input_file', help='one input per line (.jsonl: a field of each line)')
  infer.add_argument('--input_key', default='input', help='the field of .jsonl inputs')
  infer.add_argument('--out', help='also write {"input": .., "output": ..} lines to this JSONL')
  infer.add_argument('--step', type=int, default=None, help='checkpoint step; default: the latest')
  infer.add_argument('--max_decode_length', type=int, default=None,
                     help="default: the run's data.targets_length; at most "
                     f"{AT_MOST['max_decode_length']:,}")
  infer.add_argument('--method', choices=('greedy', 'sample', 'beam'), default='greedy',
                     help='how tokens are chosen')
  infer.add_argument('--temperature', type=float, default=1.0, help='softmax temperature (sample)')
  infer.add_argument('--top_k', type=int, default=0, help='sample from the k most likely; 0: all')
  infer.add_argument('--top_p', type=float, default=1.0, help='sample from the nucleus of mass p')
  infer.add_argument('--beam_size', type=int, default=4,
                     help=f'hypotheses kept (beam); at most {AT_MOST["beam_size"]:,}')
  infer.add_argument('--alpha', type=float, default=0.6,
                     help='beam length penalty ((5 + length) / 6)**alpha')
  infer.add_argument('--seed', type=int, default=0, help='sampling seed')


def _import_hf_flags(import_hf: argparse.ArgumentParser) -> None:
  import_hf.add_argument('--hf', required=True, help='a Hugging Face model folder')


def _finetune_flags(finetune: argparse.ArgumentParser) -> None:
  finetune.add_argument('--from', dest='pretrained', help='a pretrained workdir')
  finetune.add_argument('--hf', help='or a Hugging Face T5 folder to start from')
  finetune.add_argument('--random_init', action='store_true',
                        help='the same model from a random init (the baseline)')
  finetune.add_argument('--task', help='sentiment, or a .tsv/.jsonl task file')
  finetune.add_argument('--inputs_key', default='input', help='column of inputs')
  finetune.add_argument('--targets_key', default='target', help='column of targets')


def _plan_flags(plan: argparse.ArgumentParser) -> None:
  plan.add_argument('--topology', required=True,
                    help='v4-32, v5e-256, v5p-128, v6e-64, 8xH100, cpu:8, ...; N slices or '
                         'nodes as 2xv5e-256, 2x8xH100, 2xcpu:4')
  plan.add_argument('--mfu', type=float,
                    help='model FLOPs utilisation assumed for the step time (default: 0.16 on '
                         'GPUs, measured; 0.4 on TPUs)')
  plan.add_argument('--analytic', action='store_true',
                    help='skip compiling; estimate memory analytically only')
  plan.add_argument('--longest_input', action='store_true',
                    help='find the longest data.inputs_length (in steps of 1,024) whose train '
                         'step fits the topology, the other settings as they are')


def _tokenizer_flags(tokenizer: argparse.ArgumentParser) -> None:
  tokenizer.add_argument('--input', required=True, nargs='+', action='extend',
                         help='text files; several are a mixture of corpora (languages) for '
                         '--alpha')
  tokenizer.add_argument('--vocab_size', type=int,
                         help='SentencePiece pieces, before the 100 sentinels (default 8000); at '
                         f'most {AT_MOST["vocab_size"]:,}')
  tokenizer.add_argument('--alpha', type=float,
                         help='each --input sampled in proportion to its sentences ** alpha, in '
                         '(0, 1] (default 1: every sentence once; mT5: 0.3)')
  tokenizer.add_argument('--character_coverage', type=float,
                         help='the characters SentencePiece covers (default 0.9999, English; '
                         'many languages: 0.99999, mT5\'s)')
  tokenizer.add_argument('--model_type', choices=('unigram', 'bytes'), default='unigram',
                         help="unigram: T5's SentencePiece model; bytes: ByT5's byte "
                         'vocabulary, which needs no training (data.vocabulary=bytes)')
  tokenizer.add_argument('--out', required=True, help='folder to write vocab.model in')


def _prepare_flags(prepare: argparse.ArgumentParser) -> None:
  prepare.add_argument('--source', required=True,
                       help="as data.source: 'bundled', .txt/.jsonl(.gz/.xz/.zst)/.parquet "
                       "files or globs (comma-separated, local or gs://), or 'tfds:NAME'")
  prepare.add_argument('--out', required=True, help='the store: a new folder, local or gs://')
  prepare.add_argument('--vocabulary', default='bundled',
                       help="'bundled', 'bytes' (ByT5's UTF-8 bytes) or a SentencePiece .model "
                       '(sentinels are appended)')
  prepare.add_argument('--text_key', default='text', help='JSONL key, parquet column or TFDS '
                       'feature holding the text')
  prepare.add_argument('--validation_fraction', type=float, default=0.05,
                       help='documents held out, by a stable hash of their text')
  prepare.add_argument('--tfds_data_dir', default='', help='where a tfds: source is prepared')
  prepare.add_argument('--workers', type=int, default=0,
                       help=f'tokenizer threads; 0: every core; at most {AT_MOST["workers"]:,}')
  prepare.add_argument('--num_shards', type=int, default=1,
                       help='parts the store is prepared in, one per machine or run; at most '
                       f'{AT_MOST["num_shards"]:,} (part names have 5 digits)')
  prepare.add_argument('--shard_index', type=int, default=0, help='the part this run prepares')
  prepare.add_argument('--max_bad_fraction', type=float, default=0.01,
                       help="the most of a file's lines (paragraphs, rows) that may be malformed "
                       '(not UTF-8, not JSON, without the text key) and skipped; a file with '
                       'more is refused')


# Each command's own flags; --config, --workdir and --overwrite are added in `parser`.
COMMAND_FLAGS = {'train': _train_flags, 'eval': _eval_flags, 'data': _data_flags,
                 'export': _export_flags, 'infer': _infer_flags, 'import-hf': _import_hf_flags,
                 'finetune': _finetune_flags, 'plan': _plan_flags, 'tokenizer': _tokenizer_flags,
                 'prepare': _prepare_flags}


WORKDIR_HELP = {
    'train': 'where checkpoints, config.json and metrics go; a run there resumes',
    'eval': 'a run\'s workdir (or a fine-tuning run\'s best/)',
    'export': 'a run\'s workdir (or a fine-tuning run\'s best/)',
    'infer': 'a run\'s workdir (or a fine-tuning run\'s best/)',
    'import-hf': 'a new workdir: step 0 of a run with the Hugging Face weights',
    'finetune': 'the fine-tuning run\'s own workdir (best checkpoint in its best/); resumes',
}


def main(argv=None) -> int:
  args, unknown = parser().parse_known_args(argv)
  overrides = [a for a in unknown if a.startswith('--config.')]
  stray = [a for a in unknown if not a.startswith('--config.')]
  debug = bool(os.environ.get('T5LITE_DEBUG'))
  sys.unraisablehook = unraisable_hook
  if not debug:
    quiet_libraries()
  try:
    if stray:
      raise ValueError(f'unrecognized argument {stray[0]} (settings go as --config.a.b=value)')
    check_counts(args)
    status = COMMANDS[args.command][0](args, overrides)
  except (ValueError, FileNotFoundError, FloatingPointError, OSError, KeyboardInterrupt) as error:
    if debug:
      raise
    print(f't5lite {args.command}: error: {one_line(error)}', file=sys.stderr)
    return 130 if isinstance(error, KeyboardInterrupt) else 2
  return status or 0


# Flags that count something, and the least each can mean (None, the default, is left alone).
AT_LEAST = {'num_batches': 1, 'max_decode_length': 1, 'step': 0, 'vocab_size': 1, 'show': 0,
            'coordinator_timeout': 1, 'num_processes': 1, 'process_id': 0, 'num_shards': 1,
            'shard_index': 0, 'workers': 0, 'seed': -(1 << 63)}
# And the most: past it a count overflows what takes it (JAX's and SentencePiece's C++ ints, a
# jitted int32, JAX's int64 seed), names a part with more than 5 digits, or asks for more than
# any run here needs (which XLA or SentencePiece would end in an abort or a hang).
INT32_MAX = (1 << 31) - 1
AT_MOST = {'workers': 1024, 'num_shards': 99_999, 'shard_index': 99_998, 'vocab_size': 1 << 20,
           'max_decode_length': 1 << 16, 'beam_size': 1024, 'top_k': INT32_MAX,
           'num_processes': INT32_MAX, 'coordinator_timeout': INT32_MAX, 'seed': (1 << 63) - 1}


def check_counts(args) -> None:
  """Refuses counts out of their bounds, and places no file system can hold."""
  for flag in ('workdir', 'out'):
    if getattr(args, flag, None):
      paths.check_name(getattr(args, flag), f'--{flag}')
  for bounds, word, outside in ((AT_LEAST, 'least', operator.lt), (AT_MOST, 'most', operator.gt)):
    for name, bound in bounds.items():
      value = getattr(args, name, None)
      if value is not None and outside(value, bound):
        raise ValueError(f'--{name}={value} must be at {word} {bound}')
  if getattr(args, 'mfu', None) is not None and not 0 < args.mfu <= 1:
    raise ValueError(f'--mfu={args.mfu} must be in (0, 1]')


def one_line(error: BaseException) -> str:
  if isinstance(error, KeyboardInterrupt):
    return 'interrupted (Ctrl-C)'
  if isinstance(error, OSError) and error.strerror and not isinstance(error, FileNotFoundError):
    if error.errno == errno.ENOSPC:
      return f'no space left on the device of {error.filename or "an output"}'
    return f'{error.strerror}: {error.filename}' if error.filename else error.strerror
  return (str(error).strip().splitlines() or [type(error).__name__])[0]


def unraisable_hook(unraisable) -> None:
  """sys.unraisablehook. A Ctrl-C that lands in code Python runs from C, where an exception can
  only be reported (a gc callback, such as the one JAX registers; a __del__; a weakref callback),
  would be lost and the command would go on: it is sent to the main thread again. Python's other
  "Exception ignored" reports (coroutines a failed restore abandoned) are dropped; T5LITE_DEBUG=1
  shows them all."""
  if os.environ.get('T5LITE_DEBUG'):
    sys.__unraisablehook__(unraisable)
  if issubclass(unraisable.exc_type, KeyboardInterrupt):
    # From a thread of its own, which runs once this thread lets go of the GIL, out of this hook:
    # an interrupt_main() here would raise in this hook, and be lost again.
    _thread.start_new_thread(_thread.interrupt_main, ())


def quiet_libraries() -> None:
  """Keeps stderr for t5lite's own lines: orbax's tracebacks of a failed save (the error reaches
  the command, which says it in one line) and the "never awaited" warnings of the writes a failed
  save abandoned (issued at exit), and the C++ warnings of TensorFlow and XLA (a failed call of
  the input pipeline's Python, e.g. a damaged store's block, logs its traceback once per call).
  Python's "Exception ignored" reports: `unraisable_hook`. TensorFlow's import banner:
  t5lite/data/tf_setup.py. T5LITE_DEBUG=1 keeps them all."""
  global _quiet
  if _quiet:  # once per process (tests call main() again and again)
    return
  _quiet = True
  # Read once, by the first of JAX and TensorFlow to load, for both: before either does
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import logging  # pylint: disable=import-outside-toplevel
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  # absl's own logger reports the caller's file (a plain one would name absl's)
  absl_logging.get_absl_logger().addFilter(lambda record: '/orbax/' not in record.pathname)
  logging.getLogger('asyncio').disabled = True  # orbax's abandoned writes after a failed save
  warnings.filterwarnings('ignore', r'coroutine .* was never awaited', RuntimeWarning)


_quiet = False


if __name__ == '__main__':
  sys.exit(main())
